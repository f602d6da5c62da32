#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: dependencies, configure,
# build, ctest (GPU tests report "Skipped" where there is no device); then
# every target again with clang -Wthread-safety -Werror (the lock annotations
# are checked), and the index stress test under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake --preset default >/dev/null
cmake --build --preset default
ctest --preset default -j"$(nproc)"
cmake --preset clang >/dev/null
cmake --build --preset clang
cmake --preset tsan >/dev/null
cmake --build --preset tsan --target radix_stress_test
ctest --preset tsan
