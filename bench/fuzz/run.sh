#!/usr/bin/env bash
# Fuzzes every libFuzzer harness of tests/fuzz for longer than the test
# suite does. Builds the check preset's harnesses (clang, ASan + UBSan), then runs each
# harness for SECONDS (default 600) with JOBS parallel workers (default 1),
# growing a working corpus under build/check/corpus/<harness> that starts
# from the committed seeds. Crash inputs land in build/check/artifacts/; a
# crash is made a regression test by copying its input to
# tests/fuzz/regressions/<harness>/ (docs/TESTING.md).
#
#   bench/fuzz/run.sh [SECONDS] [HARNESS...]
#   JOBS=2 bench/fuzz/run.sh 3600 fuzz_cache_requests
#
# Prints one line per harness: inputs executed, executions per second,
# coverage, corpus size, and whether it found a crash. Exit status 1 when
# any harness crashed.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-600}
shift || true
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  harnesses=(fuzz_cache_requests fuzz_attach_request fuzz_block_keys
             fuzz_trace_line fuzz_remote_tier)
fi
jobs=${JOBS:-1}
cmake --preset check >/dev/null
cmake --build --preset check --target fuzz_all
out=build/check
mkdir -p "$out/artifacts" "$out/logs"
status=0
for h in "${harnesses[@]}"; do
  mkdir -p "$out/corpus/$h"
  log=$out/logs/$h.log
  rc=0
  # -jobs/-workers run that many fuzzing processes, each for the whole time.
  extra=()
  if ((jobs > 1)); then extra=(-jobs="$jobs" -workers="$jobs"); fi
  # fuzz_cache_requests' coverage map is large (it links the daemon core,
  # protobuf and Abseil): libFuzzer's entropic scheduling would spend most
  # of each input updating feature frequencies (docs/TESTING.md).
  if [ "$h" = fuzz_cache_requests ]; then extra+=(-entropic=0); fi
  "$out/tests/fuzz/$h" "$out/corpus/$h" "tests/fuzz/corpus/$h" \
    -max_total_time="$seconds" -print_final_stats=1 -timeout=10 \
    -rss_limit_mb=4096 -artifact_prefix="$out/artifacts/$h-" \
    "${extra[@]}" >"$log" 2>&1 || rc=$?
  if ((jobs > 1)); then cat fuzz-*.log >>"$log" 2>/dev/null && rm -f fuzz-*.log; fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" |
         awk '{s += $2} END {print s + 0}')
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" |
          awk '{s += $2} END {print s + 0}')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  corpus=$(find "$out/corpus/$h" -type f | wc -l)
  verdict=ok
  if ((rc != 0)); then verdict="CRASH (exit $rc; see $log and $out/artifacts/)"; status=1; fi
  printf '%-22s %12s inputs  %8s exec/s  cov %6s  corpus %6s  %s\n' \
    "$h" "$runs" "$speed" "${cov:-?}" "$corpus" "$verdict"
done
exit $status
