"""Fixtures of the engine integration tests (tests/integrations/test_*.py).

Environment (tests/integrations/CMakeLists.txt sets it for ctest):
  PYTHONPATH=<build>/python     the radixkv package with generated stubs
  RADIXKVD=<path>               radixkvd, started as child processes here
  RADIXKVCTL=<path>             radixkvctl

Fixtures:
  radixkvd            the radixkvd binary (the test is skipped, with the
                      reason, when $RADIXKVD names no executable)
  daemon_factory      daemon_factory(*flags, pool="host,bytes=64MiB") -> a
                      started rkv_testutil.Daemon on a socket of its own
                      under /tmp; every daemon is stopped and its socket and
                      log removed when the test ends
  daemon              one such daemon with a 64 MiB host pool and
                      --allow_key_mode
  radixkvd_endpoint   the endpoint (socket path) of `daemon`

Daemon (start, stop, stats, wait_stats, pause, resume, log) and
assert_no_leaks come from tests/python/rkv_testutil.py.
"""
import os
import sys

import pytest

_PYTHON_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
if _PYTHON_TESTS not in sys.path:
    sys.path.insert(0, _PYTHON_TESTS)

import rkv_testutil  # noqa: E402
from rkv_testutil import Daemon, assert_no_leaks  # noqa: E402,F401


@pytest.fixture(scope="session")
def radixkvd():
    path = os.environ.get("RADIXKVD", "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"$RADIXKVD ({path!r}) does not name an executable radixkvd "
                    "(run through ctest, or set RADIXKVD=build/default/daemon/radixkvd)")
    return path


@pytest.fixture
def daemon_factory(radixkvd):
    yield from rkv_testutil.daemon_factory(radixkvd)


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory("--allow_key_mode")


@pytest.fixture
def radixkvd_endpoint(daemon):
    return daemon.sock
