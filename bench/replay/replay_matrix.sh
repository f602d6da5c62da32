#!/usr/bin/env bash
# Replays the trace in every configuration docs/BENCHMARKS.md reports
# (capacity x {inproc, daemon via radixkv::Client, daemon via raw stub,
# daemon key mode} x {1, 4 clients}), REPS times each, and prints one
# markdown row per configuration with the hit ratio and the median and best
# requests/s and Acquire p50/p99 of the median run. A fresh radixkvd
# (--pool=none,pages=N --allow_key_mode) serves every daemon run.
#
#   bench/replay/replay_matrix.sh [BUILD_DIR]
#
# Environment: REPS (default 3), CAPACITIES (default "3000 10000 0"; 0 =
# unbounded), CLIENTS (default "1 4"), TRACE.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
reps=${REPS:-3}
capacities=${CAPACITIES:-"3000 10000 0"}
clients_list=${CLIENTS:-"1 4"}
trace=${TRACE:-$build/data/conversation_trace.jsonl}
replay=$build/bench/replay/replay
radixkvd=$build/daemon/radixkvd
[ -x "$replay" ] || { echo "Error: $replay not built" >&2; exit 3; }
have_daemon=0
[ -x "$radixkvd" ] && have_daemon=1

work=$(mktemp -d /tmp/rkvr.XXXXXX)
dpid=""
trap '[ -n "$dpid" ] && kill "$dpid" 2>/dev/null; true' EXIT

start_daemon() {  # pages
  rm -f "$work/d.sock"
  "$radixkvd" --socket="$work/d.sock" --metrics_listen= --pool=none,pages="$1" \
    --max_pinned_pages_per_session="$1" --allow_key_mode >>"$work/radixkvd.log" 2>&1 &
  dpid=$!
  for _ in $(seq 1 300); do
    [ -S "$work/d.sock" ] && return 0
    kill -0 "$dpid" 2>/dev/null || { echo "Error: radixkvd died; see $work/radixkvd.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "Error: radixkvd did not start" >&2; exit 1
}

stop_daemon() {
  kill -TERM "$dpid"; wait "$dpid" || true; dpid=""
}

# The unbounded daemon pool: room for every block of the trace.
unbounded_pages=$(/usr/bin/python3 "$repo/bench/sim/leaf_lru_sim.py" --trace="$trace" --json |
  /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["blocks"] + 1)')

echo "| capacity | mode | clients | hit ratio | req/s median (best) | Acquire p50 / p99 µs (median run) |"
echo "|---|---|---|---|---|---|"
for cap in $capacities; do
  label=$cap; [ "$cap" = 0 ] && label=unbounded
  pages=$cap; [ "$cap" = 0 ] && pages=$unbounded_pages
  for mode in inproc client stub stub-keys; do
    if [ "$mode" != inproc ] && [ "$have_daemon" = 0 ]; then continue; fi
    for c in $clients_list; do
      : >"$work/runs.jsonl"
      for _ in $(seq 1 "$reps"); do
        case $mode in
          inproc) "$replay" --trace="$trace" --mode=inproc --capacity="$cap" \
                    --clients="$c" --json >>"$work/runs.jsonl" ;;
          *) start_daemon "$pages"
             extra=(--via=client)
             [ "$mode" = stub ] && extra=(--via=stub)
             [ "$mode" = stub-keys ] && extra=(--via=stub --key_mode)
             "$replay" --trace="$trace" --mode=daemon --endpoint="unix:$work/d.sock" \
               "${extra[@]}" --clients="$c" --json >>"$work/runs.jsonl"
             stop_daemon ;;
        esac
      done
      /usr/bin/python3 - "$work/runs.jsonl" "$label" "$mode" "$c" <<'EOF'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs.sort(key=lambda r: r["requests_per_second"])
med = runs[len(runs) // 2]
names = {"inproc": "in-process", "client": "daemon, radixkv::Client, tokens",
         "stub": "daemon, raw stub, tokens", "stub-keys": "daemon, raw stub, block keys"}
ratios = sorted(set("%.4f %%" % (100 * r["hit_ratio"]) for r in runs))
print("| %s | %s | %s | %s | %.0f (%.0f) | %.1f / %.1f |" % (
    sys.argv[2], names[sys.argv[3]], sys.argv[4], ", ".join(ratios),
    med["requests_per_second"], runs[-1]["requests_per_second"],
    med["acquire_p50_us"], med["acquire_p99_us"]))
EOF
    done
  done
done
