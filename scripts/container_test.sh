#!/usr/bin/env bash
# Builds the CPU image (deploy/docker/Dockerfile) with podman and runs the
# Kubernetes layout of deploy/kubernetes with it on this machine:
#   1. a socket directory as kubelet creates it (root:root 0755), handed to
#      radixkv by the DaemonSet's init container command (root, CHOWN and
#      FOWNER only);
#   2. radixkvd as uid 10001 with the ConfigMap's flag file (--flagfile),
#      read-only root, no capabilities, no network, the directory bind-mounted;
#   3. the readiness/liveness probe command (`radixkvctl health` in the
#      daemon's container) succeeds;
#   4. radixkv-worker as uid 10002 with supplementary group 10001 sharing the
#      directory: its first run commits the prompt's blocks, its second run
#      hits them (through the gRPC socket and the attach socket);
#   5. a worker outside group 10001 cannot reach the sockets (its run still
#      completes, with no hits);
#   6. `podman stop` (SIGTERM) drains radixkvd and it exits 0;
#   7. the tiers patch (deploy/kubernetes/patches/tiers.yaml), small: a tier
#      directory as kubelet creates it, handed to radixkv by the patch's init
#      command, radixkvd with the patch's --pool and --tier (8 KiB pages of
#      the tiny model): a second pass over 4 prompts that overflow the pool
#      hits blocks promoted from the tiers;
#   8. after `podman stop`, radixkvd started again on the same tier directory
#      reloads the disk tier's blocks and serves hits from them.
# Not part of ctest (it compiles radixkv inside the image). Run as root:
#   scripts/container_test.sh
# Environment: RADIXKV_CONTAINER_WORK (containers.conf, build log, ccache;
# default /var/tmp/radixkv-container), RADIXKV_CONTAINER_CCACHE (host
# directory mounted into the build as its ccache; default WORK/ccache),
# RADIXKV_IMAGE (tag to build; default localhost/radixkv:test),
# RADIXKV_SKIP_BUILD=1 (reuse an existing image), RADIXKV_CUDA_TOOLKIT=DIR
# (also build VARIANT=cuda, with nvcc and cuBLAS from a local CUDA install
# such as /usr/local/cuda-13.0 turned into CUDA_IMAGE, and check the image).
# podman here needs runc (crun cannot use hybrid cgroups), a containers.conf
# without default ulimits (the sandbox cannot raise RLIMIT_NOFILE), and a
# base image debootstrapped from Debian's archive (no registry is reachable).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=${RADIXKV_CONTAINER_WORK:-/var/tmp/radixkv-container}
image=${RADIXKV_IMAGE:-localhost/radixkv:test}
base=localhost/debian:bookworm-min
name=radixkv-ct-$$
start=$(date +%s)

step() { echo "[$(( $(date +%s) - start ))s] $*"; }
die() { echo "container_test: FAIL: $*" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
  die "run as root (rootful podman; debootstrap)"
fi
need=()
for p in podman runc debootstrap python3-yaml; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  step "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

mkdir -p "$work"
cat > "$work/containers.conf" <<'EOF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$work/containers.conf
pm() { podman --runtime=runc "$@"; }

# --- base image -------------------------------------------------------------
if ! pm image exists "$base"; then
  step "debootstrap bookworm minbase -> $base"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian \
    > "$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap"; }
  tar -C "$work/rootfs" -c . | pm import --quiet - "$base" >/dev/null
  rm -rf "$work/rootfs"
fi

# --- image ------------------------------------------------------------------
ccache_dir=${RADIXKV_CONTAINER_CCACHE:-$work/ccache}
mkdir -p "$ccache_dir"
if [ "${RADIXKV_SKIP_BUILD:-0}" != 1 ] || ! pm image exists "$image"; then
  step "podman build (VARIANT=cpu, ccache $ccache_dir)"
  build_start=$(date +%s)
  # The toolchain stage gets a tag, so that pruning the previous runs'
  # intermediate images below keeps its layers (apt) cached.
  pm build --network=host --format docker -f deploy/docker/Dockerfile \
    --build-arg BASE_IMAGE="$base" --target build-cpu -t localhost/radixkv-build:cpu . \
    > "$work/build.log" 2>&1 ||
    { tail -40 "$work/build.log" >&2; die "podman build --target build-cpu (log: $work/build.log)"; }
  pm build --network=host --format docker -f deploy/docker/Dockerfile \
    --build-arg BASE_IMAGE="$base" --build-arg VARIANT=cpu \
    -v "$ccache_dir:/ccache" -t "$image" . >> "$work/build.log" 2>&1 ||
    { tail -40 "$work/build.log" >&2; die "podman build (log: $work/build.log)"; }
  grep '^build.sh: ccache' "$work/build.log" || true
  pm image prune -f >/dev/null
  step "image built in $(( $(date +%s) - build_start ))s: $(pm image inspect --format '{{.Size}}' "$image") bytes"
