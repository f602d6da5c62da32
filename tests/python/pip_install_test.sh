#!/usr/bin/env bash
# `pip install ./python` and `pip wheel` in a new, empty virtual
# environment, as a vLLM or SGLang user would: no system protoc on PATH (the
# build requirement grpcio-tools generates the stubs), dependencies from
# PyPI. Then the installed package computes the contract's namespace root,
# imports its stubs and the integrations package, and the wheel holds the
# stubs.
# Usage: pip_install_test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/rkv_pip.XXXXXX)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv "$work/venv"
# A PATH without protoc, so that a build step that still called it would fail.
mkdir -p "$work/bin"
for tool in python3 sh bash env uname cc gcc ls rm mktemp; do
  p=$(command -v "$tool" || true)
  [ -n "$p" ] && ln -s "$p" "$work/bin/$tool"
done
export PATH="$work/venv/bin:$work/bin"
export RADIXKV_PY_BUILD_DIR="$work/pybuild"
pip() { "$work/venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install "$src/python"
root=$("$work/venv/bin/python" -c '
import radixkv, radixkv.integrations
print(radixkv.namespace_root(radixkv.NamespaceSpec(page_size=1, tp_size=0)).hex())
assert radixkv.pb.DTYPE_BFLOAT16 > 0
assert hasattr(radixkv.pb_grpc, "KvCacheStub")')
echo "namespace root $root"
[ "$root" = daf19994fffe4bb44f5388196db83209 ] || { echo "FAIL: namespace root $root"; exit 1; }
pip wheel --no-deps -w "$work/wheel" "$src/python"
whl=$(ls "$work"/wheel/radixkv-*.whl)
"$work/venv/bin/python" - "$whl" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for want in ("radixkv/_pb/radixkv/v1/radixkv_pb2.py",
             "radixkv/_pb/radixkv/v1/radixkv_pb2_grpc.py",
             "radixkv/integrations/__init__.py", "radixkv/client.py"):
    assert want in names, f"{want} missing from {sys.argv[1]}: {names}"
print(f"wheel {sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files")
PY
echo "pip install and wheel: ok"
