"""NVIDIA Dynamo's standalone KV indexer (`python -m dynamo.indexer`, PyPI
ai-dynamo-runtime, pinned in requirements/dynamo.lock) as a router's index
of radixkvd daemons.

The indexer runs as it ships: its own process on a loopback port, its HTTP
API, its own ZMQ listeners subscribed to each registered daemon's KV events
(with the daemon's replay socket for its gap recovery), no etcd or NATS.
Each daemon is one worker, numbered from 1. The daemons must publish
`--kv_events_hash=int64` (Dynamo cannot decode byte hashes) and the
indexer's `block_size` must equal the namespace's page size: Dynamo hashes
the query's token ids itself and links them through the events' token_ids
and parent hashes, so radixkv's block keys need no translation.

Used by tests/daemon/events/test_dynamo_indexer.py and
bench/fleet/fleet_bench.py --router=dynamo. Standard library only (the
indexer is a separate process of the same interpreter).
"""
import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def available():
    """Whether `python -m dynamo.indexer` can run under this interpreter."""
    return importlib.util.find_spec("dynamo") is not None and \
        importlib.util.find_spec("dynamo.indexer") is not None


class IndexerError(Exception):
    pass


class Indexer:
    """`python -m dynamo.indexer` on a loopback port of its own, indexing
    one model whose blocks are `block_size` tokens. stop() ends it."""

    def __init__(self, log_path, model, block_size, threads=1,
                 start_timeout=30.0):
        self.log_path = log_path
        self.model = model
        self.block_size = block_size
        self.proc = None
        for _ in range(5):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dynamo.indexer",
                 "--port", str(self.port), "--threads", str(threads)],
                stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
            deadline = time.time() + start_timeout
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    if self.call("/health")[0] == 200:
                        return
                except OSError:
                    time.sleep(0.05)
            self.stop()  # the port was taken meanwhile, or it failed
        raise IndexerError("dynamo.indexer did not start:\n" + self.log())

    def call(self, path, body=None, timeout=10.0):
        """(HTTP status, decoded JSON body, or the error body's text)."""
        req = urllib.request.Request(
            "http://127.0.0.1:%d%s" % (self.port, path),
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def register(self, endpoints, timeout=30.0):
        """Registers one worker per (pub, replay) endpoint pair, numbered
        1..len(endpoints), and waits until the indexer lists them all as
        active. Returns the worker ids, in the order of `endpoints`."""
        workers = list(range(1, len(endpoints) + 1))
        for w, (pub, rep) in zip(workers, endpoints):
            code, got = self.call("/register", {
                "instance_id": w, "endpoint": pub, "replay_endpoint": rep,
                "model_name": self.model, "block_size": self.block_size})
            if code != 201:
                raise IndexerError("register worker %d: %s %s" % (w, code, got))
        deadline = time.time() + timeout
        while True:
            code, got = self.call("/workers")
            if code == 200 and sorted(x["instance_id"] for x in got
                                      if x["status"] == "active") == workers:
                return workers
            if time.time() > deadline:
                raise IndexerError("workers not active: %s %s" % (code, got))
            time.sleep(0.05)

    def overlap(self, tokens, workers):
        """Blocks of `tokens`' prefix each worker holds, by the indexer (a
        worker it has no blocks of for them: 0)."""
        code, got = self.call("/query", {"token_ids": tokens,
                                         "model_name": self.model})
        if code != 200:
            raise IndexerError("query: %s %s" % (code, got))
        out = []
        for w in workers:
            inst = got["instances"].get(str(w))
            if inst is None:
                out.append(0)
                continue
            # radixkv's none and host pools publish medium "CPU", which
            # Dynamo files as host memory: its reach is the longest match.
            if inst["cpu"] != inst["longest_matched"] or \
                    inst["longest_matched"] % self.block_size:
                raise IndexerError("worker %d: unexpected overlap %s"
                                   % (w, got))
            out.append(inst["longest_matched"] // self.block_size)
        return out

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
