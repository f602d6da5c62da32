#!/usr/bin/env bash
# Server-side instructions per call, counted by callgrind: a repeatable cost
# figure on a shared, noisy machine where wall-clock throughput varies 2x
# from run to run. For each method, radixkvd runs under callgrind, loadgen
# sends calls for a few seconds, and the daemon's instruction count (minus
# an idle baseline: start-up, one connection, shutdown) is divided by the
# calls completed.
#
#   bench/compare/callgrind_cost.sh [BUILD_DIR]
#
# Environment: SECONDS_PER_METHOD (default 6), METHODS (default
# "health acquire acquire_miss match acquire:key match:key match:packed";
# METHOD:key sends repeated block_keys, METHOD:packed block_keys_packed),
# PROMPT_BLOCKS
# (default 128, of 16 tokens each), LOADGEN_FLAGS (extra loadgen flags for
# every measured method).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
secs=${SECONDS_PER_METHOD:-6}
methods=${METHODS:-"health acquire acquire_miss match acquire:key match:key match:packed"}
prompt_blocks=${PROMPT_BLOCKS:-128}
read -r -a extra_flags <<<"${LOADGEN_FLAGS:-}"
radixkvd=$build/daemon/radixkvd
loadgen=$build/bench/compare/loadgen
for b in "$radixkvd" "$loadgen"; do
  [ -x "$b" ] || { echo "Error: $b not built" >&2; exit 3; }
done
command -v valgrind >/dev/null || { echo "Error: valgrind missing (apt-get install valgrind)" >&2; exit 3; }

work=$(mktemp -d /tmp/rkvg.XXXXXX)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; true' EXIT

# run_daemon NAME: starts radixkvd under callgrind; sets pid, sock.
run_daemon() {
  sock=$work/$1.sock
  valgrind --tool=callgrind --callgrind-out-file="$work/$1.out" \
    "$radixkvd" --socket="$sock" --metrics_listen= --pool=none,pages=100000 \
    --allow_key_mode >"$work/$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    [ -S "$sock" ] && return 0
    kill -0 "$pid" 2>/dev/null || { echo "Error: radixkvd died, see $work/$1.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "Error: radixkvd under callgrind did not start" >&2; exit 1
}

stop_daemon() {
  kill -TERM "$pid"
  wait "$pid" || true
  pid=""
}

total_ir() {
  callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}'
}

# Baseline: start, one health call, stop.
run_daemon baseline
"$loadgen" --endpoint="unix:$sock" --method=health --connections=1 --inflight=1 \
  --duration=0.2 --warmup=0 >/dev/null
stop_daemon
base=$(total_ir "$work/baseline.out")

printf '%-14s %10s %14s %12s\n' method calls "Ir/call" "vs health"
health_ir=""
for spec in $methods; do
  m=${spec%%:*}
  key=""
  case "$spec" in
    *:key) key="--key_mode" ;;
    *:packed) key="--packed_keys" ;;
    "$m") ;;
    *) echo "Error: METHODS entry '$spec': the suffix must be :key or :packed" >&2; exit 3 ;;
  esac
  name=${spec/:/_}
  run_daemon "$name"
  res=$("$loadgen" --endpoint="unix:$sock" --method="$m" $key --connections=2 \
    --prompt_blocks="$prompt_blocks" --page_size=16 "${extra_flags[@]}" \
    --inflight=4 --duration="$secs" --warmup=0 --json)
  stop_daemon
  calls=$(/usr/bin/python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(int(round(d["rpcs_per_second"]*d["seconds"])))' "$res")
  ir=$(total_ir "$work/$name.out")
  per=$(( (ir - base) / (calls > 0 ? calls : 1) ))
  [ "$m" = health ] && health_ir=$per
  rel="-"
  [ -n "$health_ir" ] && rel=$(/usr/bin/python3 -c "print('%.2fx' % ($per / $health_ir))")
  printf '%-14s %10d %14d %12s\n' "$name" "$calls" "$per" "$rel"
done
echo "# acquire counts Acquire + Release calls (each Acquire hit is followed by its Release);"
echo "# profiles: $work/*.out (callgrind_annotate FILE)"
