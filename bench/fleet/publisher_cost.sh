#!/bin/bash
# The KV-event publisher's cost at the peak commit rate: the conversation
# trace replayed by 4 concurrent clients (Acquire with allocate, then Commit
# with release: every request stores blocks and, in a small pool, evicts
# others) against radixkvd, side by side, several rounds, three ways:
#   off  KV events off
#   pub  KV events on, nobody subscribed (the publisher's own cost: every
#        batch is encoded and handed to the PUB socket)
#   sub  KV events on, one subscriber on this machine receiving every
#        message (counting frames only) and one that connects and never
#        reads (HWM 1); on a 2-core machine the subscriber's own CPU time
#        competes with the daemon's, which a router elsewhere would not
#
#   bench/fleet/publisher_cost.sh [BUILD_DIR] [ROUNDS] [PAGE_SIZE]
#
# BUILD_DIR defaults to build/default, ROUNDS to 3, PAGE_SIZE to 16 (each
# trace block id becomes 16 tokens: the most commits and events per second;
# 512 is the trace's own block size). Prints one line per run (requests/s,
# the daemon's CPU clock ticks for the run and its publisher thread's) and
# the medians; writes nothing else.
set -euo pipefail
BUILD=${1:-build/default}
ROUNDS=${2:-3}
PAGE=${3:-16}
HERE=$(cd "$(dirname "$0")" && pwd)
RADIXKVD=$BUILD/daemon/radixkvd
REPLAY=$BUILD/bench/replay/replay
SOCK=/tmp/rkv_pubcost_$$.sock
PUB_PORT=$((20000 + $$ % 20000))
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

run_one() {  # $1 = off | pub | sub
  local flags=() sub_pid="" stall_pid=""
  if [[ $1 != off ]]; then
    flags=(--kv_events_endpoint=tcp://127.0.0.1:$PUB_PORT)
  fi
  rm -f "$SOCK"
  "$RADIXKVD" --socket="$SOCK" --metrics_listen= --pool=none,pages=3000 \
      --max_prompt_tokens=1048576 "${flags[@]}" >/tmp/rkv_pubcost_$$.log 2>&1 &
  local d=$!
  PIDS+=("$d")
  for _ in $(seq 100); do [[ -S $SOCK ]] && break; sleep 0.05; done
  if [[ $1 == sub ]]; then
    /usr/bin/python3 - "$PUB_PORT" >/tmp/rkv_pubcost_sub_$$.txt <<'EOF' &
import sys, zmq
s = zmq.Context().socket(zmq.SUB)
s.setsockopt(zmq.SUBSCRIBE, b"")
s.connect("tcp://127.0.0.1:%s" % sys.argv[1])
n = b = 0
while s.poll(3000):
    f = s.recv_multipart()
    n += 1
    b += len(f[2])
print(n, b)
EOF
    sub_pid=$!
    /usr/bin/python3 -c "
import sys, time, zmq
s = zmq.Context().socket(zmq.SUB); s.setsockopt(zmq.RCVHWM, 1)
s.setsockopt(zmq.SUBSCRIBE, b''); s.connect('tcp://127.0.0.1:$PUB_PORT')
time.sleep(600)" &
    stall_pid=$!
    PIDS+=("$stall_pid")
    sleep 0.5
  fi
  local out
  out=$("$REPLAY" --mode=daemon --endpoint="unix:$SOCK" --via=stub \
      --tokens_le --clients=4 --page_size="$PAGE" --json)
  # The daemon's CPU time (clock ticks) for the run, and its publisher
  # thread's share.
  local cpu pub=0 t
  cpu=$(awk '{print $14 + $15}' "/proc/$d/stat")
  for t in /proc/"$d"/task/*; do
    if [[ $(cat "$t/comm") == kv-events-pub ]]; then
      pub=$(awk '{print $14 + $15}' "$t/stat")
    fi
  done
  kill "$d"; wait "$d" 2>/dev/null || true
  local extra=""
  if [[ -n $sub_pid ]]; then
    wait "$sub_pid" || true
    kill "$stall_pid" 2>/dev/null || true
    wait "$stall_pid" 2>/dev/null || true
    extra=" subscriber_batches_bytes=$(cat /tmp/rkv_pubcost_sub_$$.txt | tr ' ' '/')"
  fi
  local rps
  rps=$(echo "$out" | /usr/bin/python3 -c \
      'import json,sys; print(json.loads(sys.stdin.read())["requests_per_second"])')
  echo "$1 requests_per_second=$rps daemon_cpu_ticks=$cpu publisher_ticks=$pub$extra"
}

declare -a OFF PUB SUB
for r in $(seq "$ROUNDS"); do
  for mode in off pub sub; do
    line=$(run_one "$mode"); echo "round $r $line"
    v=${line#*=}; v=${v%% *}
    case $mode in off) OFF+=("$v");; pub) PUB+=("$v");; sub) SUB+=("$v");; esac
  done
done
/usr/bin/python3 - "${OFF[*]}" "${PUB[*]}" "${SUB[*]}" <<'EOF'
import statistics, sys
off, pub, sub = ([float(x) for x in a.split()] for a in sys.argv[1:4])
mo = statistics.median(off)
print("median requests/s: off %.1f, pub %.1f (%.3f of off), sub %.1f (%.3f of off)"
      % (mo, statistics.median(pub), statistics.median(pub) / mo,
         statistics.median(sub), statistics.median(sub) / mo))
EOF
