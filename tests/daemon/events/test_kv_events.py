"""radixkvd's KV events in vLLM's wire format, checked by a subscriber that
knows only vLLM's published definitions (bench/fleet/kv_subscriber.py):
every event type decodes, sequence numbers are gapless, and the index the
events build equals the daemon's own listing (Admin.DumpTree through its
page cursor) at quiescence: through eviction, Clear, a late joiner, a
buffer overrun (gap, then resync from DumpTree) and a daemon restart.
Also the replay socket's answers to bad and odd requests, the flags'
errors, and a stalled subscriber that must not slow Acquire/Commit."""
import os
import random
import socket
import subprocess
import threading
import time

import msgpack
import pytest
import zmq

from evtest_util import (SPEC, EventDaemon, client, kv_subscriber, prompts,
                         radixkv, run)

ks = kv_subscriber


def check_equal(d, idx):
    idx.drain()
    dump = d.dump()
    assert idx.index == dump, (len(idx.index), len(dump))
    return dump


def test_every_event_type_and_tokens_rebuild_the_index():
    """Bytes hashes: each BlockStored's token ids re-derive its keys
    (contract v1) from the parent, so a router can compute its own."""
    roots = {}
    checked = {"blocks": 0, "first": 0}

    def verify(tag, f):
        if tag != "BlockStored":
            return
        assert f["medium"] == "CPU" and f["lora_name"] == "adapter-a"
        assert f["lora_id"] is None and f["block_size"] == SPEC.page_size
        assert f["group_idx"] == 0
        toks = f["token_ids"]
        hashes = f["block_hashes"]
        assert len(toks) == len(hashes) * f["block_size"]
        parent = f["parent_block_hash"]
        if parent is None:
            parent = roots["root"]
            checked["first"] += 1
        for i, h in enumerate(hashes):
            block = toks[i * f["block_size"]:(i + 1) * f["block_size"]]
            assert radixkv.chain_key(parent, block) == h
            parent = h
            checked["blocks"] += 1

    with EventDaemon(pages=48, hash_form="bytes") as d:
        idx = d.subscriber(on_event=verify)
        idx.join()
        assert idx.types["AllBlocksCleared"] == 1  # batch 0 of every life
        with client(d) as c:
            roots["root"] = c.namespace_root
            rng = random.Random(7)
            run(c, prompts(rng, 300))
            check_equal(d, idx)
            assert idx.types["BlockRemoved"] > 0  # the pool is small
            # Clear with a lease pinning a path: no AllBlocksCleared, the
            # BlockRemoved events say what went.
            held = c.acquire([1, 1, 1, 1, 2, 2, 2, 2])
            if held.uncommitted_blocks:
                held.commit(release=False)
            cleared = idx.types["AllBlocksCleared"]
            d.admin.Clear(radixkv.pb.ClearRequest(), timeout=10)
            dump = check_equal(d, idx)
            assert len(dump) == 2
            assert idx.types["AllBlocksCleared"] == cleared
            held.release()
            run(c, prompts(rng, 50))
            d.admin.Clear(radixkv.pb.ClearRequest(), timeout=10)
            assert check_equal(d, idx) == set()
            assert idx.types["AllBlocksCleared"] == cleared + 1
        assert idx.gaps == 0 and idx.resyncs == 0
        assert checked["blocks"] > 100 and checked["first"] > 0
        idx.close()


def test_int_hashes_eviction_and_batching():
    with EventDaemon(pages=40) as d:
        idx = d.subscriber()
        idx.join()
        with client(d) as c:
            run(c, prompts(random.Random(3), 400, alphabet=4))
        check_equal(d, idx)
        assert all(isinstance(h, int) and 0 <= h < 2**64 for h in idx.index)
        assert idx.types["BlockRemoved"] > 0
        # Runs of blocks become one event: fewer events than blocks stored.
        assert idx.gaps == 0
        d.admin.Evict(radixkv.pb.EvictRequest(pages=25), timeout=10)
        check_equal(d, idx)
        idx.close()


def test_late_joiner_replays_from_zero():
    with EventDaemon(pages=64) as d:
        with client(d) as c:
            run(c, prompts(random.Random(5), 200))
            idx = d.subscriber()
            idx.join()
            assert idx.replays == 1 and idx.resyncs == 0
            run(c, prompts(random.Random(6), 100))
        check_equal(d, idx)
        idx.close()