fi

# --- cuda variant (optional) --------------------------------------------------
if [ -n "${RADIXKV_CUDA_TOOLKIT:-}" ]; then
  toolkit=$(realpath "$RADIXKV_CUDA_TOOLKIT")
  [ -x "$toolkit/bin/nvcc" ] || die "RADIXKV_CUDA_TOOLKIT=$toolkit has no bin/nvcc"
  step "cuda toolkit image from $toolkit"
  # /usr/local/cuda in the image, as in NVIDIA's devel images; the libraries
  # radixkv does not use stay out.
  tar -C "$(dirname "$toolkit")" -c --transform "s,^$(basename "$toolkit"),usr/local/cuda," \
      --exclude='libcudnn*' --exclude='libcufft*' --exclude='libnccl*' \
      --exclude='libcusparse*' --exclude='libcusolver*' --exclude='libcurand*' \
      --exclude='libnvrtc*' --exclude='libnvperf*' "$(basename "$toolkit")" |
    pm import --quiet - localhost/radixkv-cuda-toolkit:local >/dev/null
  step "podman build (VARIANT=cuda)"
  pm build --network=host --format docker -f deploy/docker/Dockerfile \
    --build-arg BASE_IMAGE="$base" --build-arg VARIANT=cuda \
    --build-arg CUDA_IMAGE=localhost/radixkv-cuda-toolkit:local \
    -v "$ccache_dir:/ccache" -t "$image-cuda" . > "$work/build-cuda.log" 2>&1 ||
    { tail -40 "$work/build-cuda.log" >&2; die "podman build VARIANT=cuda (log: $work/build-cuda.log)"; }
  pm image prune -f >/dev/null
  # Without a GPU the cuda pool must refuse cleanly; cuBLAS must resolve.
  out=$(pm run --rm --network=none --no-healthcheck --entrypoint sh "$image-cuda" -c '
    cat /usr/local/share/radixkv/variant; ldconfig -p | grep -c "libcublas\(Lt\)\?\.so\.13"
    timeout 5 radixkvd --socket=/tmp/s.sock --metrics_listen= --pool=cuda,device=0,bytes=1GiB 2>&1
    echo "exit $?"' 2>&1)
  echo "$out"
  echo "$out" | grep -qx cuda || die "cuda image does not say cuda"
  echo "$out" | grep -qx 2 || die "cuda image lacks libcublas/libcublasLt"
  # No GPU here: a clean refusal (exit 2). With one: still serving at 5 s.
  echo "$out" | grep -q -e 'no CUDA driver/device' -e 'exit 124' ||
    die "radixkvd with a cuda pool neither refused cleanly nor kept serving"
  step "cuda image: $(pm image inspect --format '{{.Size}}' "$image-cuda") bytes"
fi

# --- layout -----------------------------------------------------------------
tmp=$(mktemp -d /tmp/radixkv-ct.XXXXXX)
cleanup() {
  local c
  for c in "$name" "$name-default" "$name-tier" "$name-tier2"; do
    pm rm -f "$c" >/dev/null 2>&1 || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
run_dir=$tmp/run
mkdir -m 0755 "$run_dir"            # what kubelet's DirectoryOrCreate makes
chmod 0755 "$tmp"

# The ConfigMap's flag file, as the DaemonSet mounts it; a smaller pool.
/usr/bin/python3 - "$repo/deploy/kubernetes/configmap.yaml" > "$tmp/radixkvd.flags" <<'EOF'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
sys.stdout.write(doc["data"]["radixkvd.flags"])
EOF
chmod 0644 "$tmp/radixkvd.flags"
# The DaemonSet's init container command, from the manifest.
init_cmd=$(/usr/bin/python3 - "$repo/deploy/kubernetes/daemonset.yaml" <<'EOF'
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))["spec"]["template"]["spec"]
cmd = spec["initContainers"][0]["command"]
assert cmd[:2] == ["sh", "-c"], cmd
print(cmd[2])
EOF
)
# As the manifests' securityContext: no capabilities, no privilege
# escalation, read-only root without podman's writable /tmp and /run.
# (podman cannot schedule the image's HEALTHCHECK without systemd; the probe
# command runs below instead.)
hardening=(--network=none --cap-drop=all --security-opt=no-new-privileges
           --read-only --read-only-tmpfs=false --no-healthcheck)

