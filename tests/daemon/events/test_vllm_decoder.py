"""radixkvd's KV events decoded by vLLM's own event classes.

The stream of every batch since a daemon started (its replay from 0) is
decoded the way a vLLM consumer decodes vLLM's stream:
msgspec.msgpack.Decoder(type=KVEventBatch) over the classes of
vllm/distributed/kv_events.py (BlockStored, BlockRemoved,
AllBlocksCleared). In both hash encodings (--kv_events_hash=int64 and
bytes):

  - every payload decodes, each field of the type vLLM declares; each
    event equals, field for field and in order, what the project's own
    subscriber (bench/fleet/kv_subscriber.py, which refuses unknown
    fields) read from the live stream;
  - the fields radixkvd fixes have their documented values
    (docs/EVENTS.md): data_parallel_rank 0, lora_id nil, group_idx 0,
    kv_cache_spec_kind "full_attention", the namespace's LoRA name, medium
    "CPU" (a none pool), the optional vLLM fields absent;
  - the blocks the decoded events leave stored are exactly the daemon's
    own listing (Admin.DumpTree with tokens, through its cursor), each with
    the parent hash, token ids and block size the listing gives, and every
    removal names a block that was stored.

Skipped only when vLLM is not importable (scripts/install_deps.sh installs
it in the project's environment)."""
import random

import pytest

kv_events = pytest.importorskip(
    "vllm.distributed.kv_events",
    reason="vLLM is not installed (scripts/install_deps.sh installs it)")
import msgspec  # noqa: E402  (vLLM's own dependency)

from evtest_util import (SPEC, EventDaemon, client, kv_subscriber,  # noqa: E402
                         prompts, radixkv, run)

KVEventBatch = kv_events.KVEventBatch
BlockStored = kv_events.BlockStored
BlockRemoved = kv_events.BlockRemoved
AllBlocksCleared = kv_events.AllBlocksCleared

# Fields of vLLM's BlockStored that radixkvd never sends: decoded as their
# defaults. (getattr: a later vLLM may have dropped some.)
UNSENT_STORED = ("extra_keys", "kv_cache_spec_sliding_window", "locality",
                 "ownership", "session_id", "lookahead_token_ids")
UNSENT_REMOVED = ("locality", "ownership")


def replay_all(d):
    """Every batch of this daemon life, [(seq, payload)], from its replay
    socket (the replay buffer holds them all here)."""
    idx = kv_subscriber.KvIndex(d.pub, d.rep)
    try:
        got, status = idx.request_replay(0)
    finally:
        idx.close()
    assert status == {}, status  # complete from 0
    assert [s for s, _ in got] == list(range(len(got)))
    return got


def listing(d):
    """Admin.DumpTree with tokens, through its cursor: {hash: node}."""
    out = {}
    token = b""
    while True:
        resp = d.admin.DumpTree(radixkv.pb.DumpTreeRequest(
            limit=10000, paged=True, page_token=token, include_tokens=True),
            timeout=30)
        for n in resp.nodes:
            out[kv_subscriber.to_hash(n.key, d.hash_form)] = n
        token = resp.next_page_token
        if not token:
            return out


def as_fields(ev):
    """A vLLM event as the project subscriber's (tag, fields)."""
    fields = kv_subscriber.EVENT_FIELDS[type(ev).__name__]
    return type(ev).__name__, {f: getattr(ev, f) for f in fields}


def check_hash(h, form):
    if form == "int64":
        assert type(h) is int and 0 <= h < 2**64, h
    else:
        assert type(h) is bytes and len(h) == 16, h


