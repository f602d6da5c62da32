"""Shared fixtures of the radixkv Python tests.

Environment (tests/python/CMakeLists.txt sets it for ctest):
  PYTHONPATH=<build>/python     the radixkv package with generated stubs
  RADIXKVD=<path>               radixkvd, for tests that start daemons
  RADIXKVCTL=<path>             radixkvctl, for the `hash` cross-check
  RADIXKV_TEST_DATA=<dir>       tests/data (default: beside this directory)

Fixtures:
  radixkvd, radixkvctl     the binaries (the test is skipped without them)
  vectors                  tests/data/block_key_vectors.json, parsed
  daemon_factory           daemon_factory(*flags, pool=...) -> Daemon; every
                           daemon is stopped at the end of the test
  daemon                   one host-pool daemon (64 MiB) for one test

Code the test modules share (Daemon, SMALL, assert_no_leaks) lives
in rkv_testutil.py.
"""
import json
import os

import pytest

import rkv_testutil

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def radixkvd():
    return rkv_testutil.executable("RADIXKVD")


@pytest.fixture(scope="session")
def radixkvctl():
    return rkv_testutil.executable("RADIXKVCTL")


@pytest.fixture(scope="session")
def vectors():
    data = os.environ.get("RADIXKV_TEST_DATA") or os.path.join(HERE, "..", "data")
    with open(os.path.join(data, "block_key_vectors.json")) as f:
        return json.load(f)


@pytest.fixture
def daemon_factory(radixkvd):
    yield from rkv_testutil.daemon_factory(radixkvd)


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory()
