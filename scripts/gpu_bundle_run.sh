#!/usr/bin/env bash
# run.sh of a radixkv GPU check bundle (built by scripts/gpu_bundle.sh; this
# file is scripts/gpu_bundle_run.sh in the source tree). Runs every check on
# this machine with the bundle's own binaries and libraries (bash and
# coreutils are all it needs) and prints one line per check:
#
#   CHECK                          STATUS  DETAIL
#
# STATUS is PASS, FAIL, SKIP (no device, or not in this bundle) or LOW (a
# measurement below its target). The checks:
#
#   bundle                 what the bundle holds; glibc new enough
#   device                 nvidia-smi's view of the GPU
#   gpu-test:<binary>      every gtest binary of `ctest -L gpu` (tests.txt),
#                          e.g. the kernels against the CPU (fp32 and every
#                          KV dtype), the CUDA model, the cuda pool
#   cuda-pool-2-processes  the cuda pool exported by one process and
#                          imported by another (radixkv_cuda_pool_test)
#   copy-vs-hbm            copy_pages d2d, GB/s read + write, % of HBM peak
#   host-device            host <-> device copies, GB/s each way
#   tier-copy              a cuda pool's PageCopier moving scattered pages to
#                          pinned host memory and back: GB/s each way and the
#                          ratio to one cudaMemcpyAsync of the same bytes
#                          (FAIL below 0.70 for 2 MiB pages; LOW below
#                          40 GB/s, the PCIe Gen5 target)
#   write-kv               write_kv scatter, GB/s
#   attention              the attention kernel, ms per call per shape
#   attention-kv-dtypes    write_kv and attention per KV page dtype: ms, the
#                          device pages equal to the CPU's bit for bit
#   worker-ttft:<model>    radixkv-worker bench --device cuda, TTFT with
#                          90 % of the prompt cached, and the speed-up
#   kv-dtype:<dtype>       the KV dtype table's GPU column (bytes per token,
#                          logit error, greedy agreement, TTFT)
#   tier-e2e               radixkvd --pool=cuda with host, host+disk and disk
#                          tiers below a pool half the prompts' size: the
#                          worker's second pass (--device cuda) finds every
#                          prompt promoted back, its logits bit for bit those
#                          of a pool that kept it (bin/gpu_tier_check.sh;
#                          without a device, a host-pool smoke run on the CPU)
#
# Usage: run.sh [--dry-run] [--quick] [--logs DIR]
#   --dry-run  do not expect a device (CI): the device checks report SKIP,
#              the test binaries and the worker still run (on the CPU)
#   --quick    smaller benches (gpu_bench --quick, fewer repeats)
#   --logs     where raw outputs go (default: a fresh directory under /tmp)
# Exit: 0 when no check FAILed; 1 otherwise; 3 bad arguments.
set -u -o pipefail

B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DRY=0 QUICK=0 LOGS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --quick) QUICK=1; shift ;;
    --logs) LOGS="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (--help)" >&2; exit 3 ;;
  esac
done
LOGS="${LOGS:-$(mktemp -d /tmp/radixkv-gpu-check.XXXXXX)}"
mkdir -p "$LOGS"
# The bundle's libraries first; a CUDA toolkit's (cuBLAS is too large to
# bundle) when the machine has one. Child processes inherit the path.
LIBPATH="$B/lib"
# version_ge A B: A >= B for dotted versions.
version_ge() { [[ "$(printf '%s\n%s\n' "$1" "$2" | sort -t. -k1,1n -k2,2n | head -1)" == "$2" ]]; }
GLIBC="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
NEED="$(sed -n 's/^glibc_needed: //p' "$B/MANIFEST" 2>/dev/null)"
NEED_CXX="$(sed -n 's/^glibc_needed_cxx: //p' "$B/MANIFEST" 2>/dev/null)"
CXX="bundled"
if [[ -d "$B/lib/cxx" ]]; then
  if [[ -z "$NEED_CXX" || -z "$GLIBC" ]] || version_ge "$GLIBC" "$NEED_CXX"; then
    LIBPATH="$LIBPATH:$B/lib/cxx"
  else
    CXX="the machine's (glibc $GLIBC < $NEED_CXX for the bundled one)"
  fi
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && LIBPATH="$LIBPATH:$d"
done
export LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RADIXKV_THREADS="${RADIXKV_THREADS:-$(nproc)}"

