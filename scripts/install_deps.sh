#!/usr/bin/env bash
# Installs every Debian 12 package radixkv needs to build, test and benchmark.
# Idempotent: prints nothing and touches nothing when all packages are present.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config ccache clang libclang-rt-14-dev
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libxxhash-dev prometheus-cpp-dev grpc-proto
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  libsystemd-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libfuzzer-14-dev liburing-dev
  # tests and tools: promtool, python (vectors, simulation), redis + h2load (benchmarks)
  prometheus python3 python3-grpcio python3-protobuf python3-xxhash
  python3-numpy python3-pytest python3-torch python3-zmq python3-msgpack openssl fio
  redis-server redis-tools nghttp2-client curl procps valgrind
)

# From npm (Debian has neither), when npm is there; skipped otherwise, and the
# tests that need them report Skipped:
#  - buf, a generic gRPC client (`buf curl`), under /usr/local; the reflection
#    test uses it;
#  - the Kubernetes and Prometheus Operator schemas (kubernetes-models, with
#    the yaml parser) under /usr/local/lib/radixkv-k8s-schemas;
#    tests/deploy/k8s_validate.sh validates deploy/kubernetes with them.
install_buf() {
  command -v npm >/dev/null 2>&1 || return 0
  if ! command -v buf >/dev/null 2>&1; then
    echo "install_deps: installing buf (npm @bufbuild/buf)" >&2
    npm install -g --silent --prefix /usr/local @bufbuild/buf@1.75.0 >/dev/null 2>&1 ||
      echo "install_deps: npm could not install buf; its test will be skipped" >&2
  fi
  local k8s_dir=/usr/local/lib/radixkv-k8s-schemas
  local k8s_pkgs=(kubernetes-models@5.1.0 @kubernetes-models/prometheus-operator@6.0.0 yaml@2.9.1)
  if [ "$(cat "$k8s_dir/installed" 2>/dev/null)" != "${k8s_pkgs[*]}" ]; then
    echo "install_deps: installing Kubernetes schemas (npm ${k8s_pkgs[*]}) in $k8s_dir" >&2
    if npm install --silent --no-audit --no-fund --no-package-lock --prefix "$k8s_dir" \
         "${k8s_pkgs[@]}" >/dev/null 2>&1; then
      echo "${k8s_pkgs[*]}" > "$k8s_dir/installed"
    else
      echo "install_deps: npm could not install the Kubernetes schemas; k8s_validate will be skipped" >&2
    fi
  fi
}

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  install_buf
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install_deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
install_buf
