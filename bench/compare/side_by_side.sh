#!/usr/bin/env bash
# Side-by-side measurements of the targets in docs/BENCHMARKS.md, in one
# run, on this machine:
#
#  (a) radixkvd Acquire vs the same daemon's empty handler
#      (grpc.health.v1.Health/Check), same load generator (bench/compare
#      loadgen), same connections: throughput ratio (target >= 80 %); then
#      Acquire p99 at an offered 10,000 req/s from 64 clients (target <= 1 ms).
#      Cached-prompt Acquires are measured both ways a worker can end its
#      lease: a Release call after each Acquire, and the previous lease
#      ended inside the next Acquire (release_leases; what radixkv::Client
#      does for a dropped Lease), one RPC per request.
#  (b) radixkv Match of a 128-block prompt vs a Redis-backed prefix index
#      (Redis 7 on a unix socket, 128 block keys stored as Redis keys, one
#      lookup = 128 pipelined EXISTS, driven by redis-benchmark -P 128), same
#      concurrency: lookups/s each and the ratio (target >= 3x). h2load
#      (nghttp2) repeats the radixkv side as an independent load generator.
#      A second row sends the same Match in key mode (the 128 keys computed
#      by the client, in block_keys_packed) to a second daemon started with
#      --allow_key_mode: the like-for-like comparison with Redis, whose
#      client also sends hashed keys. Both rows are repeated with the same
#      number of concurrent lookups multiplexed as HTTP/2 streams over
#      fewer connections (LOOKUP_STREAMS per connection), as one gRPC
#      channel per worker carries them; Redis has no equivalent short of
#      pipelining, which the 128 EXISTS already use. The same daemon's empty
#      handler at both shapes gives the transport's ceiling: the most any
#      gRPC lookup could reach there, and so the best ratio possible.
#  (c) in-process hash+match, eviction and index memory (inproc_figures),
#      printed next to the anchors' PUBLISHED figures (not measured here).
#
#   bench/compare/side_by_side.sh [BUILD_DIR]
#
# Environment: DURATION (s per measurement, default 5), CONNS/INFLIGHT for
# (a) saturation (default 4 x 16), SHORT_BLOCKS (a second, short prompt for
# (a), default 8 blocks), LOOKUP_CONC for (b) (default 16), LOOKUP_STREAMS
# (streams per connection for (b)'s multiplexed rows, default 4),
# OUT (a JSON-lines file for the results; default $WORK/results.jsonl),
# LOADGEN_FLAGS (loadgen flags for every radixkv measurement; default
# "--tokens_le --pages_le", the wire form radixkv::Client uses; set it empty
# for the plain `tokens` / `pages` fields, or e.g. to --key_mode, which
# needs RADIXKVD_FLAGS=--allow_key_mode), RADIXKVD_FLAGS.
# Everything runs on loopback/unix sockets under /tmp and is stopped on exit.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$repo/build}
build=$(cd "$build" && pwd)
duration=${DURATION:-5}
conns=${CONNS:-4}
inflight=${INFLIGHT:-16}
lookup_conc=${LOOKUP_CONC:-16}
lookup_streams=${LOOKUP_STREAMS:-4}
lookup_mux_conns=$(( lookup_conc / lookup_streams > 0 ? lookup_conc / lookup_streams : 1 ))
prompt_blocks=128
short_blocks=${SHORT_BLOCKS:-8}
page_size=16

radixkvd=$build/daemon/radixkvd
loadgen=$build/bench/compare/loadgen
figures=$build/bench/compare/inproc_figures
for b in "$radixkvd" "$loadgen" "$figures"; do
  [ -x "$b" ] || { echo "Error: $b not built" >&2; exit 3; }
done
for t in redis-server redis-cli redis-benchmark; do
  command -v "$t" >/dev/null || { echo "Error: $t missing (apt-get install redis-server redis-tools)" >&2; exit 3; }
done

work=$(mktemp -d /tmp/rkvc.XXXXXX)
out=${OUT:-$work/results.jsonl}
: >"$out"
dsock=$work/d.sock
rsock=$work/r.sock
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

