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
  # tests and tools: promtool, python (vectors, simulation), redis + h2load (benchmarks)
  prometheus python3 python3-grpcio python3-protobuf python3-xxhash
  python3-numpy python3-pytest python3-torch
  redis-server redis-tools nghttp2-client curl procps valgrind
)

# buf (a generic gRPC client: `buf curl`) comes from npm; the reflection test
# uses it. Installed under /usr/local when npm is there; skipped otherwise.
install_buf() {
  command -v buf >/dev/null 2>&1 && return 0
  command -v npm >/dev/null 2>&1 || return 0
  echo "install_deps: installing buf (npm @bufbuild/buf)" >&2
  npm install -g --silent --prefix /usr/local @bufbuild/buf@1.75.0 >/dev/null 2>&1 ||
    echo "install_deps: npm could not install buf; its test will be skipped" >&2
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
