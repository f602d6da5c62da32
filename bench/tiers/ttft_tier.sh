#!/bin/bash
# Time to first token with and without tiers, side by side: the reference
# worker's `small` model (65,536-byte fp32 pages) serves PROMPTS prompts of
# TOKENS tokens twice over a host pool that holds POOL_PAGES pages (fewer
# than one pass needs): without a tier, with a disk tier, with a host tier,
# and with a host tier of POOL_PAGES blocks above a disk tier. The second
# pass is the measurement: without a tier every prompt was evicted and is
# prefilled again; with one, its blocks come back from host memory or disk.
# Every answer's first-token logits are compared, bit for bit, with a full
# prefill (--no-cache).
#
#   bench/tiers/ttft_tier.sh [BUILD_DIR] [TIER_DIR] [PROMPTS] [TOKENS] [POOL_PAGES]
set -euo pipefail
BUILD=${1:-build/default}
TIER_ROOT=${2:-/tmp}
PROMPTS=${3:-8}
TOKENS=${4:-1024}
POOL_PAGES=${5:-128}
PAGE_BYTES=65536
WORK=$(mktemp -d "$TIER_ROOT/rkvttft.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
/usr/bin/python3 - "$PROMPTS" "$TOKENS" > "$WORK/prompts.txt" <<'PY'
import random, sys
n, t = int(sys.argv[1]), int(sys.argv[2])
r = random.Random(7)
for _ in range(n):
    print(" ".join(str(r.randrange(1, 4000)) for _ in range(t)))
PY
worker() {
  "$BUILD/worker/radixkv-worker" run --model small --device cpu \
      --prompts "$WORK/prompts.txt" --json --decode 1 "$@"
}
summary() {  # $1 = label, stdin = the worker's JSON lines
  /usr/bin/python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
ref = [json.loads(l) for l in open(sys.argv[2])]
same = sum(r["first_logits_xxh3"] == f["first_logits_xxh3"] for r, f in zip(rows, ref))
print("%-16s median TTFT %7.2f ms  matched tokens %6d of %6d  logits equal to a full prefill: %d of %d" % (
    sys.argv[1], 1e3 * statistics.median(r["ttft_s"] for r in rows),
    sum(r["matched_tokens"] for r in rows), sum(r["tokens"] for r in rows),
    same, len(rows)))' "$1" "$WORK/ref.jsonl"
}
worker --no-cache > "$WORK/ref.jsonl"
summary "no cache" < "$WORK/ref.jsonl"
for mode in pool-only disk host host+disk; do
  flags=()
  mkdir -p "$WORK/$mode"
  case $mode in
    disk) flags=(--tier="disk,path=$WORK/$mode,bytes=1GiB") ;;
    host) flags=(--tier="host,bytes=1GiB") ;;
    host+disk) flags=(--tier="host,bytes=$((POOL_PAGES * PAGE_BYTES));disk,path=$WORK/$mode,bytes=1GiB") ;;
  esac
  sock="$WORK/$mode.sock"
  "$BUILD/daemon/radixkvd" --socket="$sock" --metrics_listen= \
      --pool="host,bytes=$((POOL_PAGES * PAGE_BYTES)),page_bytes=$PAGE_BYTES" \
      "${flags[@]}" > "$WORK/$mode.log" 2>&1 &
  d=$!
  for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.05; done
  worker --endpoint "unix:$sock" > /dev/null            # pass 1: fill
  worker --endpoint "unix:$sock" | summary "$mode, pass 2"
  kill "$d"; wait "$d" 2>/dev/null || true
done