step "init container: $init_cmd"
pm run --rm "${hardening[@]}" --user 0:0 --cap-add=CHOWN --cap-add=FOWNER \
  -v "$run_dir:/run/radixkv" --entrypoint sh "$image" -c "$init_cmd"
mode=$(stat -c '%u:%g %a' "$run_dir")
[ "$mode" = "10001:10001 750" ] || die "socket directory is $mode, want 10001:10001 750"

step "radixkvd (uid 10001, --flagfile from the ConfigMap)"
pm run -d --name "$name" "${hardening[@]}" --user 10001:10001 \
  -v "$run_dir:/run/radixkv" -v "$tmp/radixkvd.flags:/etc/radixkv/radixkvd.flags:ro" \
  --entrypoint radixkvd "$image" --flagfile=/etc/radixkv/radixkvd.flags \
  --pool=host,bytes=256MiB >/dev/null

probe=(radixkvctl --endpoint=unix:/run/radixkv/radixkvd.sock --timeout=2s health)
wait_healthy() {  # wait_healthy CONTAINER: the probe succeeds within 30 s
  local _
  for _ in $(seq 1 60); do
    if pm exec "$1" "${probe[@]}" >/dev/null 2>&1; then return 0; fi
    [ "$(pm inspect --format '{{.State.Running}}' "$1")" = true ] || break
    sleep 0.5
  done
  pm logs "$1" >&2 || true
  return 1
}
# stop_exit0 CONTAINER: `podman stop` (SIGTERM) and radixkvd exits 0.
stop_exit0() {
  pm stop -t 30 "$1" >/dev/null
  local code
  code=$(pm inspect --format '{{.State.ExitCode}}' "$1")
  [ "$code" = 0 ] || { pm logs "$1" 2>&1 | tail -4 >&2; die "$1 exited $code after SIGTERM"; }
}
wait_healthy "$name" || die "radixkvd did not become healthy"
step "probe in the container: $(pm exec "$name" "${probe[@]}")"
ls -ln "$run_dir"

printf '%s\n' "The node cache keeps every prompt prefix that a worker on the node has computed, so that the next worker with the same prefix reads its KV blocks from the shared pool and prefills only the rest of its prompt." \
  > "$tmp/prompt.txt"
chmod 0644 "$tmp/prompt.txt"
worker() {  # worker --text|--prompts FILE UID GROUP_ADD...: one JSON line a prompt
  local input=$1 file=$2 uid=$3; shift 3
  local groups=()
  for g in "$@"; do groups+=(--group-add "$g"); done
  pm run --rm "${hardening[@]}" --user "$uid:$uid" "${groups[@]}" \
    -v "$run_dir:/run/radixkv" -v "$file:/prompts:ro" -e RADIXKV_THREADS=1 \
    --entrypoint radixkv-worker "$image" run "$input" /prompts --model tiny --decode 4 \
    --json --endpoint unix:/run/radixkv/radixkvd.sock --timeout 5s
}
field() { /usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())[sys.argv[1]])' "$1"; }

step "worker uid 10002 (group 10001), first run"
first=$(worker --text "$tmp/prompt.txt" 10002 10001) || die "worker run 1"
echo "$first"
step "worker uid 10003 (group 10001), second run"
second=$(worker --text "$tmp/prompt.txt" 10003 10001) || die "worker run 2"
echo "$second"
[ "$(echo "$first" | field matched_tokens)" = 0 ] || die "first run should miss"
[ "$(echo "$first" | field committed_blocks)" -gt 0 ] || die "first run committed nothing"
hits=$(echo "$second" | field matched_tokens)
[ "$hits" -gt 0 ] || die "second run got no hits"
[ "$(echo "$second" | field tokens)" = "$(echo "$first" | field tokens)" ] || die "token counts differ"

step "worker uid 10004 without group 10001"
outsider_err=$tmp/outsider.err
outsider=$(worker --text "$tmp/prompt.txt" 10004 2>"$outsider_err") || { cat "$outsider_err" >&2; die "outsider run failed"; }
echo "$outsider"
grep -v 'device auto' "$outsider_err" | head -3 || true
[ "$(echo "$outsider" | field matched_tokens)" = 0 ] || die "a worker outside group 10001 got hits"

pm exec "$name" radixkvctl --endpoint=unix:/run/radixkv/radixkvd.sock stats || true