def test_overrun_gap_then_resync_from_dumptree():
    """A subscriber that stops reading loses batches at its HWM; the
    replay buffer (4 batches) has moved on: the replay reports a gap, the
    subscriber resyncs from DumpTree and goes on with the live stream."""
    flags = ["--kv_events_replay_buffer=4", "--kv_events_hwm=2"]
    # 512-token blocks: several MB of events, far more than the socket
    # buffers between publisher and subscriber hold besides the HWM.
    big = radixkv.NamespaceSpec(model="evtest", num_layers=1, num_kv_heads=1,
                                head_dim=8, page_size=512, dtype="fp16")
    with EventDaemon(pages=256, flags=flags) as d:
        idx = d.subscriber(rcvhwm=2)
        idx.sub.setsockopt(zmq.RCVBUF, 4096)
        idx.join()
        with client(d, big) as c:
            # Nobody reads meanwhile.
            run(c, prompts(random.Random(11), 600, alphabet=50,
                           max_blocks=8, page_size=512))
            idx.drain()
            assert idx.gaps >= 1 and idx.replay_gaps >= 1
            assert idx.resyncs >= 1
            run(c, prompts(random.Random(12), 50, page_size=512))
        check_equal(d, idx)
        idx.close()


def test_daemon_restart_is_a_new_sequence():
    d = EventDaemon(pages=64)
    d.start()
    try:
        idx = d.subscriber()
        idx.join()
        with client(d) as c:
            run(c, prompts(random.Random(21), 150))
        check_equal(d, idx)
        before = idx.next_seq
        assert before > 10
        d.restart()
        # ZMQ reconnects the SUB socket 100 ms after the old PUB went away;
        # batches published before that reach nobody (the new life's
        # batch 0 among them), and the replay from 0 recovers them.
        time.sleep(0.5)
        with client(d) as c:
            run(c, prompts(random.Random(22), 30))
        check_equal(d, idx)
        assert idx.restarts == 1 and idx.next_seq < before
        idx.close()
    finally:
        d.stop()


