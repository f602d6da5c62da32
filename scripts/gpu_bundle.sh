#!/usr/bin/env bash
# scripts/gpu_bundle.sh: build the GPU check bundle, a directory that runs
# the project's GPU checks on a bare device machine (a driver, no compiler,
# no gRPC / Abseil packages, no network) with one command:
#
#   scripts/gpu_bundle.sh --out /tmp/radixkv-gpu-bundle      # here
#   /tmp/radixkv-gpu-bundle/run.sh                           # there
#
# Steps:
#   1. configure (if needed) and build a CUDA build directory ($BUILD, default
#      build/gpu-bundle: Release, -DRADIXKV_ENABLE_CUDA=ON,
#      -DCMAKE_CUDA_ARCHITECTURES=90) with only the bundle's targets: every
#      test labelled `gpu` in ctest, gpu_bench, radixkv-worker and radixkvd;
#   2. copy the gtest executables of `ctest -L gpu` (found through
#      `ctest --show-only=json-v1`), gpu_bench, radixkv-worker, radixkvd,
#      bench/gpu/kv_dtype_table.sh and scripts/gpu_tier_check.sh into bin/,
#      stripped of debug info;
#   3. copy every shared library they load (ldd) that a bare Debian / Ubuntu
#      base lacks into lib/ (everything but the glibc family and the
#      kernel's vDSO; the C++ runtime goes to lib/cxx); the runner puts lib/
#      (and lib/cxx where the machine's glibc is new enough for it) on
#      LD_LIBRARY_PATH, which child processes inherit;
#   4. write MANIFEST (what was built, from where, the newest glibc symbol
#      version the binaries need) and tests.txt (one gpu test binary a line),
#      and copy scripts/gpu_bundle_run.sh as run.sh;
#   5. refuse a bundle above --max-mib (default 64).
#
# --cuda off builds nothing with CUDA: it bundles the CUDA-off binaries of an
# existing build directory (--build; the gpu tests are then absent, the
# runner's device checks say "skipped") so that CI can exercise the bundle's
# assembly and its runner quickly (tests/gpu/bundle_test.sh, ctest label
# `bundle`).
#
# Usage: scripts/gpu_bundle.sh --out DIR [--build DIR] [--cuda on|off]
#          [--jobs N] [--max-mib N] [--no-build]
# Exit: 0 ok; 1 build or copy failure; 2 the bundle exceeds --max-mib;
#       3 bad arguments.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="" BUILD="" CUDA=on JOBS=2 MAX_MIB=64 DO_BUILD=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --build) BUILD="$2"; shift 2 ;;
    --cuda) CUDA="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --max-mib) MAX_MIB="$2"; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown argument $1 (--help)" >&2; exit 3 ;;
  esac
done
[[ -n "$OUT" ]] || { echo "gpu_bundle.sh: --out DIR is required" >&2; exit 3; }
[[ "$CUDA" == on || "$CUDA" == off ]] || { echo "gpu_bundle.sh: --cuda on|off" >&2; exit 3; }
BUILD="${BUILD:-$ROOT/build/gpu-bundle}"
say() { echo "gpu_bundle: $*"; }
die() { echo "gpu_bundle: FAIL: $*" >&2; exit 1; }

# ---- 1. build ----------------------------------------------------------------
if [[ "$CUDA" == on && $DO_BUILD -eq 1 ]]; then
  NVCC=/usr/local/cuda/bin/nvcc
  [[ -x "$NVCC" ]] || NVCC="$(command -v nvcc || true)"
  [[ -n "$NVCC" ]] || die "nvcc not found: the bundle's CUDA build needs the toolkit"
  if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
    say "configure $BUILD (Release, CUDA sm_90)"
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DRADIXKV_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_CUDA_COMPILER="$NVCC" >"$BUILD.configure.log" 2>&1 ||
      { tail -30 "$BUILD.configure.log"; die "configure failed"; }
  fi
  grep -q "^RADIXKV_ENABLE_CUDA:BOOL=ON" "$BUILD/CMakeCache.txt" &&
    compgen -G "$BUILD/CMakeFiles/*/CMakeCUDACompiler.cmake" >/dev/null ||
    die "$BUILD is not a CUDA build (RADIXKV_ENABLE_CUDA off or no nvcc)"