step "podman stop (SIGTERM)"
pm stop -t 30 "$name" >/dev/null
code=$(pm inspect --format '{{.State.ExitCode}}' "$name")
pm logs "$name" 2>&1 | tail -4
[ "$code" = 0 ] || die "radixkvd exited $code after SIGTERM"

step "the image's own entry point and arguments (docker run IMAGE --pool=...)"
pm run -d --name "$name-default" "${hardening[@]}" -v "$run_dir:/run/radixkv" \
  "$image" --pool=host,bytes=64MiB >/dev/null
wait_healthy "$name-default" || die "the default entry point did not become healthy"
stop_exit0 "$name-default"

# --- tiers (deploy/kubernetes/patches/tiers.yaml) -----------------------------
# The patch's ops applied to the DaemonSet: its init command, its tier
# directory mount and radixkvd's arguments, with the sizes made small: a pool
# of 16 pages and a host tier of 6 pages of the tiny model (8 KiB), so that 4
# prompts of 8 blocks overflow both and reach the disk tier, and a 4 MiB tier
# file. Printed one a line: init command, mount path, arguments.
layout=$(/usr/bin/python3 - "$repo/deploy/kubernetes/daemonset.yaml" \
    "$repo/deploy/kubernetes/patches/tiers.yaml" <<'EOF'
import sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))["spec"]["template"]["spec"]
args = list(spec["containers"][0]["args"])
init_cmd = mount = None
for op in yaml.safe_load(open(sys.argv[2])):
    path = op["path"].removeprefix("/spec/template/spec/")
    if op["op"] == "test":
        continue
    if path.startswith("containers/0/args/"):
        assert op["op"] == "add", op
        at = path.rsplit("/", 1)[1]
        args.append(op["value"]) if at == "-" else args.insert(int(at), op["value"])
    elif path == "initContainers/0/command":
        assert op["value"][:2] == ["sh", "-c"], op
        init_cmd = op["value"][2]
    elif path == "containers/0/volumeMounts/-" and op["value"]["name"] == "tier":
        mount = op["value"]["mountPath"]
PAGE = 8192
def shrink(arg):
    flag, _, value = arg.partition("=")
    if flag not in ("--pool", "--tier"):
        return arg
    out = []
    for part in value.split(";"):
        kind, *kvs = part.split(",")
        kv = dict(x.split("=", 1) for x in kvs)
        if flag == "--pool":
            kv.update(bytes=str(16 * PAGE), page_bytes="8KiB")
        elif kind == "host":
            kv["bytes"] = str(6 * PAGE)
        else:
            assert kind == "disk" and kv["path"] == mount, (part, mount)
            kv["bytes"] = "4MiB"
        out.append(",".join([kind] + [f"{k}={v}" for k, v in kv.items()]))
    return flag + "=" + ";".join(out)
args = [shrink(a) for a in args]
tier = [a for a in args if a.startswith("--tier=")]
assert init_cmd and mount and len(tier) == 1, (init_cmd, mount, args)
assert [p.split(",")[0] for p in tier[0][7:].split(";")] == ["host", "disk"], tier
print(init_cmd, mount, *args, sep="\n")
EOF
) || die "cannot read the tiers patch"
mapfile -t layout <<< "$layout"
tier_init=${layout[0]}
tier_mount=${layout[1]}
tier_args=("${layout[@]:2}")
tier_dir=$tmp/tier
mkdir -m 0755 "$tier_dir"            # what kubelet's DirectoryOrCreate makes

step "tiers patch: init container: $tier_init"
pm run --rm "${hardening[@]}" --user 0:0 --cap-add=CHOWN --cap-add=FOWNER \
  -v "$run_dir:/run/radixkv" -v "$tier_dir:$tier_mount" --entrypoint sh "$image" -c "$tier_init"
mode=$(stat -c '%u:%g %a' "$tier_dir")
[ "$mode" = "10001:10001 700" ] || die "tier directory is $mode, want 10001:10001 700"

