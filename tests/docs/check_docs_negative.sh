#!/usr/bin/env bash
# Negative control for scripts/check_docs.py: in a small temporary
# repository it must pass on docs whose references all hold, then fail (exit
# 1) once a doc cites a missing file, a line past a file's end and a heading
# that does not exist, naming each as `file:line: reference: why`.
# Usage: check_docs_negative.sh PATH/TO/check_docs.py
set -u
checker=${1:?usage: $0 PATH/TO/check_docs.py}
python=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- checker output:"; cat "$tmp/out"; exit 1; }

mkdir -p "$tmp/daemon/core" "$tmp/docs" "$tmp/examples"
printf 'int a;\nint b;\nint c;\n' > "$tmp/daemon/core/cache.cc"      # 3 lines
cat > "$tmp/README.md" <<'MD'
# Project

See [the guide](docs/GUIDE.md#running-it) and `daemon/core/cache.cc:3`.
Paths under build/ (`build/default/daemon/radixkvd`), in /tmp (`/tmp/x.sock`)
and URLs (https://example.com/docs/x.md) are not repository paths, nor are
words like client/server.
MD
cat > "$tmp/docs/GUIDE.md" <<'MD'
# Guide

## Running it

The cache is in daemon/core/cache.cc, lines `daemon/core/cache.cc:1-2`.
[Top](../README.md#project), [here](#running-it).
MD

"$python" "$checker" "$tmp" > "$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] || fail "clean docs: exit $rc, expected 0"
grep -qx 'check_docs: 6 references in 2 files, 0 broken' "$tmp/out" ||
  fail "clean docs: summary"

cat >> "$tmp/docs/GUIDE.md" <<'MD'

Broken: `daemon/no_such_file.cc`, daemon/core/cache.cc:4 and
[a heading](../README.md#no-such-heading).
MD

"$python" "$checker" "$tmp" > "$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "broken docs: exit $rc, expected 1"
for line in \
  'docs/GUIDE.md:8: daemon/no_such_file.cc: no such file or directory' \
  'docs/GUIDE.md:8: daemon/core/cache.cc:4: line 4 cited, the file has 3 lines' \
  'docs/GUIDE.md:9: ../README.md#no-such-heading: no heading with anchor #no-such-heading in README.md' \
  'check_docs: 9 references in 2 files, 3 broken'; do
  grep -qxF "$line" "$tmp/out" || fail "missing line: $line"
done
[ "$(wc -l < "$tmp/out")" -eq 4 ] || fail "expected exactly 3 broken references and the summary"
echo "PASS: check_docs passes clean docs and names each broken reference"