fi
if [[ $DO_BUILD -eq 1 ]]; then
  [[ -f "$BUILD/CMakeCache.txt" ]] || die "$BUILD is not a configured build directory"
  # The gpu-labelled test targets, from ctest's own list (a fresh build dir
  # lists them once CMake has run), plus the benches.
  mapfile -t GPU_TARGETS < <(cd "$BUILD" && ctest -L gpu --show-only=json-v1 2>/dev/null |
    python3 -c 'import json, os, sys
seen = set()
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    if cmd and cmd[0] not in seen and os.path.basename(cmd[0]) not in ("python3", "python"):
        seen.add(cmd[0]); print(os.path.basename(cmd[0]))' 2>/dev/null)
  TARGETS=("${GPU_TARGETS[@]}" radixkv-worker radixkvd)
  [[ "$CUDA" == off ]] && TARGETS+=(kernels_quant_test)
  [[ "$CUDA" == on ]] && TARGETS+=(gpu_bench kernels_cuda_test kernels_quant_cuda_test
                                   model_cuda_test radixkv_cuda_pool_test
                                   radixkv_page_copier_cuda_test kernels_xlayer_cuda_test
                                   daemon_tier_chain_cuda_test)
  mapfile -t TARGETS < <(printf '%s\n' "${TARGETS[@]}" | sort -u)
  say "build ${TARGETS[*]} (-j$JOBS)"
  t0=$SECONDS
  cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >"$BUILD.bundle-build.log" 2>&1 ||
    { tail -30 "$BUILD.bundle-build.log"; die "build failed"; }
  say "build: $((SECONDS - t0)) s"
fi

# ---- 2. binaries -----------------------------------------------------------------
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" || die "cannot create $OUT"
# gtest executables of `ctest -L gpu` (path; gtest_discover_tests runs the
# same binary per test case).
mapfile -t TEST_BINS < <(cd "$BUILD" && ctest -L gpu --show-only=json-v1 2>/dev/null |
  python3 -c 'import json, sys
seen = []
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    if cmd and "--gtest_filter" in " ".join(cmd) and cmd[0] not in seen:
        seen.append(cmd[0])
        print(cmd[0])')
if [[ "$CUDA" == off && ${#TEST_BINS[@]} -eq 0 ]]; then
  # No gpu tests in a CUDA-off build: the CPU typed-page test stands in, so
  # the runner's test path still runs.
  TEST_BINS=("$BUILD/tests/gpu/kernels_quant_test")
fi
BINS=("${TEST_BINS[@]}")
WORKER="$BUILD/worker/radixkv-worker"
[[ -x "$WORKER" ]] || die "$WORKER was not built"
BINS+=("$WORKER")
# radixkvd, for the tiers' end-to-end check (gpu_tier_check.sh); a CUDA-off
# build without it bundles no daemon and that check says "skipped".
DAEMON="$BUILD/daemon/radixkvd"
if [[ -x "$DAEMON" ]]; then
  BINS+=("$DAEMON")
elif [[ "$CUDA" == on ]]; then
  die "$DAEMON was not built"
fi
[[ -x "$BUILD/bench/gpu/gpu_bench" ]] && BINS+=("$BUILD/bench/gpu/gpu_bench")
if [[ "$CUDA" == on ]]; then
  [[ ${#TEST_BINS[@]} -gt 0 ]] || die "ctest -L gpu lists no gtest binary in $BUILD"
  [[ -x "$BUILD/bench/gpu/gpu_bench" ]] || die "gpu_bench was not built"
fi
: >"$OUT/tests.txt"
for b in "${BINS[@]}"; do
  [[ -x "$b" ]] || die "$b is missing"
  cp "$b" "$OUT/bin/" || die "copy $b"
  strip --strip-debug "$OUT/bin/$(basename "$b")" 2>/dev/null || true
done
for b in "${TEST_BINS[@]}"; do basename "$b" >>"$OUT/tests.txt"; done
cp "$ROOT/bench/gpu/kv_dtype_table.sh" "$OUT/bin/" || die "copy kv_dtype_table.sh"
cp "$ROOT/scripts/gpu_tier_check.sh" "$OUT/bin/" || die "copy gpu_tier_check.sh"
cp "$ROOT/scripts/gpu_bundle_run.sh" "$OUT/run.sh" || die "copy the runner"
chmod +x "$OUT/run.sh" "$OUT/bin/"*

# ---- 3. shared libraries -------------------------------------------------------------
# A bare Debian/Ubuntu base has glibc; every other library travels.
is_system_lib() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|\
    librt.so.*|libresolv.so.*|libutil.so.*|libanl.so.*) return 0 ;;
  esac
  return 1
}
declare -A COPIED=()
for b in "$OUT"/bin/*; do
  [[ "$(head -c 4 "$b" | tail -c 3)" == ELF ]] || continue
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" && -n "$path" && "$path" != "not" ]] || continue
    is_system_lib "$name" && continue
    [[ -n "${COPIED[$name]:-}" ]] && continue
    dest="$OUT/lib"
    case "$name" in libstdc++.so.*|libgcc_s.so.*) dest="$OUT/lib/cxx" ;; esac
    mkdir -p "$dest"
    cp -L "$path" "$dest/$name" || die "copy $path"
    strip --strip-debug "$dest/$name" 2>/dev/null || true
    COPIED[$name]=1
  done < <(ldd "$b" 2>/dev/null)
  if ldd "$b" 2>/dev/null | grep -q "not found"; then
    die "$(basename "$b"): $(ldd "$b" | grep 'not found' | head -1)"
  fi
done

# ---- 4. manifest -------------------------------------------------------------------------
# The newest glibc symbol version each part needs. The C++ runtime (lib/cxx)
# is listed apart: the runner uses it only where the machine's glibc is new
# enough, and the machine's own libstdc++ otherwise.
newest_glibc() {
  for f in "$@"; do [[ -f "$f" ]] && objdump -T "$f" 2>/dev/null; done |
    grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n -u | tail -1
}
glibc_needed="$(newest_glibc "$OUT"/bin/* "$OUT"/lib/*.so*)"
glibc_needed_cxx="$(newest_glibc "$OUT"/lib/cxx/*)"
{
  echo "radixkv GPU check bundle"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "source: $ROOT"
  echo "build: $BUILD ($(grep -E '^CMAKE_BUILD_TYPE:' "$BUILD/CMakeCache.txt" | cut -d= -f2))"
  echo "cuda: $CUDA ($(grep -E '^CMAKE_CUDA_ARCHITECTURES:' "$BUILD/CMakeCache.txt" | cut -d= -f2))"
  echo "glibc_needed: ${glibc_needed#GLIBC_}"
  echo "glibc_needed_cxx: ${glibc_needed_cxx#GLIBC_}"
  echo "gpu tests: $(tr '\n' ' ' <"$OUT/tests.txt")"
  echo "libraries: ${#COPIED[@]}"
} >"$OUT/MANIFEST"

# ---- 5. size -------------------------------------------------------------------------------
kib="$(du -sk "$OUT" | cut -f1)"
say "bundle $OUT: $((kib / 1024)) MiB ($(ls "$OUT/bin" | wc -l) programs," \
    "${#COPIED[@]} libraries, glibc >= ${glibc_needed#GLIBC_})"
if [[ $kib -gt $((MAX_MIB * 1024)) ]]; then
  echo "gpu_bundle: FAIL: $((kib / 1024)) MiB exceeds --max-mib $MAX_MIB" >&2
  exit 2
fi
say "run it with: $OUT/run.sh"
