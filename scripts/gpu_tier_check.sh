#!/usr/bin/env bash
# scripts/gpu_tier_check.sh: the tiers below a cuda pool, end to end, on a
# device machine (check tier-e2e of the GPU check bundle's run.sh, and a
# section of scripts/gpu_check.sh). Needs bash and coreutils only.
#
# radixkvd serves a pool of 16 pages of the worker's tiny model (four
# prompts of 8 blocks are twice what it holds) with a tier chain below it;
# radixkv-worker runs the prompts twice. The second pass must find every
# prompt fully cached, promoted back from the tiers, with first-token
# logits (first_logits_xxh3) and generated tokens equal bit for bit to
# those of the same prompts served straight from a pool that holds them
# all (same pages, same kernels: only the tiers' copies differ); the
# daemon's metrics must count no copy error and no checksum failure, and a
# host tier under a cuda pool must be pinned. How many prompts a full
# prefill (--no-cache) agrees with on the generated tokens is reported,
# not required (cached and uncached GPU prefills differ in rounding).
#
# Chains: host (host,bytes=1MiB), host+disk (a 20-block host tier above a
# disk tier: blocks move on down from pinned memory to the file) and disk
# (a disk tier alone: pages go through pinned bounce buffers).
#
# --device cpu runs the same over a host pool with the worker on the CPU,
# which needs no device (the bundle's dry run).
#
# Usage: gpu_tier_check.sh --radixkvd PATH --worker PATH [--device cuda|cpu]
#          [--chains host,host+disk,disk] [--logs DIR]
# Prints one line per chain and a summary line last. Exit: 0 every chain
# passed; 1 one failed (or the reference run did); 3 bad arguments.
set -u -o pipefail

DAEMON="" WORKER="" DEVICE=cuda CHAINS="host,host+disk,disk" LOGS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --radixkvd) DAEMON="$2"; shift 2 ;;
    --worker) WORKER="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --chains) CHAINS="$2"; shift 2 ;;
    --logs) LOGS="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_tier_check.sh: unknown argument $1 (--help)" >&2; exit 3 ;;
  esac
done
[[ -x "$DAEMON" && -x "$WORKER" ]] ||
  { echo "gpu_tier_check.sh: --radixkvd and --worker must name executables" >&2; exit 3; }
[[ "$DEVICE" == cuda || "$DEVICE" == cpu ]] ||
  { echo "gpu_tier_check.sh: --device cuda|cpu" >&2; exit 3; }

PAGE=8192        # one page of the tiny model (fp32 K/V), its namespace's
PROMPT_TOKENS=128  # 8 blocks of 16 tokens
FULL=$((PROMPT_TOKENS - 1))  # a fully cached prompt: all but its last token
if [[ "$DEVICE" == cuda ]]; then
  POOL_KIND="cuda,device=0"
else
  POOL_KIND="host"
fi
# Unix socket paths stay short: a directory of its own under /tmp.
TMP="$(mktemp -d /tmp/rkvtier.XXXXXX)" || exit 1
LOGS="${LOGS:-$(mktemp -d /tmp/radixkv-tier-check.XXXXXX)}"
mkdir -p "$LOGS"
PID=""
cleanup() {
  [[ -n "$PID" ]] && kill -KILL "$PID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

PROMPTS="$TMP/prompts.txt"
awk -v n="$PROMPT_TOKENS" 'BEGIN {
  for (i = 0; i < 4; i++) {
    s = ""
    for (j = 0; j < n; j++) s = s (j ? " " : "") ((7 * i + 13 * j) % 500 + 1)
    print s
  }
}' >"$PROMPTS"

# start NAME POOL_PAGES [TIER]: radixkvd on a socket of its own, metrics on
# an ephemeral port; sets PID, SOCK, PORT, DLOG. Non-zero when it did not
# become ready.
start() {
  local name="$1" pages="$2" tier="${3:-}"
  SOCK="$TMP/$name.sock" DLOG="$LOGS/radixkvd-$name.log" PORT=""
  "$DAEMON" --socket="$SOCK" --metrics_listen=127.0.0.1:0 \
    --pool="$POOL_KIND,bytes=$((pages * PAGE)),page_bytes=$PAGE" \
    ${tier:+"--tier=$tier"} >"$DLOG" 2>&1 &
  PID=$!
  local i
  for ((i = 0; i < 300; i++)); do
    grep -q "radixkvd: ready" "$DLOG" && break
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q "radixkvd: ready" "$DLOG"; then
    stop
    return 1
  fi
  PORT="$(sed -n 's|^radixkvd: metrics http://[^:]*:\([0-9]*\)/.*|\1|p' "$DLOG" | head -1)"
}

