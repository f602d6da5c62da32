#!/usr/bin/env bash
# deploy/systemd: the unit passes `systemd-analyze verify` (with ExecStart
# pointing at the built radixkvd), carries the settings deployments rely on,
# and `systemd-analyze security --offline=true` rates its exposure below
# MAX_EXPOSURE; the sysusers.d file creates the radixkv user and group.
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

# 4. The user and group, created in an empty root.
if command -v systemd-sysusers >/dev/null; then
  mkdir -p "$work/root/etc"
  systemd-sysusers --root="$work/root" "$sysusers" >/dev/null 2>&1 ||
    fail "systemd-sysusers $sysusers"
  grep -q '^radixkv:' "$work/root/etc/passwd" || fail "no radixkv user"
  grep -q '^radixkv:' "$work/root/etc/group" || fail "no radixkv group"
  echo "systemd-sysusers: OK"
fi
echo OK