def workload(d, c):
    """Stores, LRU evictions (the pool is small), Evict, a Clear that
    leaves a leased path (no AllBlocksCleared) and one that empties the
    cache."""
    rng = random.Random(17)
    run(c, prompts(rng, 250))
    d.admin.Evict(radixkv.pb.EvictRequest(pages=10), timeout=10)
    held = c.acquire([1, 1, 1, 1, 2, 2, 2, 2])
    if held.uncommitted_blocks:
        held.commit(release=False)
    d.admin.Clear(radixkv.pb.ClearRequest(), timeout=10)
    held.release()
    run(c, prompts(rng, 60))
    d.admin.Clear(radixkv.pb.ClearRequest(), timeout=10)
    run(c, prompts(rng, 80))


@pytest.mark.parametrize("hash_form", ["int64", "bytes"])
def test_vllm_decodes_every_event_field_for_field(hash_form):
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    live = []
    with EventDaemon(pages=48, hash_form=hash_form) as d:
        sub = d.subscriber(on_event=lambda tag, f: live.append((tag, f)))
        sub.join()
        with client(d) as c:
            workload(d, c)
        sub.drain()
        assert sub.index == d.dump() and sub.gaps == 0
        sub.close()
        batches = replay_all(d)
        nodes = listing(d)

    decoded = []
    for seq, payload in batches:
        batch = decoder.decode(payload)  # raises on any type or tag error
        assert isinstance(batch, KVEventBatch)
        assert type(batch.ts) is float and batch.ts > 1.6e9
        assert batch.data_parallel_rank == 0
        decoded.extend(batch.events)
    kinds = {type(e) for e in decoded}
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}, kinds
    assert isinstance(decoded[0], AllBlocksCleared)  # batch 0 of every life

    # Field for field, the live subscriber's view of the same stream.
    assert len(decoded) == len(live)
    for ev, want in zip(decoded, live):
        assert as_fields(ev) == want

    # radixkvd's fixed values, and the index the events build.
    blocks = {}
    stored = removed = cleared = 0
    for ev in decoded:
        if isinstance(ev, BlockStored):
            assert ev.block_size == SPEC.page_size and ev.lora_id is None
            assert ev.medium == "CPU" and ev.lora_name == SPEC.lora
            assert ev.group_idx == 0
            assert ev.kv_cache_spec_kind == "full_attention"
            for f in UNSENT_STORED:
                assert getattr(ev, f, None) is None, f
            assert len(ev.token_ids) == len(ev.block_hashes) * ev.block_size
            parent = ev.parent_block_hash
            for i, h in enumerate(ev.block_hashes):
                check_hash(h, hash_form)
                blocks[h] = (parent, ev.token_ids[i * ev.block_size:
                                                  (i + 1) * ev.block_size])
                parent = h
                stored += 1
        elif isinstance(ev, BlockRemoved):
            assert ev.medium == "CPU" and ev.group_idx == 0
            for f in UNSENT_REMOVED:
                assert getattr(ev, f, None) is None, f
            for h in ev.block_hashes:
                check_hash(h, hash_form)
                assert blocks.pop(h, None) is not None, "removed, never stored"
                removed += 1
        else:
            blocks.clear()
            cleared += 1
    assert stored > 300 and removed > 100 and cleared == 2, \
        (stored, removed, cleared)

    # The blocks left stored are the daemon's listing, block for block.
    assert set(blocks) == set(nodes), (len(blocks), len(nodes))
    for h, (parent, tokens) in blocks.items():
        n = nodes[h]
        want_parent = (None if n.depth == 0
                       else kv_subscriber.to_hash(n.parent_key, hash_form))
        assert parent == want_parent, h
        assert list(tokens) == list(n.tokens), h


def test_vllms_decoder_reads_only_the_map_form():
    """--kv_events_encoding=array is vLLM's layout before its switch to
    maps: the vLLM of this environment refuses it (older consumers read
    it; test_kv_events.py checks it)."""
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    with EventDaemon(pages=16, flags=["--kv_events_encoding=array"]) as d:
        with client(d) as c:
            run(c, prompts(random.Random(3), 5))
        batches = replay_all(d)
    assert len(batches) >= 2
    with pytest.raises(msgspec.ValidationError):
        decoder.decode(batches[-1][1])
