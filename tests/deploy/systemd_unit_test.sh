#!/usr/bin/env bash
# deploy/systemd: the unit passes `systemd-analyze verify` (with ExecStart
# pointing at the built radixkvd), carries the settings deployments rely on,
# and `systemd-analyze security --offline=true` rates its exposure below
# MAX_EXPOSURE; the sysusers.d file creates the radixkv user and group.
# Each drop-in beside the unit (a *.conf file with a [Service] section, such
# as tiers.conf) is applied to it as systemd applies drop-ins (the unit in a
# directory with radixkvd.service.d/): verify and the exposure bound hold
# with it, and a drop-in that sets --tier keeps the unit's socket flags,
# fixes the pool's page_bytes, makes the disk tier's directory writable
# (StateDirectory=) and starts the built radixkvd with its command line.
# Usage: systemd_unit_test.sh UNIT SYSUSERS_CONF RADIXKVD
# Exit 77 (ctest: Skipped) when systemd-analyze is not installed.
set -euo pipefail
MAX_EXPOSURE=5.0
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze not installed"; exit 77
fi
unit=$(realpath "$1") sysusers=$(realpath "$2") radixkvd=$3
work=$(mktemp -d /tmp/rkv_systemd.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. verify, against a copy whose ExecStart names the built binary.
copy=$work/radixkvd.service
sed "s|/usr/local/bin/radixkvd|$radixkvd|" "$unit" > "$copy"
grep -q "^ExecStart=$radixkvd " "$copy" || fail "ExecStart is not /usr/local/bin/radixkvd"
[ -x "$radixkvd" ] || fail "$radixkvd is not built"
if ! systemd-analyze verify "$copy" > "$work/verify.txt" 2>&1; then
  cat "$work/verify.txt"; fail "systemd-analyze verify"
fi
if grep radixkvd.service "$work/verify.txt"; then
  fail "systemd-analyze verify warns about the unit"
fi
echo "systemd-analyze verify: OK"

# 2. What deployments and the daemon rely on.
expect() {
  grep -qE -- "$1" "$unit" || fail "$unit has no line matching: $1"
}
expect '^Type=notify$'
expect '^NotifyAccess=main$'
expect '^RestartPreventExitStatus=2$'
expect '^User=radixkv$'
expect '^Group=radixkv$'
expect '^RuntimeDirectory=radixkv$'
expect '^RuntimeDirectoryMode=0750$'
expect '--socket=/run/radixkv/radixkvd\.sock'
expect '--attach_allowed_gids=radixkv'
if grep -qE '^PrivateUsers=(yes|true|1)' "$unit"; then
  fail "PrivateUsers= hides the peers' groups from SO_PEERCRED"
fi
echo "unit settings: OK"

# 3. Exposure (systemd >= 250 rates a unit file offline).
if systemd-analyze security --help 2>&1 | grep -q -- '--offline'; then
  out=$(systemd-analyze security --offline=true "$unit" 2>&1) || {
    echo "$out"; fail "systemd-analyze security"; }
  exposure=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' <<<"$out")
  [ -n "$exposure" ] || { echo "$out"; fail "no exposure level in the output"; }
  echo "systemd-analyze security: exposure $exposure (must be < $MAX_EXPOSURE)"
  if ! awk -v e="$exposure" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(e < m) }'; then
    echo "$out" | grep '✗'; fail "exposure $exposure >= $MAX_EXPOSURE"
  fi
  # The same bound, as systemd itself applies it (tenths).
  systemd-analyze security --offline=true --threshold=49 "$unit" >/dev/null ||
    fail "systemd-analyze security --threshold=49"
else
  echo "systemd-analyze security --offline is not supported here: exposure not rated"
fi

