"""A KV-event subscriber written from vLLM's published event definitions.

It knows nothing of radixkv beyond what a vLLM consumer knows: ZMQ PUB
messages [topic, seq (8 bytes big-endian), payload], the payload a msgpack
EventBatch [ts, events, data_parallel_rank], each event a tagged
BlockStored / BlockRemoved / AllBlocksCleared (a map with its tag under
"type", or, in vLLM's older positional form, an array with the tag first),
and the replay protocol: send [b"", start seq] to the ROUTER, receive
[b"", seq, payload] per buffered batch, then the end marker seq -1.

The one radixkv-specific part is optional: `resync`, a callable that lists
the block hashes the daemon holds (Admin.DumpTree through its page cursor,
see dump_hashes), used when a replay cannot close a gap.

KvIndex keeps the set of block hashes the publisher holds. It checks that
sequence numbers are gapless: a gap is closed by a replay; a replay that
reports a gap (or starts later than asked) falls back to resync; a sequence
that goes backwards with a newer timestamp is a publisher restart (the
index starts empty again and is replayed from 0). When the stream is quiet,
probe() asks the replay socket for the next expected number: it returns
batches the stream did not deliver, and an answer "future" with a smaller
next_seq reveals a restart that no live batch has shown yet.

Standard library plus python3-zmq and python3-msgpack.
"""
import collections
import time

import msgpack
import zmq

END_SEQ = -1

# Field order of vLLM's event structs (vllm/distributed/kv_events.py), used
# to read the positional (array) form.
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids",
                 "block_size", "lora_id", "medium", "lora_name", "extra_keys",
                 "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
EVENT_FIELDS = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS,
                "AllBlocksCleared": ()}


class ProtocolError(Exception):
    pass


def decode_event(raw):
    """One event as (tag, {field: value}); missing optional fields are None."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields = EVENT_FIELDS.get(tag)
        if fields is None:
            raise ProtocolError("unknown event %r" % (raw,))
        unknown = set(raw) - set(fields) - {"type"}
        if unknown:
            raise ProtocolError("%s: unknown fields %s" % (tag, sorted(unknown)))
        return tag, {f: raw.get(f) for f in fields}
    if isinstance(raw, (list, tuple)) and raw:
        tag = raw[0]
        fields = EVENT_FIELDS.get(tag)
        if fields is None or len(raw) - 1 > len(fields):
            raise ProtocolError("bad positional event %r" % (raw,))
        values = list(raw[1:]) + [None] * (len(fields) - len(raw) + 1)
        return tag, dict(zip(fields, values))
    raise ProtocolError("event is neither a map nor an array: %r" % (raw,))


def decode_batch(payload):
    """(ts, [(tag, fields)], data_parallel_rank) of one EventBatch."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) not in (2, 3):
        raise ProtocolError("EventBatch is not [ts, events(, dp_rank)]")
    ts, events = batch[0], batch[1]
    dp = batch[2] if len(batch) == 3 else None
    if not isinstance(ts, float) or not isinstance(events, list):
        raise ProtocolError("EventBatch fields have the wrong types")
    return ts, [decode_event(e) for e in events], dp


def hash_key(h):
    """Block hashes as dictionary keys: ints stay ints, bytes stay bytes."""
    if isinstance(h, (int, bytes)):
        return h
    raise ProtocolError("block hash is neither int nor bytes: %r" % (h,))


