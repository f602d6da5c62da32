#!/usr/bin/env bash
# Installs everything radixkv needs to build, test and benchmark on Debian 12:
#  - the Debian packages below (apt);
#  - the project's Python virtual environment, $RADIXKV_VENV (default .venv
#    in the checkout), from PyPI with the exact pins of requirements/venv.lock
#    (grpcio, grpcio-tools, protobuf, numpy, torch, transformers, vLLM, the
#    Kubernetes schema validators, pytest, ...; requirements/venv.in lists
#    what is asked for) and requirements/sglang.lock (SGLang, installed
#    without its own pins, which conflict with vLLM's).
# Idempotent: prints nothing and touches nothing when all are present.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config ccache clang libclang-rt-14-dev
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libxxhash-dev prometheus-cpp-dev grpc-proto
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
  libsystemd-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libfuzzer-14-dev liburing-dev
  # tests and tools: promtool, python3 (for the venv), redis + h2load (benchmarks)
  prometheus python3 python3-venv openssl fio
  redis-server redis-tools nghttp2-client curl procps valgrind
)

missing=()
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
locks=("$root/requirements/venv.lock" "$root/requirements/sglang.lock")
want=$(cat "${locks[@]}" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.radixkv-locks" 2>/dev/null)" != "$want" ]; then
  echo "install_deps: installing the Python environment $venv (requirements/*.lock)" >&2
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install pip==25.3
  # Every package is pinned in the lock, so no resolver runs: --no-deps.
  "${pip[@]}" install --no-deps -r "${locks[0]}"
  "${pip[@]}" install --no-deps -r "${locks[1]}"
  echo "$want" > "$venv/.radixkv-locks"
fi