wait_sock() {  # path pid
  for _ in $(seq 1 300); do
    [ -S "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { echo "Error: process $2 died; see $work" >&2; exit 1; }
    sleep 0.1
  done
  echo "Error: $1 did not appear" >&2; exit 1
}

json_field() {  # json key
  /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"
}

echo "# side_by_side: $(date -u +%F) on $(nproc) cores ($(uname -r)); daemon, load generators and Redis share these cores"
read -r -a extra_flags <<<"${LOADGEN_FLAGS---tokens_le --pages_le}"
echo "# loadgen flags for radixkv: ${extra_flags[*]:-(none: plain tokens / pages fields)}"
read -r -a daemon_flags <<<"${RADIXKVD_FLAGS:-}"
"$radixkvd" --socket="$dsock" --metrics_listen= --pool=none,pages=100000 \
  "${daemon_flags[@]}" >"$work/radixkvd.log" 2>&1 &
pids+=($!)
wait_sock "$dsock" "${pids[-1]}"
redis-server --port 0 --unixsocket "$rsock" --unixsocketperm 700 --save '' \
  --appendonly no --daemonize no >"$work/redis.log" 2>&1 &
pids+=($!)
wait_sock "$rsock" "${pids[-1]}"

lg() { "$loadgen" --endpoint="unix:$dsock" --duration="$duration" --warmup=1 --json "${extra_flags[@]}" "$@"; }

echo
echo "## (a) Acquire vs empty handler (loadgen, $conns connections x $inflight in flight, closed loop)"
health=$(lg --method=health --connections="$conns" --inflight="$inflight" --label=empty_handler)
echo "$health" >>"$out"
acquire=$(lg --method=acquire --connections="$conns" --inflight="$inflight" \
  --prompt_blocks=$prompt_blocks --page_size=$page_size --label=acquire_saturation)
echo "$acquire" >>"$out"
acquire1=$(lg --method=acquire --release_in_acquire --connections="$conns" --inflight="$inflight" \
  --prompt_blocks=$prompt_blocks --page_size=$page_size --label=acquire_one_rpc_saturation)
echo "$acquire1" >>"$out"
miss=$(lg --method=acquire_miss --connections="$conns" --inflight="$inflight" \
  --prompt_blocks=$prompt_blocks --page_size=$page_size --label=acquire_miss_saturation)
echo "$miss" >>"$out"
short=$(lg --method=acquire_miss --connections="$conns" --inflight="$inflight" \
  --prompt_blocks="$short_blocks" --page_size=$page_size --label=acquire_miss_short_saturation)
echo "$short" >>"$out"
/usr/bin/python3 - "$health" "$acquire" "$miss" "$short" "$prompt_blocks" "$short_blocks" "$acquire1" <<'EOF'
import json, sys
h, a, m, s = (json.loads(x) for x in sys.argv[1:5])
long_blocks, short_blocks = sys.argv[5], sys.argv[6]
a1 = json.loads(sys.argv[7])
print("empty handler (Health/Check)   %9.0f req/s  p50 %6.0f us  p99 %6.0f us  errors %d"
      % (h["requests_per_second"], h["p50_us"], h["p99_us"], h["errors"]))
print("Acquire hit + Release          %9.0f Acquire/s (%.0f rpc/s)  p50 %6.0f us  p99 %6.0f us  errors %d"
      % (a["requests_per_second"], a["rpcs_per_second"], a["p50_us"], a["p99_us"], a["errors"]))
print("Acquire hit, release in next   %9.0f Acquire/s (one RPC each)  p50 %6.0f us  p99 %6.0f us  errors %d"
      % (a1["requests_per_second"], a1["p50_us"], a1["p99_us"], a1["errors"]))
print("Acquire miss (no lease)        %9.0f req/s  p50 %6.0f us  p99 %6.0f us  errors %d"
      % (m["requests_per_second"], m["p50_us"], m["p99_us"], m["errors"]))
print("Acquire miss, %3s-block prompt %9.0f req/s  p50 %6.0f us  p99 %6.0f us  errors %d"
      % (short_blocks, s["requests_per_second"], s["p50_us"], s["p99_us"], s["errors"]))
hr = h["requests_per_second"]
print("ratio Acquire-hit rpc/s / empty : %.1f %%   (each Acquire is followed by its Release)" % (100 * a["rpcs_per_second"] / hr))
print("ratio Acquire-hit /s    / empty : %.1f %%   (Acquire calls only)" % (100 * a["requests_per_second"] / hr))
print("ratio Acquire-hit, one RPC each / empty : %.1f %%   target >= 80 %%  (release_leases)" % (100 * a1["requests_per_second"] / hr))
print("ratio Acquire-miss      / empty : %.1f %%   target >= 80 %%  (%s-block prompt)" % (100 * m["requests_per_second"] / hr, long_blocks))
print("ratio Acquire-miss      / empty : %.1f %%   target >= 80 %%  (%s-block prompt)" % (100 * s["requests_per_second"] / hr, short_blocks))
EOF

echo
echo "## (a) Acquire latency at an offered 10,000 req/s from 64 clients (open loop)"
open=$(lg --method=acquire --connections=64 --rate=10000 \
  --prompt_blocks=$prompt_blocks --page_size=$page_size --label=acquire_10k_64)
echo "$open" >>"$out"
open1=$(lg --method=acquire --release_in_acquire --connections=64 --rate=10000 \
  --prompt_blocks=$prompt_blocks --page_size=$page_size --label=acquire_one_rpc_10k_64)
echo "$open1" >>"$out"
# The same offered load on the empty handler: the machine's own tail.
open_empty=$(lg --method=health --connections=64 --rate=10000 --label=health_10k_64)
echo "$open_empty" >>"$out"
/usr/bin/python3 - "$open" "$open_empty" "$open1" <<'EOF'
import json, sys
for name, o in (("Acquire hit + Release", json.loads(sys.argv[1])),
                ("Acquire hit, one RPC", json.loads(sys.argv[3])),
                ("empty handler", json.loads(sys.argv[2]))):
    print("%-21s offered 10000/s, achieved %.0f/s: p50 %.0f us  p90 %.0f us  p99 %.0f us  p99.9 %.0f us  errors %d"
          % (name, o["requests_per_second"], o["p50_us"], o["p90_us"], o["p99_us"], o["p999_us"], o["errors"]))
print("target: Acquire p99 <= 1000 us")
EOF

echo
echo "## (b) prefix lookup of a $prompt_blocks-block prompt: radixkv Match vs Redis 128 pipelined EXISTS ($lookup_conc concurrent lookups)"
# Redis side: the 128 block keys exist; redis-benchmark's __rand_int__ with
# -r 128 picks among exactly those keys; -P 128 sends one lookup per round trip.
for i in $(seq 0 $((prompt_blocks - 1))); do
  printf 'SET blk:%012d 1\n' "$i"
done | redis-cli -s "$rsock" >/dev/null
keys=$(redis-cli -s "$rsock" DBSIZE)
[ "$keys" -eq "$prompt_blocks" ] || { echo "Error: Redis holds $keys keys, want $prompt_blocks" >&2; exit 1; }
# Size the run to roughly DURATION seconds from a short probe.
probe=$(redis-benchmark -s "$rsock" -c "$lookup_conc" -P $prompt_blocks -n 256000 -r $prompt_blocks --csv \
  EXISTS blk:__rand_int__ | tail -1 | cut -d, -f2 | tr -d '"')
n=$(/usr/bin/python3 -c "import sys; print(max(256000, int(float(sys.argv[1]) * $duration) // 128 * 128))" "$probe")
redis_rps=$(redis-benchmark -s "$rsock" -c "$lookup_conc" -P $prompt_blocks -n "$n" -r $prompt_blocks --csv \
  EXISTS blk:__rand_int__ | tail -1 | cut -d, -f2 | tr -d '"')
match=$(lg --method=match --connections="$lookup_conc" --inflight=1 \
  --prompt_blocks=$prompt_blocks --page_size=$page_size --label=match_vs_redis)
echo "$match" >>"$out"
echo "{\"label\": \"redis_exists_pipelined\", \"exists_per_second\": $redis_rps, \"lookups_per_second\": $(/usr/bin/python3 -c "print(round($redis_rps / $prompt_blocks, 1))")}" >>"$out"
# Independent generator for the radixkv side: h2load with a pre-framed body.
h2=""
if command -v h2load >/dev/null; then
  "$loadgen" --endpoint="unix:$dsock" --method=match --connections=1 "${extra_flags[@]}" \
    --prompt_blocks=$prompt_blocks --page_size=$page_size --write_body="$work/match.bin"
  h2n=$(/usr/bin/python3 -c "import json,sys; print(max(20000, int(json.loads(sys.argv[1])['requests_per_second'] * $duration)))" "$match")
  h2=$(h2load --base-uri="unix:$dsock" -c "$lookup_conc" -m 1 -n "$h2n" -d "$work/match.bin" \
    -H 'content-type: application/grpc' -H 'te: trailers' \
    http://localhost/radixkv.v1.KvCache/Match 2>&1 | awk '/^finished in/ {print $4}' | tr -d ',')
fi
# Key mode: a second daemon that accepts keys (the first keeps the default
# token-verified mode), the prompt cached there by loadgen's setup, Match
# bodies with block_keys_packed, same concurrency as the tokens row.
ksock=$work/k.sock
"$radixkvd" --socket="$ksock" --metrics_listen= --pool=none,pages=100000 \
  --allow_key_mode "${daemon_flags[@]}" >"$work/radixkvd_keys.log" 2>&1 &
pids+=($!)
wait_sock "$ksock" "${pids[-1]}"
kmatch=$("$loadgen" --endpoint="unix:$ksock" --duration="$duration" --warmup=1 --json \
  "${extra_flags[@]}" --packed_keys --method=match --connections="$lookup_conc" --inflight=1 \
  --prompt_blocks=$prompt_blocks --page_size=$page_size --label=match_packed_keys_vs_redis)
echo "$kmatch" >>"$out"
# The same concurrency as HTTP/2 streams over fewer connections.
mux=$(lg --method=match --connections="$lookup_mux_conns" --inflight="$lookup_streams" \
  --prompt_blocks=$prompt_blocks --page_size=$page_size --label=match_vs_redis_mux)
echo "$mux" >>"$out"
kmux=$("$loadgen" --endpoint="unix:$ksock" --duration="$duration" --warmup=1 --json \
  "${extra_flags[@]}" --packed_keys --method=match --connections="$lookup_mux_conns" \
  --inflight="$lookup_streams" --prompt_blocks=$prompt_blocks --page_size=$page_size \
  --label=match_packed_keys_vs_redis_mux)
echo "$kmux" >>"$out"
# The transport's ceiling at each shape: the same daemon's empty handler
# driven like the lookups. No Match can beat it, so it bounds the ratio.
hshape=$(lg --method=health --connections="$lookup_conc" --inflight=1 --label=health_lookup_shape)
echo "$hshape" >>"$out"
hmux=$(lg --method=health --connections="$lookup_mux_conns" --inflight="$lookup_streams" \
  --label=health_lookup_shape_mux)
echo "$hmux" >>"$out"
/usr/bin/python3 - "$match" "$redis_rps" "${h2:-}" "$prompt_blocks" "$out" "$kmatch" "$mux" "$kmux" "$lookup_mux_conns" "$lookup_streams" "$hshape" "$hmux" "$lookup_conc" <<'EOF'
import json, sys
m = json.loads(sys.argv[1]); redis_exists = float(sys.argv[2]); h2 = sys.argv[3]
blocks = int(sys.argv[4]); k = json.loads(sys.argv[6])
mux = json.loads(sys.argv[7]); kmux = json.loads(sys.argv[8])
mux_shape = "%s connections x %s streams" % (sys.argv[9], sys.argv[10])
redis_lookups = redis_exists / blocks
print("Redis 7, %d pipelined EXISTS      %9.0f lookups/s (%.0f EXISTS/s)" % (blocks, redis_lookups, redis_exists))
print("radixkv Match (loadgen)          %9.0f lookups/s  p50 %.0f us  p99 %.0f us  errors %d"
      % (m["requests_per_second"], m["p50_us"], m["p99_us"], m["errors"]))
print("ratio radixkv / Redis (loadgen)  : %.2fx   target >= 3x" % (m["requests_per_second"] / redis_lookups))
if h2:
    h2v = float(h2)
    print("radixkv Match (h2load)           %9.0f lookups/s   ratio %.2fx (HTTP status only; grpc-status unchecked)" % (h2v, h2v / redis_lookups))
    with open(sys.argv[5], "a") as f:
        f.write(json.dumps({"label": "match_h2load", "requests_per_second": h2v}) + "\n")
print("radixkv Match, key mode (block_keys_packed, loadgen) %9.0f lookups/s  p50 %.0f us  p99 %.0f us  errors %d"
      % (k["requests_per_second"], k["p50_us"], k["p99_us"], k["errors"]))
print("ratio Match, key mode (block_keys_packed) / Redis : %.2fx   target >= 3x" % (k["requests_per_second"] / redis_lookups))
for name, r in (("tokens", mux), ("key mode", kmux)):
    print("radixkv Match, %-8s, %s %9.0f lookups/s  p99 %.0f us  errors %d  ratio %.2fx"
          % (name, mux_shape, r["requests_per_second"], r["p99_us"], r["errors"],
             r["requests_per_second"] / redis_lookups))
for shape, h, ms in (("%s connections x 1 call" % sys.argv[13], json.loads(sys.argv[11]), (m, k)),
                     (mux_shape, json.loads(sys.argv[12]), (mux, kmux))):
    print("ceiling: empty handler, %s %9.0f calls/s = %.2fx Redis; Match tokens / key mode reach %.0f %% / %.0f %% of it"
          % (shape, h["requests_per_second"], h["requests_per_second"] / redis_lookups,
             100 * ms[0]["requests_per_second"] / h["requests_per_second"],
             100 * ms[1]["requests_per_second"] / h["requests_per_second"]))
EOF

echo
echo "## (c) in-process figures (measured here) next to PUBLISHED anchor figures (not measured side by side)"
fig=$("$figures" --json)
echo "$fig" >>"$out"
/usr/bin/python3 - "$fig" <<'EOF'
import json, sys
f = json.loads(sys.argv[1])
print("measured  radixkv hash+match (XXH3-128 chain + Match, 1 thread): %.0f M tokens/s, %d-token prompt, page_size %d"
      % (f["hash_match_tokens_per_s"] / 1e6, f["prompt_tokens"], f["page_size"]))
print("measured  radixkv walk+match (the daemon's Acquire path for cached blocks: token comparison, no hashing): %.0f M tokens/s"
      % (f["walk_match_tokens_per_s"] / 1e6))
print("measured  radixkv token Match (walk and lookup in one pass): %.0f M tokens/s"
      % (f["match_tokens_tokens_per_s"] / 1e6))
print("measured  radixkv lock hold: 2k-token Acquire hit %.2f us, Match %.2f us (p50); longest Acquire/Commit while filling %.0f us"
      % (f["hold_acquire_hit_p50_us"], f["hold_match_tokens_p50_us"], f["hold_fill_max_us"]))
print("measured  radixkv eviction: %.0f ns per block at %d cached blocks; index %.1f B per block"
      % (f["evict_ns_per_block"], f["cached_blocks"], f["index_bytes_per_block"]))
print("published vLLM hashing (open PR #43789): sha256 31.5 M, xxhash 45.8 M, xxhash+msgpack 80.0 M tokens/s")
print("published vLLM design doc: SHA-256 ~100-200 ns/token; vLLM hasher + block-pool lookup measured at 4.6 M tokens/s on this machine kind")
print("published SGLang eviction: 70-77 ms per evict() at ~41k leaves (open PR #38454); 7 ms -> 0.5 ms after PR #14339")
print("published vLLM eviction: 0.6-1.0 us per block; vLLM ~200-250 B/block, SGLang ~1-1.5 KB/node (estimates)")
EOF
echo
echo "# results: $out ; logs: $work"
# A measurement with failed calls is not a result.
/usr/bin/python3 - "$out" <<'EOF'
import json, sys
bad = [r.get("label", "?") for r in map(json.loads, open(sys.argv[1]))
       if r.get("errors", 0)]
if bad:
    sys.exit("Error: calls failed in: " + ", ".join(bad))
EOF
