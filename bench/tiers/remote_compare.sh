#!/bin/bash
# The shared tier's write and read throughput (remote_tier_bench) beside
# redis-benchmark's SET and GET of values of the same size, against one
# three-shard Redis Cluster started here, as a ratio.
#
#   bench/tiers/remote_compare.sh BUILD_DIR [PAGE_BYTES] [BLOCKS_PER_RUN] [RUNS]
#
# Both sides pipeline the same depth (BLOCKS_PER_RUN commands per round
# trip) over the same number of connections: remote_tier_bench writes on
# its 2 writer threads and reads on one thread; redis-benchmark runs SET
# with -c 2 and GET with -c 1, -P BLOCKS_PER_RUN, values of PAGE_BYTES plus
# the tier's 96-byte header, keys drawn from as many as it sends (-r).
set -euo pipefail
build=${1:?usage: remote_compare.sh BUILD_DIR [PAGE_BYTES] [BLOCKS] [RUNS]}
page=${2:-4096}
blocks=${3:-32}
runs=${4:-512}
here=$(cd "$(dirname "$0")" && pwd)
store=$(mktemp -d /tmp/rkremote.XXXXXX)
trap '/usr/bin/python3 "$here/../../tests/daemon/tiers/redis_store.py" stop "$store"; rm -rf "$store"' EXIT
# Room for every block (the store must not evict what the reads ask for).
RADIXKV_STORE_MAXMEMORY=4gb \
  /usr/bin/python3 "$here/../../tests/daemon/tiers/redis_store.py" start "$store" >/dev/null
addr=$(head -1 "$store/addrs")
pw=$(cat "$store/password")
tier=$("$build/bench/tiers/remote_tier_bench" --addr="$addr" \
  --password_file="$store/password" --page_bytes="$page" --blocks="$blocks" \
  --runs="$runs" --json)
n=$((blocks * runs))
value=$((page + 96))
rb() {  # redis-benchmark's requests per second for test $1 on $2 connections
  redis-benchmark --cluster -h "${addr%:*}" -p "${addr##*:}" -a "$pw" \
    -t "$1" -d "$value" -n "$n" -c "$2" -P "$blocks" -r "$n" --csv 2>/dev/null |
    awk -F, -v t="$(echo "$1" | tr a-z A-Z)" '$1 ~ "\""t"\"" {gsub(/"/,"",$2); print $2}'
}
set_rps=$(rb set 2)
get_rps=$(rb get 1)
/usr/bin/python3 - "$tier" "$set_rps" "$get_rps" <<'PY'
import json, sys
t = json.loads(sys.argv[1])
s, g = float(sys.argv[2]), float(sys.argv[3])
t.update({"redis_benchmark_set_per_s": s, "redis_benchmark_get_per_s": g,
          "write_ratio": round(t["write_blocks_per_s"] / s, 3),
          "read_ratio": round(t["read_blocks_per_s"] / g, 3)})
print(json.dumps(t, sort_keys=True))
PY
