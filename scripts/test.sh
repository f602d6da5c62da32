#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: dependencies, configure,
# build, ctest (GPU tests report "Skipped" where there is no device); then
# every target again with clang -Wthread-safety -Werror (the lock annotations
# are checked), the index and daemon-core tests under AddressSanitizer +
# UBSan (a Debug build: the tree's invariant asserts are on), and the index
# stress test and the tiers' tests under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
# Compiler cache entries are keyed by paths relative to the checkout, so a
# fresh clone elsewhere reuses them.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
scripts/install_deps.sh
cmake --preset default >/dev/null
cmake --build --preset default
ctest --preset default -j"$(nproc)"
cmake --preset clang >/dev/null
cmake --build --preset clang
cmake --preset asan >/dev/null
radix_tests="block_key_test radix_tree_test radix_lease_test radix_model_test scoped_lease_test radix_stress_test radix_account_test radix_refusal_test"
daemon_tests="daemon_unit_test daemon_cache_test daemon_disk_tier_test daemon_host_tier_test
  daemon_refusal_errors_test daemon_fence_tracker_test daemon_access_policy_test
  daemon_namespace_registry_test daemon_tier_spec_test daemon_slot_lru_test
  daemon_unix_listener_test daemon_peer_identity_test"
# shellcheck disable=SC2086
cmake --build --preset asan --target $radix_tests $daemon_tests
for t in $radix_tests; do
  build/asan/tests/radix/"$t" --gtest_brief=1
done
for t in $daemon_tests; do
  build/asan/tests/daemon/"$t" --gtest_brief=1
done
cmake --preset tsan >/dev/null
cmake --build --preset tsan --target radix_stress_test daemon_host_tier_test
ctest --preset tsan
# The host tier and the tier chain's concurrent moves through host memory.
# (The disk tier waits on absl::Mutex conditions, which Debian's
# uninstrumented Abseil hides from TSan: its tests run under ASan above.)
build/tsan/tests/daemon/daemon_host_tier_test --gtest_brief=1 \
  --gtest_filter='HostTier*:TierChainTest.AHostTierAlone*:TierChainTest.ABadPage*:TierChainTest.ConcurrentMovesThroughHostMemory*'


# --- Fuzzing (tests/fuzz; docs/TESTING.md) ---
# The fuzz preset builds the libFuzzer harnesses with clang, ASan and UBSan.
# ctest replays every committed seed and regression input once; then each
# harness fuzzes for RADIXKV_FUZZ_SECONDS (default 20) seconds, nproc at a
# time, from the seeds into build/fuzz/corpus. A crash fails the suite and
# leaves its input in build/fuzz/artifacts/. bench/fuzz/run.sh fuzzes longer.
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
ctest --preset fuzz
fuzz_seconds=${RADIXKV_FUZZ_SECONDS:-20}
mkdir -p build/fuzz/artifacts build/fuzz/logs
printf '%s\n' fuzz_cache_requests fuzz_attach_request fuzz_block_keys \
    fuzz_trace_line |
  xargs -P "$(nproc)" -I{} bash -c '
    mkdir -p build/fuzz/corpus/{}
    if build/fuzz/tests/fuzz/{} build/fuzz/corpus/{} tests/fuzz/corpus/{} \
        -max_total_time='"$fuzz_seconds"' -timeout=10 -print_final_stats=1 \
        -artifact_prefix=build/fuzz/artifacts/{}- \
        >build/fuzz/logs/{}.log 2>&1; then
      echo "fuzz {}: $(grep -o "number_of_executed_units: *[0-9]*" build/fuzz/logs/{}.log) in '"$fuzz_seconds"' s"
    else
      echo "fuzz {}: FAILED; see build/fuzz/logs/{}.log"; tail -40 build/fuzz/logs/{}.log; exit 1
    fi'
