#!/usr/bin/env bash
# The GPU check bundle's assembly and a dry run of its runner (ctest label
# `bundle`), without a device and without a CUDA build: scripts/gpu_bundle.sh
# --cuda off bundles this build directory's CUDA-off binaries (the worker and
# the CPU typed-page test standing in for the gpu tests), then the bundle,
# moved to another directory, runs with a bare environment (no PATH
# additions, no build tree in LD_LIBRARY_PATH). Checks: the bundle is under
# 64 MiB, every library its programs load resolves inside it or to glibc,
# run.sh --dry-run exits 0 and prints its one line per check with the
# device checks skipped; where this build has radixkvd, the bundle carries
# it and the tiers' check runs its host-pool smoke run.
#
# Usage: bundle_test.sh SOURCE_DIR BUILD_DIR
set -u -o pipefail
SRC="$1" BUILD="$2"
WORK="$(mktemp -d /tmp/rkv-bundle-test.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "bundle_test: FAIL: $*"; exit 1; }

"$SRC/scripts/gpu_bundle.sh" --cuda off --no-build --build "$BUILD" \
  --out "$WORK/built" --max-mib 64 || fail "gpu_bundle.sh exited $?"
mv "$WORK/built" "$WORK/moved" || fail "cannot move the bundle"
B="$WORK/moved"
for f in run.sh MANIFEST tests.txt bin/radixkv-worker bin/kv_dtype_table.sh \
         bin/gpu_tier_check.sh; do
  [[ -e "$B/$f" ]] || fail "$f missing from the bundle"
done
[[ $(du -sk "$B" | cut -f1) -le $((64 * 1024)) ]] || fail "bundle above 64 MiB"
# Every library resolves inside the bundle or to the glibc family.
for b in "$B"/bin/*; do
  [[ "$(head -c 4 "$b" | tail -c 3)" == ELF ]] || continue
  while read -r name arrow path _; do
    [[ "$arrow" == "=>" ]] || continue
    [[ "$path" == not ]] && fail "$(basename "$b"): $name not found"
    case "$path" in
      "$B"/lib/*|"$B"/lib/cxx/*) ;;
      */libc.so.*|*/libm.so.*|*/libpthread.so.*|*/libdl.so.*|*/librt.so.*) ;;
      */libresolv.so.*|*/libutil.so.*|*/libanl.so.*) ;;
      *) fail "$(basename "$b") loads $path from outside the bundle" ;;
    esac
  done < <(env -i LD_LIBRARY_PATH="$B/lib:$B/lib/cxx" ldd "$b")
done
out="$(env -i PATH=/usr/bin:/bin HOME="$WORK" "$B/run.sh" --dry-run --logs "$WORK/logs")"
rc=$?
echo "$out"
[[ $rc -eq 0 ]] || fail "run.sh --dry-run exited $rc"
# Which gpu-labelled binaries the bundle carries depends on the build (CUDA
# on or off): at least one, each reported.
grep -qE "^gpu-test:[A-Za-z0-9_]+ +(PASS|SKIP) " <<<"$out" || fail "no gpu-test line"
for check in bundle device cuda-pool-2-processes \
             copy-vs-hbm host-device tier-copy write-kv attention attention-kv-dtypes \
             worker-ttft kv-dtype tier-e2e; do
  grep -qE "^$check +(PASS|SKIP) " <<<"$out" || fail "no PASS/SKIP line for $check"
done
grep -qE "^device +SKIP " <<<"$out" || fail "the device check did not skip"
grep -qE "^worker-ttft +SKIP .*cpu smoke run ok" <<<"$out" || fail "the worker did not run"
if [[ -x "$BUILD/daemon/radixkvd" ]]; then
  [[ -x "$B/bin/radixkvd" ]] || fail "radixkvd missing from the bundle"
  grep -qE "^tier-e2e +SKIP .*host-pool smoke run ok: .*host\+disk ok" <<<"$out" ||
    fail "the tiers' smoke run did not pass"
fi
grep -q "run.sh: OK" <<<"$out" || fail "no OK summary"
echo "bundle_test: OK"
