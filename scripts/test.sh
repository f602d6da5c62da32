#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: dependencies, configure,
# build, ctest (GPU tests report "Skipped" where there is no device); then
# every target again with clang -Wthread-safety -Werror (the lock annotations
# are checked), the index and daemon-core tests under AddressSanitizer +
# UBSan (a Debug build: the tree's invariant asserts are on), and the index
# stress test under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
cmake --preset default >/dev/null
cmake --build --preset default
ctest --preset default -j"$(nproc)"
cmake --preset clang >/dev/null
cmake --build --preset clang
cmake --preset asan >/dev/null
radix_tests="block_key_test radix_tree_test radix_lease_test radix_model_test scoped_lease_test radix_stress_test"
daemon_tests="daemon_unit_test daemon_cache_test"
# shellcheck disable=SC2086
cmake --build --preset asan --target $radix_tests $daemon_tests
for t in $radix_tests; do
  build/asan/tests/radix/"$t" --gtest_brief=1
done
for t in $daemon_tests; do
  build/asan/tests/daemon/"$t" --gtest_brief=1
done
cmake --preset tsan >/dev/null
cmake --build --preset tsan --target radix_stress_test
ctest --preset tsan
