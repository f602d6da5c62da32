#!/usr/bin/env bash
# Negative control for scripts/check_test_tree.py: in a small temporary
# tree it must pass while every building source folder has a tests/ folder
# that registers a test, then fail (exit 1) naming the folder once one has
# none, and once one's tests/ CMakeLists.txt registers nothing.
# Usage: check_test_tree_negative.sh PATH/TO/check_test_tree.py
set -u
checker=${1:?usage: $0 PATH/TO/check_test_tree.py}
python=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- checker output:"; cat "$tmp/out"; exit 1; }

mkdir -p "$tmp/radix" "$tmp/daemon/core" "$tmp/tests/radix" "$tmp/tests/daemon/core"
echo 'add_library(radixkv_radix STATIC a.cc)' > "$tmp/radix/CMakeLists.txt"
echo 'add_library(radixkv_core STATIC b.cc)' > "$tmp/daemon/core/CMakeLists.txt"
echo 'add_subdirectory(core)' > "$tmp/daemon/CMakeLists.txt"   # builds nothing
echo 'gtest_discover_tests(radix_test)' > "$tmp/tests/radix/CMakeLists.txt"
echo 'add_test(NAME core COMMAND true)' > "$tmp/tests/daemon/core/CMakeLists.txt"

"$python" "$checker" "$tmp" > "$tmp/out" 2>&1 || fail "mirrored tree: exit $?, expected 0"
grep -q "2 source folders, 0 without tests" "$tmp/out" || fail "mirrored tree: wrong count"

echo 'add_library(radixkv_rpc STATIC c.cc)' > "$tmp/daemon/rpc.txt"
mkdir -p "$tmp/daemon/rpc" && mv "$tmp/daemon/rpc.txt" "$tmp/daemon/rpc/CMakeLists.txt"
"$python" "$checker" "$tmp" > "$tmp/out" 2>&1 && fail "missing tests/daemon/rpc: exit 0, expected 1"
grep -q "MISSING tests/daemon/rpc (for daemon/rpc)" "$tmp/out" || fail "missing folder not named"

mkdir -p "$tmp/tests/daemon/rpc"
echo '# nothing registered' > "$tmp/tests/daemon/rpc/CMakeLists.txt"
"$python" "$checker" "$tmp" > "$tmp/out" 2>&1 && fail "empty tests/daemon/rpc: exit 0, expected 1"
grep -q "NO TESTS tests/daemon/rpc/CMakeLists.txt" "$tmp/out" || fail "empty folder not named"
echo "PASS"
