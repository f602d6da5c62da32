"""Shared code of the KV-event tests: a radixkvd child with events on
loopback ports of its own, and a small namespace to drive it with."""
import itertools
import os
import subprocess
import sys
import time

import grpc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "bench", "fleet"))

import radixkv  # noqa: E402
from radixkv import pb, pb_grpc  # noqa: E402
import kv_subscriber  # noqa: E402,F401

_serial = itertools.count()


class EventDaemon:
    """radixkvd on a Unix socket, with --kv_events_endpoint and
    --kv_events_replay_endpoint on ZMQ ipc:// sockets whose paths are this
    daemon's own (kept across restart()): no other test can take them
    between choosing and binding, as a loopback port could be."""

    def __init__(self, pages=64, flags=(), pool=None, hash_form="int64"):
        n = next(_serial)
        self.sock = f"/tmp/rkev{os.getpid()}_{n}.sock"
        self.log_path = self.sock + ".log"
        self.pub = f"ipc://{self.sock}.pub"
        self.rep = f"ipc://{self.sock}.rep"
        self.hash_form = hash_form
        self.argv = [os.environ["RADIXKVD"], "--socket=" + self.sock,
                     "--metrics_listen=", "--shutdown_grace=1s",
                     "--pool=" + (pool or f"none,pages={pages}"),
                     "--kv_events_endpoint=" + self.pub,
                     "--kv_events_replay_endpoint=" + self.rep,
                     "--kv_events_hash=" + hash_form, *flags]
        self.proc = None
        self.admin = None
        self._channel = None

    def start(self, timeout=30.0):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        start_len = len(self.log()) if os.path.exists(self.log_path) else 0
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if "radixkvd: ready" in self.log()[start_len:]:
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

    def stop(self):
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    def restart(self):
        self.stop()
        return self.start()

    def dump(self):
        return kv_subscriber.dump_hashes(self.admin, pb, self.hash_form)

    def subscriber(self, **kw):
        return kv_subscriber.KvIndex(self.pub, self.rep, resync=self.dump, **kw)

    def stats(self):
        return self.admin.GetStats(pb.GetStatsRequest(), timeout=5).stats

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


SPEC = radixkv.NamespaceSpec(model="evtest", num_layers=1, num_kv_heads=1,
                             head_dim=8, page_size=4, dtype="fp16",
                             lora="adapter-a")


def client(daemon, spec=SPEC):
    return radixkv.Client(endpoint=daemon.sock, namespace=spec,
                          release_delay=0, heartbeat_interval=5)


def prompts(rng, n, alphabet=3, max_blocks=6, page_size=4):
    """n prompts over a small alphabet: many shared prefixes, many branches."""
    return [[rng.randrange(alphabet)
             for _ in range(page_size * rng.randrange(1, max_blocks + 1))]
            for _ in range(n)]


def run(c, prompt_list):
    for p in prompt_list:
        lease = c.acquire(p)
        if lease.uncommitted_blocks:
            lease.commit()
        else:
            lease.release()
