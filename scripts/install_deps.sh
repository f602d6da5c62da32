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
  libgtest-dev libgmock-dev libbenchmark-dev
  # tests and tools: promtool, python (vectors, simulation), redis + h2load (benchmarks)
  prometheus python3 python3-grpcio python3-protobuf python3-xxhash
  redis-server redis-tools nghttp2-client curl procps
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install_deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
