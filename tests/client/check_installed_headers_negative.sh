#!/usr/bin/env bash
# Negative control for scripts/check_installed_headers.py: on a small
# include tree it must pass when every radixkv header an installed header
# includes is installed, then fail (exit 1) once one includes a header that
# is missing and a private header is installed, naming each.
# Usage: check_installed_headers_negative.sh PATH/TO/check_installed_headers.py
set -u
checker=${1:?usage: $0 PATH/TO/check_installed_headers.py}
python=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- checker output:"; cat "$tmp/out"; exit 1; }

inc=$tmp/include
mkdir -p "$inc/client" "$inc/radix" "$inc/base"
cat > "$inc/client/client.h" <<'H'
#include <cstdint>
#include "absl/status/status.h"
#include "radix/block_key.h"
H
printf '#include "base/dtype.h"\n' > "$inc/radix/block_key.h"
printf '#include <cstdint>\n' > "$inc/base/dtype.h"

"$python" "$checker" "$inc" --absent radix/radix_tree_internal.h \
  > "$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] || fail "closed tree: exit $rc, expected 0"
grep -qx 'check_installed_headers: 3 headers, 0 problems' "$tmp/out" ||
  fail "closed tree: summary"

# radix/block_key.h now includes a header that was not installed, and a
# private header was.
printf '#include "base/dtype.h"\n#include "radix/radix_tree.h"\n' \
  > "$inc/radix/block_key.h"
printf '#include "radix/block_key.h"\n' > "$inc/radix/radix_tree_internal.h"

"$python" "$checker" "$inc" --absent radix/radix_tree_internal.h \
  > "$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "open tree: exit $rc, expected 1"
for line in \
  'radix/block_key.h:2: includes radix/radix_tree.h, which is not installed' \
  'radix/radix_tree_internal.h: private header installed' \
  'check_installed_headers: 4 headers, 2 problems'; do
  grep -qxF "$line" "$tmp/out" || fail "missing line: $line"
done
[ "$(wc -l < "$tmp/out")" -eq 3 ] || fail "expected exactly 2 problems and the summary"
echo "PASS: check_installed_headers passes a closed tree and names each problem"
