#!/usr/bin/env bash
# A/B test of two radixkvd binaries on this machine: both daemons run at
# once, the same loadgen drives each in turn (the order alternates every
# round, so a drift in the machine's load hits both alike), and the
# per-round ratio B/A of requests/s is printed with its median. This is the
# way to tell a few percent apart on a noisy machine, where consecutive runs
# of one binary differ by 10-20 %.
#
#   bench/compare/ab_daemons.sh OLD_RADIXKVD NEW_RADIXKVD [LOADGEN]
#
# Each binary is started with --socket=PATH and its flags: A_FLAGS / B_FLAGS,
# by default "--metrics_listen= --pool=none,pages=100000" (radixkvd; for
# cq_empty_server pass e.g. B_FLAGS=--threads=2).
#
# Environment: ROUNDS (default 5), DURATION (seconds per run, default 3),
# CASES (default "health:4x16 match:4x4 match:16x1": METHOD:CONNSxINFLIGHT,
# METHOD as loadgen --method), LOADGEN_FLAGS (default "--tokens_le
# --pages_le", the client library's wire form), A_FLAGS, B_FLAGS.
# LOADGEN defaults to build/default/bench/compare/loadgen.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 2 ] || { sed -n 2,20p "$0" >&2; exit 2; }
bins=("$1" "$2")
loadgen=${3:-$repo/build/default/bench/compare/loadgen}
for b in "${bins[@]}" "$loadgen"; do
  [ -x "$b" ] || { echo "Error: $b is not an executable" >&2; exit 3; }
done
rounds=${ROUNDS:-5}
duration=${DURATION:-3}
cases=${CASES:-"health:4x16 match:4x4 match:16x1"}
read -r -a extra_flags <<<"${LOADGEN_FLAGS---tokens_le --pages_le}"
default_flags="--metrics_listen= --pool=none,pages=100000"
read -r -a flags_a <<<"${A_FLAGS-$default_flags}"
read -r -a flags_b <<<"${B_FLAGS-$default_flags}"

work=$(mktemp -d /tmp/rkvab.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

for i in 0 1; do
  if (( i == 0 )); then flags=("${flags_a[@]}"); else flags=("${flags_b[@]}"); fi
  "${bins[$i]}" --socket="$work/$i.sock" "${flags[@]}" >"$work/$i.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do
    [ -S "$work/$i.sock" ] && break
    kill -0 "${pids[-1]}" 2>/dev/null || { echo "Error: ${bins[$i]} died; see $work/$i.log" >&2; exit 1; }
    sleep 0.1
  done
  [ -S "$work/$i.sock" ] || { echo "Error: ${bins[$i]} did not listen" >&2; exit 1; }
done

echo "# ab_daemons: $(date -u '+%F %H:%M') UTC, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# A = ${bins[0]} ${flags_a[*]}"
echo "# B = ${bins[1]} ${flags_b[*]}"
echo "# loadgen flags: ${extra_flags[*]:-(none)}; $rounds rounds of ${duration} s per daemon and case"
results=$work/results.tsv
: >"$results"
for ((r = 0; r < rounds; r++)); do
  for c in $cases; do
    method=${c%%:*}
    shape=${c#*:}
    conns=${shape%x*}
    inflight=${shape#*x}
    order=(0 1)
    (( r % 2 == 1 )) && order=(1 0)
    for i in "${order[@]}"; do
      rps=$("$loadgen" --endpoint="unix:$work/$i.sock" --method="$method" \
        --connections="$conns" --inflight="$inflight" --duration="$duration" \
        --warmup=1 --json "${extra_flags[@]}" |
        /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["requests_per_second"] if d["errors"] == 0 else "errors:%d" % d["errors"])')
      case $rps in errors:*) echo "Error: $c on ${bins[$i]}: $rps" >&2; exit 1 ;; esac
      printf '%s\t%d\t%d\t%s\n' "$c" "$r" "$i" "$rps" >>"$results"
    done
  done
done

/usr/bin/python3 - "$results" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    case, rnd, side, rps = line.split("\t")
    runs[case][(int(rnd), int(side))] = float(rps)
print("%-14s %12s %12s   %s" % ("case", "A req/s", "B req/s", "B/A per round (median)"))
for case, r in runs.items():
    rounds = sorted({k[0] for k in r})
    a = [r[(i, 0)] for i in rounds]
    b = [r[(i, 1)] for i in rounds]
    ratios = [y / x for x, y in zip(a, b)]
    print("%-14s %12.0f %12.0f   %s (%.3f)" % (
        case, statistics.median(a), statistics.median(b),
        " ".join("%.3f" % x for x in ratios), statistics.median(ratios)))
EOF