# stop: SIGTERM, then SIGKILL after 10 s.
stop() {
  [[ -n "$PID" ]] || return 0
  kill -TERM "$PID" 2>/dev/null
  local i
  for ((i = 0; i < 100; i++)); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$PID" 2>/dev/null
  wait "$PID" 2>/dev/null
  PID=""
}

# pass OUT [ARGS...]: the worker over the prompts (JSON lines into OUT);
# ARGS default to the running daemon's endpoint.
pass() {
  local out="$1"
  shift
  [[ $# -gt 0 ]] || set -- --endpoint "unix:$SOCK"
  timeout 120 "$WORKER" run --device "$DEVICE" --prompts "$PROMPTS" --json \
    --decode 4 "$@" >"$out" 2>"$out.err"
  local rc=$?
  [[ $rc -eq 0 && $(grep -c '^{' "$out") -eq 4 ]] && return 0
  echo "worker exited $rc: $(tail -1 "$out.err" | cut -c1-120)"
  return 1
}

# column FILE KEY: KEY's value on each JSON line, one a line ("generated":
# its whole list).
column() {
  if [[ "$2" == generated ]]; then
    grep '^{' "$1" | grep -o '"generated":\[[^]]*\]'
  else
    grep '^{' "$1" | grep -o "\"$2\":[^,}]*" | sed -e 's/^[^:]*://' -e 's/"//g'
  fi
}

# metric TEXT FAMILY LABEL...: the sum of FAMILY's samples carrying every
# LABEL (key="value").
metric() {
  local text="$1" family="$2"
  shift 2
  local lines
  lines="$(grep "^$family{" <<<"$text")"
  local l
  for l in "$@"; do lines="$(grep -F "$l" <<<"$lines")"; done
  awk '{ s += $NF } END { printf("%d", s) }' <<<"$lines"
}

# The running daemon's /metrics (empty when it cannot be read).
scrape() {
  [[ -n "$PORT" ]] || return 0
  timeout 10 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" &&
    printf "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3 && cat <&3' \
    _ "$PORT" 2>/dev/null
}

failed=0
summary=""

# ---- the reference: a pool that holds every prompt ---------------------------------
if ! start reference 64; then
  echo "reference FAIL radixkvd did not start: $(tail -2 "$DLOG" | tr '\n' ' ' | cut -c1-160)"
  echo "tier-e2e: FAIL (no reference)"
  exit 1
fi
if ! msg="$(pass "$LOGS/reference-1.jsonl")" || ! msg="$(pass "$LOGS/reference-2.jsonl")"; then
  stop
  echo "reference FAIL $msg"
  echo "tier-e2e: FAIL (no reference)"
  exit 1
fi
stop
REF="$LOGS/reference-2.jsonl"
if [[ "$(column "$REF" matched_tokens | sort -u)" != "$FULL" ]]; then
  echo "reference FAIL the second pass over a pool of 64 pages did not find every prompt cached" \
       "(matched: $(column "$REF" matched_tokens | tr '\n' ' '))"
  echo "tier-e2e: FAIL (no reference)"
  exit 1
fi
nocache_agree=""
if pass "$LOGS/no-cache.jsonl" --no-cache >/dev/null; then
  nocache_agree="$(paste -d' ' <(column "$REF" generated) \
    <(column "$LOGS/no-cache.jsonl" generated) | awk '$1 "" == $2 ""' | wc -l)"
fi

# ---- each chain ------------------------------------------------------------------------------
IFS=',' read -r -a chain_list <<<"$CHAINS"
for chain in "${chain_list[@]}"; do
  mkdir -p "$TMP/$chain.disk"
  case "$chain" in
    host) tier="host,bytes=1MiB" ;;
    host+disk) tier="host,bytes=$((20 * PAGE));disk,path=$TMP/$chain.disk,bytes=4MiB" ;;
    disk) tier="disk,path=$TMP/$chain.disk,bytes=4MiB" ;;
    *) echo "$chain FAIL unknown chain (host, host+disk, disk)"; failed=1; continue ;;
  esac
  if ! start "$chain" 16 "$tier"; then
    echo "$chain FAIL radixkvd --tier=$tier did not start: $(tail -2 "$DLOG" | tr '\n' ' ' | cut -c1-160)"
    failed=1
    continue
  fi
  first="$LOGS/$chain-1.jsonl" second="$LOGS/$chain-2.jsonl"
  if ! msg="$(pass "$first")" || ! msg="$(pass "$second")"; then
    stop
    echo "$chain FAIL $msg"
    failed=1
    continue
  fi
  text="$(scrape)"
  stop
  problems=()
  matched="$(column "$second" matched_tokens | tr '\n' ' ')"
  [[ "$(column "$first" matched_tokens | sort -u)" == 0 ]] ||
    problems+=("the first pass found cached tokens")
  [[ "$(column "$second" matched_tokens | sort -u)" == "$FULL" ]] ||
    problems+=("second pass matched ${matched% } tokens, not $FULL each")
  same_logits="$(paste -d' ' <(column "$REF" first_logits_xxh3) \
    <(column "$second" first_logits_xxh3) | awk '$1 "" == $2 ""' | wc -l)"
  same_tokens="$(paste -d' ' <(column "$REF" generated) \
    <(column "$second" generated) | awk '$1 "" == $2 ""' | wc -l)"
  [[ $same_logits -eq 4 ]] || problems+=("first-token logits equal on $same_logits/4 prompts")
  [[ $same_tokens -eq 4 ]] || problems+=("generated tokens equal on $same_tokens/4 prompts")
  host_line="$(grep -o 'tier host: .*' "$DLOG" | head -1)"
  if [[ "$chain" == host* && "$DEVICE" == cuda && "$host_line" != *", pinned"* ]]; then
    problems+=("the host tier is not pinned (${host_line:-no tier host line in the log})")
  fi
  moved=""
  if [[ -z "$text" ]]; then
    moved="metrics unavailable"
  else
    errors="$(metric "$text" radixkv_tier_dropped_blocks_total 'reason="copy_error"')"
    sums="$(metric "$text" radixkv_tier_dropped_blocks_total 'reason="checksum"')"
    [[ $errors -eq 0 ]] || problems+=("$errors copy errors")
    [[ $sums -eq 0 ]] || problems+=("$sums checksum failures")
    for kind in ${chain//+/ }; do
      moved="$moved$kind $(metric "$text" radixkv_tier_moved_blocks_total "tier=\"$kind\"" 'direction="down"') down"
      moved="$moved $(metric "$text" radixkv_tier_moved_blocks_total "tier=\"$kind\"" 'direction="up"') up; "
    done
    up="$(metric "$text" radixkv_tier_moved_blocks_total 'direction="up"')"
    [[ $up -ge 8 ]] || problems+=("$up blocks promoted")
    moved="${moved%; }"
  fi
  if [[ ${#problems[@]} -eq 0 ]]; then
    echo "$chain PASS 4/4 prompts fully cached from the tiers, logits and tokens equal the pool's; $moved"
    summary="$summary$chain ok ($moved); "
  else
    failed=1
    detail="$(printf '%s; ' "${problems[@]}")"
    echo "$chain FAIL ${detail%; } ($moved; logs: $LOGS)"
    summary="$summary$chain FAILED; "
  fi
done

pinned=""
[[ "$DEVICE" == cuda ]] && pinned=", host tiers pinned"
agree="${nocache_agree:-?}/4 prompts generate the tokens of a full prefill"
if [[ $failed -eq 0 ]]; then
  echo "tier-e2e: PASS $DEVICE pool of 16 tiny pages, 4 prompts of 8 blocks: ${summary%; }$pinned; $agree"
else
  echo "tier-e2e: FAIL ${summary%; } (logs: $LOGS)"
fi
exit $failed