FAILED=0
T0=$SECONDS
line() {  # line CHECK STATUS DETAIL...
  local check="$1" status="$2"
  shift 2
  printf '%-34s %-5s %s\n' "$check" "$status" "$*"
  [[ "$status" == FAIL ]] && FAILED=1
  return 0
}
# The value of "key" in a one-line JSON object.
field() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -1 | sed -e 's/^[^:]*://' -e 's/"//g'; }
# gtest's summary counts from a log: passed skipped failed.
counts() {
  local p s f
  p="$(grep -o '\[  PASSED  \] [0-9]*' "$1" | grep -o '[0-9]*$' | tail -1)"
  s="$(grep -o '\[  SKIPPED \] [0-9]* test' "$1" | grep -o '[0-9]* ' | tail -1)"
  f="$(grep -o '\[  FAILED  \] [0-9]* test' "$1" | grep -o '[0-9]* ' | tail -1)"
  echo "${p:-0} ${s:-0} ${f:-0}"
}

# ---- bundle, device ----------------------------------------------------------------------
tests=()
[[ -f "$B/tests.txt" ]] && mapfile -t tests <"$B/tests.txt"
detail="$(ls "$B/bin" | wc -l) programs, $(find "$B/lib" -name '*.so*' | wc -l) libraries, ${#tests[@]} gpu test binaries; glibc ${GLIBC:-?} (needs ${NEED:-?}); C++ runtime: $CXX"
if [[ -n "$NEED" && -n "$GLIBC" ]] && ! version_ge "$GLIBC" "$NEED"; then
  line bundle FAIL "$detail: this glibc is older than the bundle needs"
else
  line bundle PASS "$detail"
fi
HAVE_DEVICE=0
if [[ $DRY -eq 0 ]] && command -v nvidia-smi >/dev/null 2>&1 &&
   nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
     >"$LOGS/nvidia-smi.txt" 2>&1; then
  HAVE_DEVICE=1
  line device PASS "$(head -1 "$LOGS/nvidia-smi.txt")"
elif [[ $DRY -eq 0 && -e /dev/nvidia0 ]]; then
  HAVE_DEVICE=1
  line device PASS "/dev/nvidia0 present (no nvidia-smi)"
else
  line device SKIP "no device$([[ $DRY -eq 1 ]] && echo ' (--dry-run)')"
fi
if [[ $HAVE_DEVICE -eq 0 ]]; then
  # No device: CUDA must report none, so device tests skip instead of failing.
  export CUDA_VISIBLE_DEVICES=""
fi

# ---- gpu tests ---------------------------------------------------------------------------------
for t in "${tests[@]}"; do
  [[ -n "$t" ]] || continue
  log="$LOGS/$t.log"
  s0=$SECONDS
  timeout 300 "$B/bin/$t" --gtest_brief=1 >"$log" 2>&1
  rc=$?
  read -r p s f < <(counts "$log")
  d="$p passed, $s skipped, $f failed, $((SECONDS - s0)) s"
  if [[ $rc -ne 0 || $f -gt 0 ]]; then
    status=FAIL
    d="$d (exit $rc; $(grep -m1 -E 'FAILED|Failure|error' "$log" | cut -c1-120))"
  elif [[ $HAVE_DEVICE -eq 1 && $p -eq 0 && $s -gt 0 ]]; then
    # A GPU is there but CUDA sees none: e.g. a driver older than the
    # bundle's CUDA runtime.
    status=FAIL
    d="$d (a device is present but every test skipped: $(grep -m1 -A1 'Skipped' "$log" | tail -1 | cut -c1-100))"
  elif [[ $p -eq 0 && $s -gt 0 ]] || [[ $HAVE_DEVICE -eq 0 && $s -gt 0 ]]; then
    status=SKIP
  else
    status=PASS
  fi
  line "gpu-test:$t" "$status" "$d"
  if [[ "$t" == radixkv_cuda_pool_test ]]; then
    line cuda-pool-2-processes "$status" "export in one process, import and read/write in a second ($d)"
  fi