# 4. Drop-ins, applied to the verified copy of the unit.
verify_dir() {  # DIR: a radixkvd.service and its radixkvd.service.d/
  systemd-analyze verify "$1/radixkvd.service" > "$1/verify.txt" 2>&1
}
dropins=()
for f in "$(dirname "$unit")"/*.conf; do
  if [ -f "$f" ] && grep -q '^\[Service\]$' "$f"; then dropins+=("$f"); fi
done
tiered=0
for f in "${dropins[@]}"; do
  name=$(basename "$f")
  d=$work/with-${name%.conf}
  mkdir -p "$d/radixkvd.service.d"
  cp "$copy" "$d/radixkvd.service"
  sed "s|/usr/local/bin/radixkvd|$radixkvd|" "$f" > "$d/radixkvd.service.d/$name"
  if ! verify_dir "$d" || grep radixkvd.service "$d/verify.txt"; then
    cat "$d/verify.txt"; fail "systemd-analyze verify with the drop-in $name"
  fi
  # Control: the same drop-in naming a missing binary must fail, so verify
  # did read it.
  c=$work/control-${name%.conf}
  mkdir -p "$c/radixkvd.service.d"
  cp "$copy" "$c/radixkvd.service"
  sed "s|/usr/local/bin/radixkvd|$work/missing/radixkvd|" "$f" > "$c/radixkvd.service.d/$name"
  if grep -q '^ExecStart=/usr/local/bin/radixkvd' "$f" && verify_dir "$c"; then
    fail "systemd-analyze verify did not read radixkvd.service.d/$name"
  fi
  if systemd-analyze security --help 2>&1 | grep -q -- '--offline'; then
    systemd-analyze security --offline=true --threshold=49 "$d/radixkvd.service" >/dev/null ||
      fail "systemd-analyze security --threshold=49 with the drop-in $name"
    exposure=$(systemd-analyze security --offline=true "$d/radixkvd.service" 2>&1 |
      sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
    echo "drop-in $name: systemd-analyze verify OK, exposure $exposure"
  else
    echo "drop-in $name: systemd-analyze verify OK"
  fi
  grep -q -- '--tier=' "$f" || continue

  # A tier drop-in: the settings, then the built radixkvd with its command
  # line (as systemd splits it), paths moved under $work, sizes made small.
  tiered=1
  dexpect() { grep -v '^[[:space:]]*#' "$f" | grep -qE -- "$1" || fail "$name has no setting matching: $1"; }
  dexpect '^ExecStart=$'
  dexpect '^ExecStart=/usr/local/bin/radixkvd '
  [ "$(grep -n '^ExecStart=$' "$f" | head -1 | cut -d: -f1)" -lt \
    "$(grep -n '^ExecStart=/' "$f" | head -1 | cut -d: -f1)" ] ||
    fail "$name must clear ExecStart= before setting it"
  dexpect '^StateDirectory=radixkv/tier$'
  dexpect '--socket=/run/radixkv/radixkvd\.sock'
  dexpect '--attach_allowed_gids=radixkv'
  dexpect '--pool=(host|cuda),.*page_bytes='
  rm -rf "$work/run" "$work/tier"
  mkdir -p "$work/run" "$work/tier"
  /usr/bin/python3 - "$f" "$radixkvd" "$work" "$(id -g)" > "$work/argv" <<'PY' ||
import re, shlex, sys
unit, radixkvd, work, gid = sys.argv[1:]
text = open(unit).read()
# The last ExecStart=, its backslash-newlines joined, split as systemd does
# for this line (quotes, no specifiers).
cmd = re.findall(r"^ExecStart=(/(?:.*\\\n)*.*)", text, re.M)[-1].replace("\\\n", " ")
assert "%" not in cmd, "specifiers are not expanded here"
argv = shlex.split(cmd)
state = re.search(r"^StateDirectory=(\S+)$", text, re.M).group(1)
tier = [a for a in argv if a.startswith("--tier=")][-1]
disk = re.search(r"disk,path=([^,;]+)", tier).group(1)
if disk != "/var/lib/" + state:
    sys.exit(f"--tier's disk path {disk} is not the StateDirectory /var/lib/{state}")
out = [radixkvd]
for a in argv[1:]:
    a = a.replace(disk, work + "/tier").replace("/run/radixkv/", work + "/run/")
    if a.startswith("--attach_allowed_gids="):
        a = "--attach_allowed_gids=" + gid
    if a.startswith("--metrics_listen="):
        a = "--metrics_listen=127.0.0.1:0"
    if a.startswith(("--pool=", "--tier=")):
        a = re.sub(r"(?<=[=,])bytes=[0-9]+[KMGT]iB", "bytes=64MiB", a)
    out.append(a)
sys.stdout.write("\0".join(out) + "\0")
PY
    fail "$name: its command line"
  mapfile -d '' -t argv < "$work/argv"
  "${argv[@]}" > "$work/tiers.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    grep -q 'radixkvd: ready' "$work/tiers.log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q 'radixkvd: ready' "$work/tiers.log"; then
    kill -KILL "$pid" 2>/dev/null || true; wait "$pid" || true
    cat "$work/tiers.log"; fail "radixkvd with $name's command line did not start"
  fi
  kill -TERM "$pid"
  rc=0; wait "$pid" || rc=$?
  [ "$rc" = 0 ] || { cat "$work/tiers.log"; fail "radixkvd with $name's command line exited $rc on SIGTERM"; }
  grep -q 'tier host: ' "$work/tiers.log" || { cat "$work/tiers.log"; fail "no host tier"; }
  grep -q 'tier disk: ' "$work/tiers.log" || { cat "$work/tiers.log"; fail "no disk tier"; }
  [ -f "$work/tier/radixkv-tier.dat" ] || fail "no tier file in the disk tier's directory"
  echo "drop-in $name: radixkvd started with its tiers and exited 0 on SIGTERM"
done
[ "$tiered" = 1 ] || fail "no drop-in beside the unit sets --tier"

# 5. The user and group, created in an empty root.
if command -v systemd-sysusers >/dev/null; then
  mkdir -p "$work/root/etc"
  systemd-sysusers --root="$work/root" "$sysusers" >/dev/null 2>&1 ||
    fail "systemd-sysusers $sysusers"
  grep -q '^radixkv:' "$work/root/etc/passwd" || fail "no radixkv user"
  grep -q '^radixkv:' "$work/root/etc/group" || fail "no radixkv group"
  echo "systemd-sysusers: OK"
fi
echo OK
