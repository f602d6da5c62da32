#!/usr/bin/env bash
# Sets DiskTier promotion (disk_tier_bench's Take) beside fio's sequential
# read of a file of the same size in the same directory, and prints the
# ratio (target: promotion >= 70 % of fio's bandwidth).
#
#   bench/tiers/fio_compare.sh DIR [BENCH] [ROUNDS]
#
# DIR     directory on the storage to measure (the files are removed after)
# BENCH   disk_tier_bench binary (default: build/default/bench/tiers/disk_tier_bench)
# ROUNDS  interleaved rounds of fio and the bench (default 3); medians are
#         reported. BLOCKS, PAGE_BYTES, RUNS, IO_THREADS in the environment
#         set the shape (default 32 x 262144 B x 32 runs, 2 I/O threads).
# fio's read uses direct I/O when the filesystem allows it, with psync at
# queue depth 1 (plain sequential read) and io_uring at queue depth 4.
set -euo pipefail

dir=${1:?usage: fio_compare.sh DIR [BENCH] [ROUNDS]}
bench=${2:-build/default/bench/tiers/disk_tier_bench}
rounds=${3:-3}
blocks=${BLOCKS:-32}
page=${PAGE_BYTES:-262144}
runs=${RUNS:-32}
threads=${IO_THREADS:-2}
total=$((blocks * page * runs))
fio_file=radixkv-fio-compare.dat
command -v fio >/dev/null || { echo "fio_compare: fio is not installed" >&2; exit 1; }
[ -x "$bench" ] || { echo "fio_compare: no bench binary at $bench" >&2; exit 1; }
trap 'rm -f "$dir/$fio_file"' EXIT

direct=1
if ! fio --name=probe --directory="$dir" --filename="$fio_file" --size=1m --bs=4k \
     --rw=read --direct=1 --ioengine=psync >/dev/null 2>&1; then
  direct=0
fi

# Sequential-read bandwidth in GB/s of one fio job: $1 = engine, $2 = depth.
fio_read() {
  fio --name=seqread --directory="$dir" --filename="$fio_file" --size="$total" \
      --bs="$page" --rw=read --direct="$direct" --ioengine="$1" --iodepth="$2" \
      --invalidate=1 --output-format=json |
    /usr/bin/python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"] / 1e9))'
}

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

psync=() uring=() promo=() demo=()
for ((r = 1; r <= rounds; r++)); do
  psync+=("$(fio_read psync 1)")
  uring+=("$(fio_read io_uring 4)")
  json=$("$bench" --dir="$dir" --blocks="$blocks" --page_bytes="$page" --runs="$runs" \
                  --io_threads="$threads" --json 2>/dev/null)
  promo+=("$(/usr/bin/python3 -c 'import json,sys; print("%.3f" % json.loads(sys.argv[1])["promotion_gbps"])' "$json")")
  demo+=("$(/usr/bin/python3 -c 'import json,sys; print("%.3f" % json.loads(sys.argv[1])["demotion_gbps"])' "$json")")
  echo "round $r: fio psync qd1 ${psync[-1]} GB/s, fio io_uring qd4 ${uring[-1]} GB/s," \
       "promotion ${promo[-1]} GB/s, demotion ${demo[-1]} GB/s"
done
p=$(median "${psync[@]}") u=$(median "${uring[@]}") t=$(median "${promo[@]}") d=$(median "${demo[@]}")
echo "dir=$dir direct=$direct shape=${runs}x${blocks}x${page}B io_threads=$threads (medians of $rounds)"
echo "fio sequential read: psync qd1 $p GB/s, io_uring qd4 $u GB/s"
echo "disk tier: promotion $t GB/s, demotion $d GB/s"
/usr/bin/python3 -c 'import sys; t,p,u=map(float,sys.argv[1:]); print("promotion / fio psync qd1 = %.0f %%, / fio io_uring qd4 = %.0f %% (target >= 70 %% of sequential read)" % (100*t/p, 100*t/u))' "$t" "$p" "$u"