tier_daemon() {  # tier_daemon CONTAINER: radixkvd with the patch's layout
  pm run -d --name "$1" "${hardening[@]}" --user 10001:10001 \
    -v "$run_dir:/run/radixkv" -v "$tmp/radixkvd.flags:/etc/radixkv/radixkvd.flags:ro" \
    -v "$tier_dir:$tier_mount" --entrypoint radixkvd "$image" "${tier_args[@]}" >/dev/null
  wait_healthy "$1" || die "radixkvd with tiers ($1) did not become healthy"
}
ctl() { pm exec "$1" radixkvctl --endpoint=unix:/run/radixkv/radixkvd.sock "${@:2}"; }
matched() {  # the matched_tokens of each JSON line on stdin
  /usr/bin/python3 -c 'import json,sys; print(*(json.loads(l)["matched_tokens"] for l in sys.stdin))'
}
# tier_stats MODE: checks `radixkvctl stats -o json` on stdin. promoted:
# both tiers took blocks and the disk tier promoted some; prints the disk
# tier's blocks. reloaded=N: the host tier is empty and the disk tier
# reloaded N blocks or more (every slot of the file with a valid header,
# which may include blocks promoted before the stop); prints how many.
tier_stats() {
  /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)["stats"]
t = {x["kind"]: x for x in s["tiers"]}
def n(kind, field):
    camel = field.split("_")[0] + "".join(w.title() for w in field.split("_")[1:])
    return int(t[kind].get(field, t[kind].get(camel, 0)))
mode = sys.argv[1]
assert list(t) == ["host", "disk"], list(t)
assert s.get("invariants_ok", s.get("invariantsOk")), "invariants violated"
if mode == "promoted":
    assert n("host", "demoted_blocks") > 0, t["host"]
    assert n("disk", "demoted_blocks") > 0 and n("disk", "promoted_blocks") > 0, t["disk"]
    print(n("disk", "blocks"))
else:
    want = int(mode.split("=")[1])
    assert n("host", "blocks") == 0, t["host"]
    assert n("disk", "reloaded_blocks") >= want > 0, (want, t["disk"])
    print(n("disk", "reloaded_blocks"))' "$1"
}

/usr/bin/python3 - > "$tmp/prompts.txt" <<'EOF'
for i in range(4):  # tests/daemon/tiers/test_tiers.py's prompts: 128 tokens each
    print(" ".join(str((7 * i + 13 * j) % 500 + 1) for j in range(128)))
EOF
chmod 0644 "$tmp/prompts.txt"

step "radixkvd with the tiers patch: ${tier_args[*]:1}"
tier_daemon "$name-tier"
pass1=$(worker --prompts "$tmp/prompts.txt" 10002 10001) || die "tiers: worker pass 1"
pass2=$(worker --prompts "$tmp/prompts.txt" 10002 10001) || die "tiers: worker pass 2"
step "tiers: matched tokens, pass 1: $(echo "$pass1" | matched); pass 2: $(echo "$pass2" | matched)"
stats=$(ctl "$name-tier" stats) || die "tiers: radixkvctl stats"
echo "$stats" | grep -E '^(evicted|tier )' || true
{ echo "$stats" | grep -q '^tier host:' && echo "$stats" | grep -q '^tier disk:'; } ||
  die "tiers: stats lacks a tier host or a tier disk line"
[ "$(echo "$pass1" | matched)" = "0 0 0 0" ] || die "tiers: pass 1 should miss"
# Prompts 2 and 3 evicted prompt 0 from the pool: its hits came back up.
[ "$(echo "$pass2" | matched | cut -d' ' -f1)" -ge 112 ] || die "tiers: prompt 0 was not promoted"
on_disk=$(ctl "$name-tier" -o json stats | tier_stats promoted) || die "tiers: stats after pass 2"

step "tiers: podman stop (SIGTERM), then radixkvd again on the same tier directory"
stop_exit0 "$name-tier"
[ "$(stat -c %u "$tier_dir/radixkv-tier.dat")" = 10001 ] || die "no tier file of uid 10001"
tier_daemon "$name-tier2"
ctl "$name-tier2" stats | grep '^tier disk:'
reloaded=$(ctl "$name-tier2" -o json stats | tier_stats "reloaded=$on_disk") ||
  die "tiers: the restarted daemon did not reload the disk tier's $on_disk blocks"
pass3=$(worker --prompts "$tmp/prompts.txt" 10002 10001) || die "tiers: worker after the restart"
reloaded_hits=$(echo "$pass3" | matched)
[ "$(echo "$reloaded_hits" | awk '{s = 0; for (i = 1; i <= NF; i++) s += $i; print s}')" -gt 0 ] ||
  die "tiers: no hits after the restart"
stop_exit0 "$name-tier2"
step "tiers: reloaded $reloaded blocks ($on_disk in the tier at the stop); matched tokens after the restart: $reloaded_hits"

step "PASS: image $image; second run hit $hits tokens; tiers promoted and reloaded blocks; radixkvd exited 0 on SIGTERM"
