#!/usr/bin/env bash
# Negative control for scripts/check_includes.py: on a small fixture project
# (configured here with CMake, so its link graph and compile commands are
# CMake's own) it must pass while every include follows the links, then
# fail (exit 1) once files include a header of a library they do not link
# (directly, through a PRIVATE link of a dependency, from a helper header no
# target owns, from tests/) or an external header their folder's rule
# forbids, naming each as `file:line: includes X (owned by L) but T ...`.
# Usage: check_includes_negative.sh PATH/TO/check_includes.py
set -u
checker=${1:?usage: $0 PATH/TO/check_includes.py}
python=${PYTHON:-/usr/bin/python3}
cmake=${CMAKE:-cmake}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- checker output:"; cat "$tmp/out"; exit 1; }

src=$tmp/src
mkdir -p "$src/base" "$src/radix" "$src/gpu" "$src/daemon/tiers" \
  "$src/daemon/core" "$src/bench/tool" "$src/tests"
cat > "$src/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(fixture LANGUAGES CXX)
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
include_directories(${PROJECT_SOURCE_DIR})
add_subdirectory(base)
add_subdirectory(radix)
add_subdirectory(gpu)
add_subdirectory(daemon)
add_subdirectory(bench)
CM
echo 'add_library(radixkv_base INTERFACE)' > "$src/base/CMakeLists.txt"
cat > "$src/radix/CMakeLists.txt" <<'CM'
add_library(radixkv_radix STATIC block_key.cc)
target_link_libraries(radixkv_radix PUBLIC radixkv_base)
CM
cat > "$src/gpu/CMakeLists.txt" <<'CM'
add_library(radixkv_gpu STATIC pool.cc)
target_link_libraries(radixkv_gpu PUBLIC radixkv_base)
CM
printf 'add_subdirectory(tiers)\nadd_subdirectory(core)\n' \
  > "$src/daemon/CMakeLists.txt"
cat > "$src/daemon/tiers/CMakeLists.txt" <<'CM'
add_library(radixkv_tiers STATIC tier.cc)
target_link_libraries(radixkv_tiers PUBLIC radixkv_gpu PRIVATE radixkv_radix)
CM
cat > "$src/daemon/core/CMakeLists.txt" <<'CM'
add_library(radixkv_core STATIC cache.cc)
target_link_libraries(radixkv_core PUBLIC radixkv_tiers)
CM
echo 'add_subdirectory(tool)' > "$src/bench/CMakeLists.txt"
cat > "$src/bench/tool/CMakeLists.txt" <<'CM'
add_executable(tool tool.cc)
target_link_libraries(tool PRIVATE radixkv_radix)
CM
printf '#include <cstdint>\n' > "$src/base/dtype.h"
printf '#include "base/dtype.h"\n' > "$src/radix/block_key.h"
printf '#include "radix/block_key.h"\n' > "$src/radix/block_key.cc"
printf '#include "base/dtype.h"\n' > "$src/gpu/pool.h"
printf '#include "gpu/pool.h"\n' > "$src/gpu/pool.cc"
printf '#include "gpu/pool.h"\n' > "$src/daemon/tiers/tier.h"
printf '#include "daemon/tiers/tier.h"\n#include "radix/block_key.h"\n' \
  > "$src/daemon/tiers/tier.cc"
printf '#include "daemon/tiers/tier.h"\n#include "gpu/pool.h"\n' \
  > "$src/daemon/core/cache.cc"
printf '#include "radix/block_key.h"\n' > "$src/bench/bench_json.h"
printf '#include "bench/bench_json.h"\n' > "$src/bench/tool/tool.cc"
printf 'int fake;\n' > "$src/tests/fake.h"

gen=()
[ -n "${CMAKE_GENERATOR:-}" ] && gen=(-G "$CMAKE_GENERATOR")
"$cmake" -S "$src" -B "$tmp/build" "${gen[@]}" > "$tmp/out" 2>&1 ||
  fail "configure of the fixture project"

run() {
  "$python" "$checker" --source-dir "$src" --build-dir "$tmp/build" \
    --cmake "$cmake" > "$tmp/out" 2>&1
}
run
rc=$?
[ $rc -eq 0 ] || fail "clean fixture: exit $rc, expected 0"
grep -qx 'check_includes: 9 files, 11 includes, 0 violations' "$tmp/out" ||
  fail "clean fixture: summary"

# gpu does not link radix; core sees radix only through tiers' PRIVATE link;
# the index may not include gRPC; base includes only absl and std; a helper
# header no target owns is checked for the tool that includes it; nothing
# in production includes tests/.
printf '#include "radix/block_key.h"\n' >> "$src/gpu/pool.cc"
printf '#include "radix/block_key.h"\n' >> "$src/daemon/core/cache.cc"
printf '#include "grpcpp/grpcpp.h"\n' >> "$src/radix/block_key.h"
printf '#include "gpu/pool.h"\n' >> "$src/base/dtype.h"
printf '#include "daemon/tiers/tier.h"\n' >> "$src/bench/bench_json.h"
printf '#include "tests/fake.h"\n' >> "$src/daemon/tiers/tier.h"

run
rc=$?
[ $rc -eq 1 ] || fail "bad includes: exit $rc, expected 1"
for line in \
  'gpu/pool.cc:2: includes radix/block_key.h (owned by radixkv_radix) but radixkv_gpu does not link radixkv_radix' \
  'daemon/core/cache.cc:3: includes radix/block_key.h (owned by radixkv_radix) but radixkv_core does not link radixkv_radix' \
  'radix/block_key.h:2: includes grpcpp/grpcpp.h (owned by gRPC) but radixkv_radix must not include it: the index knows nothing of gRPC, protobuf, Prometheus or CUDA' \
  'base/dtype.h:2: includes gpu/pool.h (owned by radixkv_gpu) but radixkv_base must not include it: base uses only Abseil and the standard library' \
  'base/dtype.h:2: includes gpu/pool.h (owned by radixkv_gpu) but radixkv_base does not link radixkv_gpu' \
  'bench/bench_json.h:2: includes daemon/tiers/tier.h (owned by radixkv_tiers) but tool does not link radixkv_tiers' \
  'daemon/tiers/tier.h:2: includes tests/fake.h (owned by tests) but radixkv_tiers does not link tests' \
  'check_includes: 9 files, 16 includes, 7 violations'; do
  grep -qxF "$line" "$tmp/out" || fail "missing line: $line"
done
[ "$(wc -l < "$tmp/out")" -eq 8 ] || fail "expected exactly 7 violations and the summary"
echo "PASS: check_includes passes the fixture and names each bad include"
