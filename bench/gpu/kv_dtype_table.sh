#!/usr/bin/env bash
# bench/gpu/kv_dtype_table.sh: the KV-cache dtype table of docs/BENCHMARKS.md
# ("KV cache dtypes"), one markdown row per page dtype, from
# `radixkv-worker bench --kv-dtype=...`:
#
#   bytes per token, page bytes and pages per GiB of the model's pages;
#   max / mean |logit error| of the first token and greedy-token agreement
#   over a fixed prompt set (--eval-prompts), each prompt 90 % cached in
#   pages of the dtype, against an all-fp32 run;
#   time to first token with 90 % of a prompt cached (best of --repeat).
#
# Usage: bench/gpu/kv_dtype_table.sh WORKER [--device cpu|cuda]
#          [--model small] [--eval-prompts 16] [--repeat 3]
#          [--prefix-tokens 1856] [--suffix-tokens 192]
# WORKER is the radixkv-worker binary. Needs bash, grep and sed only (runs
# in the GPU bundle on a bare machine). Exit: 0, or the first failing
# bench's status (77 passes through: --device cuda without a device).
set -u -o pipefail

WORKER="${1:?usage: kv_dtype_table.sh WORKER [--device D] [--model M] ...}"
shift
DEVICE=cpu MODEL=small PROMPTS=16 REPEAT=3 PREFIX=1856 SUFFIX=192
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --eval-prompts) PROMPTS="$2"; shift 2 ;;
    --repeat) REPEAT="$2"; shift 2 ;;
    --prefix-tokens) PREFIX="$2"; shift 2 ;;
    --suffix-tokens) SUFFIX="$2"; shift 2 ;;
    *) echo "kv_dtype_table.sh: unknown argument $1" >&2; exit 3 ;;
  esac
done

# The value of "key" in a one-line JSON object (numbers and strings).
field() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -1 | sed -e 's/^[^:]*://' -e 's/"//g'; }
# A number with `digits` significant digits (awk: no python on the device).
sig() { awk -v x="$1" -v d="$2" 'BEGIN { printf("%.*g", d, x) }'; }

echo "| dtype | bytes/token | page bytes | pages per GiB | max logit err | mean logit err | greedy agreement | TTFT 90 % cached, $DEVICE (ms) |"
echo "|---|---|---|---|---|---|---|---|"
for dtype in fp32 fp16 bf16 fp8_e4m3 fp8_e5m2 int8; do
  out="$("$WORKER" bench --device "$DEVICE" --model "$MODEL" --kv-dtype "$dtype" \
         --prefix-tokens "$PREFIX" --suffix-tokens "$SUFFIX" --repeat "$REPEAT" \
         --eval-prompts "$PROMPTS" --eval-tokens 512 --eval-decode 16 2>&1)"
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "kv_dtype_table.sh: bench --kv-dtype $dtype exited $rc: $out" >&2
    exit $rc
  fi
  json="$(grep '^{' <<<"$out" | tail -1)"
  ttft_ms="$(awk -v s="$(field "$json" ttft_cached_s)" 'BEGIN { printf("%.1f", s * 1000) }')"
  echo "| $dtype | $(field "$json" bytes_per_token) | $(field "$json" page_bytes) |" \
       "$(field "$json" pages_per_gib) | $(sig "$(field "$json" eval_max_abs_logit_err)" 2) |" \
       "$(sig "$(field "$json" eval_mean_abs_logit_err)" 2) | $(field "$json" greedy_agreement) |" \
       "$ttft_ms |"
done