done
if [[ ${#tests[@]} -eq 0 ]]; then
  line gpu-tests SKIP "no gpu test binaries in this bundle (CUDA-off build)"
fi
if ! grep -qx radixkv_cuda_pool_test "$B/tests.txt" 2>/dev/null; then
  line cuda-pool-2-processes SKIP "radixkv_cuda_pool_test not in this bundle (CUDA-off build)"
fi

# ---- gpu_bench -------------------------------------------------------------------------------------
bench_checks=(copy-vs-hbm host-device tier-copy write-kv attention attention-kv-dtypes)
if [[ ! -x "$B/bin/gpu_bench" ]]; then
  for c in "${bench_checks[@]}"; do line "$c" SKIP "gpu_bench not in this bundle (CUDA-off build)"; done
elif [[ $HAVE_DEVICE -eq 0 ]]; then
  timeout 60 "$B/bin/gpu_bench" --quick >"$LOGS/gpu_bench.jsonl" 2>&1
  rc=$?
  for c in "${bench_checks[@]}"; do
    if [[ $rc -eq 77 ]]; then line "$c" SKIP "no device (gpu_bench exit 77)"
    else line "$c" FAIL "gpu_bench without a device exited $rc, not 77"; fi
  done
else
  timeout 300 "$B/bin/gpu_bench" $([[ $QUICK -eq 1 ]] && echo --quick) >"$LOGS/gpu_bench.jsonl" 2>&1
  rc=$?
  if [[ $rc -eq 77 ]]; then
    line gpu_bench FAIL "a device is present but gpu_bench found none usable (exit 77; driver too old for CUDA 13?)"
  elif [[ $rc -ne 0 ]]; then
    line gpu_bench FAIL "exit $rc: $(tail -1 "$LOGS/gpu_bench.jsonl" | cut -c1-160)"
  fi
  d="" best=0
  while read -r j; do
    pct="$(field "$j" pct_of_peak)"
    d="$d$(field "$j" page_bytes) B pages $(field "$j" gbps_rw) GB/s ($pct %); "
    best="$(awk -v a="$best" -v b="$pct" 'BEGIN { print (b > a ? b : a) }')"
  done < <(grep '"bench":"copy_pages"' "$LOGS/gpu_bench.jsonl")
  ref="$(grep '"bench":"memcpy_reference"' "$LOGS/gpu_bench.jsonl" | head -1)"
  if [[ -z "$d" ]]; then
    line copy-vs-hbm FAIL "no copy_pages result"
  else
    st="$(awk -v b="$best" 'BEGIN { print (b >= 70 ? "PASS" : "LOW") }')"
    line copy-vs-hbm "$st" "${d}memcpy $(field "$ref" gbps_rw) GB/s; target 70 % of peak"
  fi
  d="" low=0
  while read -r j; do
    g="$(field "$j" gbps)"
    d="$d$(field "$j" method) $(field "$j" dir) $g GB/s; "
    [[ "$(field "$j" method)" == copy_pages ]] &&
      low="$(awk -v l="$low" -v g="$g" 'BEGIN { print (g < 40 ? 1 : l) }')"
  done < <(grep '"bench":"offload"' "$LOGS/gpu_bench.jsonl")
  if [[ -z "$d" ]]; then line host-device FAIL "no offload result"
  else line host-device "$([[ $low -eq 1 ]] && echo LOW || echo PASS)" "${d}target 40 GB/s"; fi
  d="" st=PASS
  while read -r j; do
    r="$(field "$j" ratio)" g="$(field "$j" gbps)"
    d="$d$(field "$j" page_bytes) B pages $(field "$j" dir) $g GB/s ($r of memcpy $(field "$j" memcpy_gbps)); "
    [[ "$(field "$j" page_bytes)" == 2097152 ]] || continue
    if awk -v r="$r" 'BEGIN { exit !(r < 0.70) }'; then st=FAIL
    elif [[ $st == PASS ]] && awk -v g="$g" 'BEGIN { exit !(g < 40) }'; then st=LOW; fi
  done < <(grep '"bench":"tier_copy"' "$LOGS/gpu_bench.jsonl")
  if [[ -z "$d" ]]; then line tier-copy FAIL "no tier_copy result"
  else line tier-copy "$st" "${d}target: 2 MiB pages at 0.70 of memcpy (40 GB/s on PCIe Gen5)"; fi
  j="$(grep '"bench":"write_kv"' "$LOGS/gpu_bench.jsonl" | head -1)"
  if [[ -z "$j" ]]; then line write-kv FAIL "no write_kv result"
  else line write-kv PASS "$(field "$j" tokens) tokens in $(field "$j" ms) ms, $(field "$j" gbps_written) GB/s"; fi
  d="" bad=0
  while read -r j; do
    [[ "$(field "$j" pages_equal_cpu)" == true ]] || bad=1
    bad="$(awk -v b="$bad" -v x="$(field "$j" max_abs_diff)" 'BEGIN { print (x > 1e-4 ? 1 : b) }')"
    d="$d$(field "$j" kv_dtype) write $(field "$j" write_kv_ms) attn $(field "$j" attention_ms) ms; "
  done < <(grep '"bench":"kv_dtype"' "$LOGS/gpu_bench.jsonl")
  if [[ -z "$d" ]]; then line attention-kv-dtypes FAIL "no kv_dtype result"
  else line attention-kv-dtypes "$([[ $bad -eq 1 ]] && echo FAIL || echo PASS)" \
    "${d}device pages == cpu write_kv bit for bit, attention within 1e-4 of the cpu"; fi
  d="" bad=0
  while read -r j; do
    d="$d$(field "$j" shape) $(field "$j" gpu_ms) ms ($(field "$j" gpu_tflops) TFLOP/s, x$(field "$j" speedup_vs_cpu) vs cpu, diff $(field "$j" max_abs_diff)); "
    bad="$(awk -v b="$bad" -v x="$(field "$j" max_abs_diff)" 'BEGIN { print (x > 1e-4 ? 1 : b) }')"
  done < <(grep '"bench":"attention"' "$LOGS/gpu_bench.jsonl")
  if [[ -z "$d" ]]; then line attention FAIL "no attention result"
  else line attention "$([[ $bad -eq 1 ]] && echo FAIL || echo PASS)" "$d"; fi
fi

# ---- worker ----------------------------------------------------------------------------------------
W="$B/bin/radixkv-worker"
if [[ $HAVE_DEVICE -eq 1 ]]; then
  reps=$([[ $QUICK -eq 1 ]] && echo 2 || echo 5)
  for spec in "small 1856 192" "base 1856 192" "base 7360 832"; do
    read -r model p s <<<"$spec"
    [[ $QUICK -eq 1 && $p -gt 2000 ]] && continue
    j="$(timeout 180 "$W" bench --device cuda --model "$model" --prefix-tokens "$p" \
         --suffix-tokens "$s" --repeat "$reps" 2>"$LOGS/worker-$model-$p.err" | grep '^{' | tail -1)"
    if [[ -z "$j" ]]; then
      line "worker-ttft:$model-$((p + s))" FAIL "$(tail -1 "$LOGS/worker-$model-$p.err" | cut -c1-160)"
      continue
    fi
    frac="$(field "$j" fraction_of_ideal)"
    line "worker-ttft:$model-$((p + s))" \
      "$(awk -v f="$frac" 'BEGIN { print (f >= 0.8 ? "PASS" : "LOW") }')" \
      "cached $(awk -v s="$(field "$j" ttft_cached_s)" 'BEGIN { printf("%.2f", s * 1e3) }') ms," \
      "uncached $(awk -v s="$(field "$j" ttft_uncached_s)" 'BEGIN { printf("%.2f", s * 1e3) }') ms," \
      "speed-up $(field "$j" speedup) of ideal $(field "$j" ideal_speedup) ($frac; target 0.8)," \
      "gemm $(field "$j" gemm), logit diff $(field "$j" max_abs_logit_diff)"
  done
  timeout 240 "$B/bin/kv_dtype_table.sh" "$W" --device cuda \
      --eval-prompts "$([[ $QUICK -eq 1 ]] && echo 4 || echo 16)" --repeat "$reps" \
      >"$LOGS/kv_dtype_table.md" 2>"$LOGS/kv_dtype_table.err"
  rc=$?
  if [[ $rc -ne 0 ]]; then
    line kv-dtype FAIL "kv_dtype_table.sh exited $rc: $(tail -1 "$LOGS/kv_dtype_table.err" | cut -c1-160)"
  else
    while IFS='|' read -r _ dt bpt pb ppg mx mean agree ttft _; do
      dt="$(echo $dt)"
      line "kv-dtype:$dt" PASS "bytes/token$bpt, pages/GiB$ppg, max logit err$mx, mean$mean, greedy$agree, TTFT 90 % cached$ttft ms"
    done < <(tail -n +3 "$LOGS/kv_dtype_table.md")
  fi
else
  # No device: the worker still runs, on the CPU, so the binary and its
  # libraries are proven; the device figures are skipped.
  j="$(timeout 120 "$W" bench --device cpu --model tiny --kv-dtype fp8_e4m3 \
       --prefix-tokens 224 --suffix-tokens 32 --repeat 1 --eval-prompts 1 \
       --eval-tokens 64 --eval-decode 2 2>"$LOGS/worker-cpu.err" | grep '^{' | tail -1)"
  if [[ -z "$j" ]]; then
    line worker-ttft FAIL "radixkv-worker did not run: $(tail -1 "$LOGS/worker-cpu.err" | cut -c1-160)"
  else
    line worker-ttft SKIP "no device; cpu smoke run ok (tiny, fp8_e4m3 pages, matched $(field "$j" matched_tokens), logit diff $(field "$j" max_abs_logit_diff))"
  fi
  line kv-dtype SKIP "no device"
fi

# ---- tiers below the pool ----------------------------------------------------------------------
TC="$B/bin/gpu_tier_check.sh"
if [[ ! -x "$B/bin/radixkvd" || ! -x "$TC" ]]; then
  line tier-e2e SKIP "radixkvd or gpu_tier_check.sh not in this bundle"
else
  if [[ $HAVE_DEVICE -eq 1 ]]; then
    out="$(timeout 180 "$TC" --radixkvd "$B/bin/radixkvd" --worker "$W" --device cuda \
           --logs "$LOGS/tier-e2e" 2>&1)"
  else
    out="$(timeout 120 "$TC" --radixkvd "$B/bin/radixkvd" --worker "$W" --device cpu \
           --chains host+disk --logs "$LOGS/tier-e2e" 2>&1)"
  fi
  rc=$?
  echo "$out" >"$LOGS/tier-e2e.txt"
  d="$(tail -1 <<<"$out" | sed 's/^tier-e2e: [A-Z]* //')"
  if [[ $rc -ne 0 ]]; then
    line tier-e2e FAIL "exit $rc: $(grep -m1 -E '^[a-z+]+ FAIL ' <<<"$out" | cut -c1-200)${d:+; $d}"
  elif [[ $HAVE_DEVICE -eq 1 ]]; then
    line tier-e2e PASS "$d"
  else
    line tier-e2e SKIP "no device; host-pool smoke run ok: $d"
  fi
fi

echo "run.sh: $([[ $FAILED -eq 0 ]] && echo OK || echo FAILED) in $((SECONDS - T0)) s; raw outputs in $LOGS"
exit $FAILED