class KvIndex:
    """The block hashes one publisher holds, kept from its events."""

    def __init__(self, endpoint, replay_endpoint=None, topic=b"",
                 context=None, rcvhwm=None, resync=None, on_event=None):
        self.ctx = context or zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        if rcvhwm is not None:
            self.sub.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self._topic = topic
        self.replay_endpoint = replay_endpoint
        self.replay = None
        self.resync = resync
        self.on_event = on_event
        self.index = set()
        self.next_seq = None      # None: not joined yet
        self.last_ts = 0.0
        self.types = collections.Counter()
        self.batches = 0
        self.events = 0
        self.gaps = 0
        self.replays = 0
        self.replay_gaps = 0
        self.resyncs = 0
        self.restarts = 0

    def close(self):
        self.sub.close(0)
        if self.replay is not None:
            self.replay.close(0)

    # -- applying -----------------------------------------------------------

    def _apply(self, seq, payload):
        ts, events, _ = decode_batch(payload)
        for tag, f in events:
            self.types[tag] += 1
            self.events += 1
            if tag == "BlockStored":
                if not f["block_hashes"] or f["block_size"] is None:
                    raise ProtocolError("BlockStored without hashes or size")
                for h in f["block_hashes"]:
                    self.index.add(hash_key(h))
            elif tag == "BlockRemoved":
                for h in f["block_hashes"]:
                    self.index.discard(hash_key(h))
            else:
                self.index.clear()
            if self.on_event is not None:
                self.on_event(tag, f)
        self.batches += 1
        self.next_seq = seq + 1
        self.last_ts = max(self.last_ts, ts)

    # -- replay and resync --------------------------------------------------

    def request_replay(self, start, timeout=5.0):
        """Sends one replay request; returns ([(seq, payload)], status)."""
        if self.replay is None:
            if self.replay_endpoint is None:
                raise ProtocolError("a gap and no replay endpoint")
            self.replay = self.ctx.socket(zmq.DEALER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.connect(self.replay_endpoint)
        self.replay.send_multipart([b"", start.to_bytes(8, "big")])
        got = []
        while True:
            if not self.replay.poll(int(timeout * 1000)):
                raise ProtocolError("no replay answer within %.1f s" % timeout)
            frames = self.replay.recv_multipart()
            if len(frames) != 3 or frames[0] != b"":
                raise ProtocolError("bad replay frame count %d" % len(frames))
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == END_SEQ:
                status = (msgpack.unpackb(frames[2], raw=False)
                          if frames[2] else {})
                return got, status
            got.append((seq, frames[2]))

    def _catch_up(self, start):
        """Replays from `start`; resyncs when the replay cannot close the gap."""
        self.replays += 1
        got, status = self.request_replay(start)
        first = got[0][0] if got else None
        if status.get("status") == "gap" or (first is not None and first > start):
            self.replay_gaps += 1
            self._resync(status.get("next_seq", got[-1][0] + 1 if got else start))
            return
        for seq, payload in got:
            if seq == self.next_seq or self.next_seq is None:
                self._apply(seq, payload)
        if self.next_seq is None:
            self.next_seq = start

    def _resync(self, from_seq):
        """The daemon's own listing, then every event numbered >= from_seq
        (taken before the listing) on top of it."""
        if self.resync is None:
            raise ProtocolError("events lost and no resync source")
        self.resyncs += 1
        self.index = set(self.resync())
        self.next_seq = from_seq
        # Batches numbered below from_seq were stamped before this moment;
        # one that arrives later with a newer stamp is a new daemon life.
        self.last_ts = time.time()

    def join(self, settle=0.3):
        """Connects, then replays the publisher's history from 0 (or
        resyncs when it is gone)."""
        deadline = time.time() + settle
        while time.time() < deadline:  # let the subscription reach the PUB
            self.poll(0.05)
            if self.next_seq is not None:
                return
        if self.next_seq is None:
            self._catch_up(0)

    # -- the live stream ----------------------------------------------------

    def _on_message(self, frames):
        if len(frames) != 3 or len(frames[1]) != 8:
            raise ProtocolError("bad message: %d frames" % len(frames))
        seq = int.from_bytes(frames[1], "big")
        payload = frames[2]
        if self.next_seq is None:
            if self.replay_endpoint is None:
                self._apply(seq, payload)
                return
            self._catch_up(0)
        if seq < self.next_seq:
            ts = decode_batch(payload)[0]
            if ts > self.last_ts and seq + 1 < self.next_seq:
                # The sequence went back with newer data: a new daemon life.
                self.restarts += 1
                self.index = set()
                self.next_seq = None
                self.last_ts = 0.0
                self._catch_up(0)
                if seq == self.next_seq:
                    self._apply(seq, payload)
            return  # else: already applied (replayed earlier)
        if seq > self.next_seq:
            self.gaps += 1
            self._catch_up(self.next_seq)
            if seq < self.next_seq:
                return
            if seq > self.next_seq:
                raise ProtocolError("gap %d..%d remains after replay"
                                    % (self.next_seq, seq))
        self._apply(seq, payload)

    def poll(self, timeout=0.0):
        """Handles every message available within `timeout` seconds of the
        first wait; returns how many."""
        n = 0
        wait = int(timeout * 1000)
        while self.sub.poll(wait):
            self._on_message(self.sub.recv_multipart())
            n += 1
            wait = 0
        return n

    def _new_sub(self):
        endpoint = self.sub.getsockopt(zmq.LAST_ENDPOINT).decode()
        topic, hwm = self._topic, self.sub.getsockopt(zmq.RCVHWM)
        self.sub.close(0)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, hwm)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)

    def probe(self):
        """Asks the replay socket for everything from the next expected
        number: a quiet stream that missed batches gets them, and a
        publisher whose numbering is behind ours has restarted (its first
        batches may have reached nobody). Returns whether anything changed.
        A restart also renews the SUB socket, whose subscription may not
        have reached the new publisher."""
        if self.replay_endpoint is None or self.next_seq is None:
            return False
        got, status = self.request_replay(self.next_seq)
        if status.get("status") == "future" and status["next_seq"] < self.next_seq:
            self.restarts += 1
            self._new_sub()
            self.index = set()
            self.next_seq = None
            self.last_ts = 0.0
            self._catch_up(0)
            return True
        if got:
            self.gaps += 1
            self._catch_up(self.next_seq)
            return True
        return False

    def drain(self, idle=0.3, limit=60.0):
        """Handles messages until none arrives for `idle` seconds and a
        replay probe finds nothing new."""
        deadline = time.time() + limit
        while time.time() < deadline:
            if self.poll(idle) == 0 and not self.probe():
                return
        raise ProtocolError("the stream did not go quiet within %.0f s" % limit)


def to_hash(key, form):
    """A radixkv 16-byte key in an event's hash form ("int64" or "bytes")."""
    return int.from_bytes(key[8:], "big") if form == "int64" else bytes(key)


def dump_hashes(admin_stub, pb, form, page_limit=10000, timeout=30.0):
    """Every cached block of a radixkvd (Admin.DumpTree with its page
    cursor), in the event hash form."""
    out = set()
    token = b""
    while True:
        resp = admin_stub.DumpTree(
            pb.DumpTreeRequest(limit=page_limit, paged=True, page_token=token),
            timeout=timeout)
        out.update(to_hash(n.key, form) for n in resp.nodes)
        token = resp.next_page_token
        if not token:
            return out
