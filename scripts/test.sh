#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: dependencies, configure,
# build, ctest. GPU tests report "Skipped" where there is no device.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake --preset default >/dev/null
cmake --build --preset default
ctest --preset default -j"$(nproc)"
