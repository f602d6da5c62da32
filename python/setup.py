"""Build step of the radixkv package: generates the gRPC stubs.

build_py runs the same generator as python/CMakeLists.txt:
grpcio-tools (`python -m grpc_tools.protoc`, a build requirement in
pyproject.toml, so no system protoc is needed) over
proto/radixkv/v1/radixkv.proto (found two levels up from this file, or in
$RADIXKV_PROTO_DIR), writing radixkv/_pb/radixkv/v1/radixkv_pb2{,_grpc}.py
into the build tree. The
build tree itself lives outside the checkout ($RADIXKV_PY_BUILD_DIR, else
a per-user directory under the system temp dir), so an install leaves the
source tree as it was. Metadata is in pyproject.toml.
"""
import os
import shutil
import subprocess
import sys
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_BASE = os.environ.get("RADIXKV_PY_BUILD_DIR") or os.path.join(
    tempfile.gettempdir(), f"radixkv-python-build-{os.getuid()}")
os.makedirs(BUILD_BASE, exist_ok=True)


class BuildPyWithStubs(build_py):
    """build_py, then protoc into <build_lib>/radixkv/_pb."""

    def run(self):
        # The build tree is shared between builds: start from a clean copy.
        shutil.rmtree(os.path.join(self.build_lib, "radixkv"), ignore_errors=True)
        super().run()
        proto_dir = os.environ.get("RADIXKV_PROTO_DIR") or os.path.join(
            HERE, "..", "proto")
        proto = os.path.join(proto_dir, "radixkv", "v1", "radixkv.proto")
        if not os.path.exists(proto):
            raise RuntimeError(f"radixkv: {proto} not found (set $RADIXKV_PROTO_DIR "
                               "to the checkout's proto/ directory)")
        out = os.path.join(self.build_lib, "radixkv", "_pb")
        os.makedirs(out, exist_ok=True)
        try:
            import grpc_tools  # noqa: F401  (the build requirement)
        except ImportError as e:
            raise RuntimeError(
                "radixkv: grpcio-tools is needed to build the package "
                "(pip installs it in the build environment; with "
                "--no-build-isolation, pip install grpcio-tools first)") from e
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc",
                        f"--proto_path={proto_dir}", f"--python_out={out}",
                        f"--grpc_python_out={out}", proto], check=True)


setup(cmdclass={"build_py": BuildPyWithStubs},
      options={"build": {"build_base": BUILD_BASE},
               "egg_info": {"egg_base": BUILD_BASE}})