def replay_raw(d, frames, timeout=5.0):
    """Sends raw frames to the ROUTER from a DEALER; returns the answer
    frames (each a list) up to the end marker."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(d.rep)
    s.send_multipart(frames)
    out = []
    try:
        while True:
            assert s.poll(int(timeout * 1000)), "no answer"
            f = s.recv_multipart()
            out.append(f)
            if len(f) == 3 and f[1] == b"\xff" * 8:
                return out
    finally:
        s.close(0)


def end_status(answer):
    payload = answer[-1][2]
    return msgpack.unpackb(payload, raw=False) if payload else {}


def test_replay_answers_bad_huge_and_future_requests():
    with EventDaemon(pages=64, flags=["--kv_events_replay_buffer=8"]) as d:
        with client(d) as c:
            run(c, prompts(random.Random(31), 100))
        idx = d.subscriber()
        idx.join()
        idx.drain()
        nxt = idx.next_seq
        # In range: the batches from there on, then an empty end marker.
        a = replay_raw(d, [b"", (nxt - 3).to_bytes(8, "big")])
        assert [int.from_bytes(f[1], "big") for f in a[:-1]] == [nxt - 3, nxt - 2, nxt - 1]
        assert a[-1][2] == b""
        # Now: nothing to send, complete.
        a = replay_raw(d, [b"", nxt.to_bytes(8, "big")])
        assert len(a) == 1 and a[0][2] == b""
        # Older than the buffer: what is held, then a gap status.
        a = replay_raw(d, [b"", (0).to_bytes(8, "big")])
        st = end_status(a)
        assert st["status"] == "gap" and st["requested"] == 0
        assert st["first_available"] == nxt - 8 and st["next_seq"] == nxt
        assert int.from_bytes(a[0][1], "big") == nxt - 8 and len(a) == 9
        # Future and huge (2^63, 2^64-1, which is also -1 signed): nothing.
        for n in (nxt + 5, 2**63, 2**64 - 1):
            a = replay_raw(d, [b"", n.to_bytes(8, "big")])
            st = end_status(a)
            assert len(a) == 1 and st["status"] == "future"
            assert st["requested"] == n and st["next_seq"] == nxt
        # Garbage: a 3-byte sequence, no delimiter, extra frames, empty.
        for frames in ([b"", b"abc"], [nxt.to_bytes(8, "big")],
                       [b"", b"x" * 8, b"more"], [b""], [b"", b"\x00" * 4096]):
            a = replay_raw(d, frames)
            st = end_status(a)
            assert len(a) == 1 and st["status"] == "bad_request", frames
            assert "8-byte big-endian" in st["error"]
        # The publisher goes on regardless.
        with client(d) as c:
            run(c, prompts(random.Random(32), 20))
        check_equal(d, idx)
        idx.close()


def test_stalled_subscriber_never_blocks_acquire_commit():
    """A subscriber that connects and never reads (HWM 1) beside the
    workload: the publisher drops its copies instead of waiting, so the
    workload runs to its end while that peer's queue stays full, and a
    reading subscriber still sees every batch. (A publisher that waited on
    the stalled peer would stop the workload outright: the bound below is
    a deadlock detector, not a speed limit.)"""
    with EventDaemon(pages=256, flags=["--kv_events_hwm=1"]) as d:
        work = prompts(random.Random(41), 600, alphabet=8, max_blocks=8)
        with client(d) as c:
            run(c, work[:100])
            ctx = zmq.Context.instance()
            stalled = ctx.socket(zmq.SUB)
            stalled.setsockopt(zmq.RCVHWM, 1)
            stalled.setsockopt(zmq.RCVBUF, 4096)
            stalled.setsockopt(zmq.SUBSCRIBE, b"")
            stalled.connect(d.pub)
            idx = d.subscriber()
            idx.join()
            # The stalled peer's subscription has reached the publisher
            # once a batch published after it arrives there.
            deadline = time.time() + 30
            while not stalled.poll(50):
                run(c, work[100:101])
                assert time.time() < deadline, "the stalled peer never subscribed"
            done = threading.Event()
            errors = []

            def workload():
                try:
                    run(c, work[100:600])
                except Exception as e:  # surfaced by the assert below
                    errors.append(e)
                finally:
                    done.set()

            worker = threading.Thread(target=workload, daemon=True)
            worker.start()
            assert done.wait(120), "the workload stopped behind a stalled subscriber"
            assert not errors, errors
        check_equal(d, idx)
        # HWM 1 holds for the reading subscriber too: it fell behind while
        # the workload ran and closed its gaps by replay alone.
        assert idx.resyncs == 0
        stalled.close(0)
        idx.close()


def test_array_encoding_for_older_consumers():
    with EventDaemon(pages=32, flags=["--kv_events_encoding=array"]) as d:
        raw = []
        idx = d.subscriber()
        idx.join()
        with client(d) as c:
            run(c, prompts(random.Random(51), 60))
        check_equal(d, idx)
        a = replay_raw(d, [b"", (0).to_bytes(8, "big")])
        for f in a[:-1]:
            batch = msgpack.unpackb(f[2], raw=False)
            raw.extend(batch[1])
        assert all(isinstance(e, list) for e in raw)
        stored = [e for e in raw if e[0] == "BlockStored"]
        assert stored and len(stored[0]) == 8 and stored[0][6] == "CPU"
        assert raw[0] == ["AllBlocksCleared"]
        idx.close()


def run_daemon_flags(flags):
    sock = f"/tmp/rkevf{os.getpid()}.sock"
    p = subprocess.run([os.environ["RADIXKVD"], "--socket=" + sock,
                        "--metrics_listen=", "--pool=none,pages=8", *flags],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=30)
    return p.returncode, p.stderr


def test_bad_flags():
    code, err = run_daemon_flags(["--kv_events_endpoint=udp://x:1"])
    assert code == 2 and "--kv_events_endpoint=udp://x:1" in err
    code, err = run_daemon_flags(["--kv_events_endpoint=tcp://127.0.0.1:1",
                                  "--kv_events_hash=sha256"])
    assert code == 2 and "--kv_events_hash" in err
    code, err = run_daemon_flags(["--kv_events_endpoint=tcp://127.0.0.1:1",
                                  "--kv_events_media=DISK"])
    assert code == 2 and "--kv_events_media=DISK" in err, err
    assert "expected vllm" in err and "radixkv" in err, err
    code, err = run_daemon_flags(["--kv_events_replay_endpoint=tcp://127.0.0.1:9"])
    assert code == 2 and "needs --kv_events_endpoint" in err
    # Its PUB port is taken (by a listener this test holds).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, err = run_daemon_flags(
            [f"--kv_events_endpoint=tcp://127.0.0.1:{port}"])
        assert code == 1 and "Address already in use" in err
