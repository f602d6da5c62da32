"""Shared code of the radixkv Python tests: the binaries under test, a
radixkvd child process, a small namespace, and the leak check every daemon
test ends with."""
import itertools
import os
import signal
import subprocess
import time

import grpc
import pytest

import radixkv
from radixkv import pb, pb_grpc

_serial = itertools.count()


def executable(var):
    """The binary the environment variable `var` names (ctest sets it);
    skips the test, saying so, when it names no executable."""
    path = os.environ.get(var, "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"${var} does not name an executable (run through ctest)")
    return path


class Daemon:
    """A radixkvd child process on a Unix socket of its own, metrics off.
    start() waits for its "radixkvd: ready" line."""

    def __init__(self, binary, flags, pool):
        n = next(_serial)
        self.sock = f"/tmp/rkpy{os.getpid()}_{n}.sock"
        self.attach_sock = self.sock[:-len(".sock")] + ".attach.sock"
        self.log_path = self.sock + ".log"
        self.argv = [binary, "--socket=" + self.sock, "--metrics_listen=",
                     "--pool=" + pool, *flags]
        self.proc = None
        self._channel = None
        self.admin = None

    def start(self, timeout=30.0):
        for path in (self.sock, self.attach_sock):
            if os.path.exists(path):
                os.unlink(path)
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if "radixkvd: ready" in self.log():
                self._channel = grpc.insecure_channel("unix:" + self.sock)
                self.admin = pb_grpc.AdminStub(self._channel)
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("radixkvd did not become ready:\n" + self.log())

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stats(self):
        return self.admin.GetStats(pb.GetStatsRequest(), timeout=5).stats

    def sessions(self):
        return list(self.admin.ListSessions(pb.ListSessionsRequest(), timeout=5).sessions)

    def wait_stats(self, predicate, timeout=5.0):
        """Polls GetStats until predicate(stats) holds; returns the stats."""
        deadline = time.time() + timeout
        while True:
            s = self.stats()
            if predicate(s) or time.time() > deadline:
                return s
            time.sleep(0.01)

    def pause(self):
        """SIGSTOP, and wait until the kernel has stopped every thread."""
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.time() + 5
        while time.time() < deadline:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
            time.sleep(0.005)
        raise RuntimeError("radixkvd did not stop")

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cleanup(self):
        self.stop()
        for path in (self.sock, self.attach_sock, self.log_path):
            if os.path.exists(path):
                os.unlink(path)


# A small fp16 layout: page_bytes = 2 * 2 * 2 * 4 * 8 * 2 = 512.
SMALL = radixkv.NamespaceSpec(model="py-test", num_layers=2, num_kv_heads=2,
                              head_dim=8, page_size=4, dtype="DTYPE_FLOAT16")


def daemon_factory(radixkvd):
    """The body of the daemon_factory fixtures: yields make(*flags,
    pool="host,bytes=64MiB") -> a started Daemon on a socket of its own;
    every daemon made is cleaned up when the generator is closed."""
    started = []

    def make(*flags, pool="host,bytes=64MiB"):
        d = Daemon(radixkvd, flags, pool)
        started.append(d)
        return d.start()

    yield make
    for d in started:
        d.cleanup()


def assert_no_leaks(d, sessions=None):
    """The daemon holds no lease and no page being written (and, when given,
    exactly `sessions` sessions); its invariants hold."""
    s = d.wait_stats(lambda s: s.leases == 0 and s.writing_pages == 0 and
                     (sessions is None or s.sessions == sessions))
    assert (s.leases, s.writing_pages) == (0, 0), s
    if sessions is not None:
        assert s.sessions == sessions, s
    assert s.invariants_ok, s
    return s
