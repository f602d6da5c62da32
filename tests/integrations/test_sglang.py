"""radixkv.integrations.sglang.RadixKVStorage against SGLang 0.5.23's own
HiCacheStorage class, storage backend factory, device pools
(MHATokenToKVPool, MLATokenToKVPool on the CPU), host pools
(MHATokenToKVPoolHost in every layout, MLATokenToKVPoolHost) and page
hashes (get_hash_str), with radixkvd child processes.

Run as a script (`test_sglang.py worker|hang ENDPOINT DIR I N`) it is the
SGLang process of test_processes_share_one_daemon and
test_daemon_hung_is_a_miss_within_the_deadline.

Every daemon test ends with no lease and no page being written in the
daemon (assert_no_leaks)."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

try:
    import torch
    from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage,
                                                      HiCacheStorageConfig,
                                                      HiCacheStorageExtraInfo)
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    from sglang.srt.mem_cache.utils import get_hash_str
except ImportError as e:  # pragma: no cover - depends on the environment
    pytest.skip(f"sglang 0.5.23 cannot be imported from this interpreter "
                f"({sys.executable}): {e!r}", allow_module_level=True)

import radixkv
from radixkv.integrations import sglang as radixkv_sglang
from radixkv.integrations.sglang import RadixKVStorage, namespace_for, page_key

from conftest import assert_no_leaks

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
# A small model: 3 layers, 2 KV heads of 8, pages of 4 tokens, fp16.
GEOMETRY = dict(layers=3, heads=2, head_dim=8, page_size=4)
MODULE = "radixkv.integrations.sglang"


def host_pool(layout, layers=3, heads=2, head_dim=8, page_size=4,
              dtype=torch.float16, tokens=64, v_head_dim=None):
    """SGLang's device pool on the CPU and its HiCache host pool (ratio 2)."""
    device = MHATokenToKVPool(tokens, page_size, dtype, heads, head_dim, layers,
                              "cpu", False, v_head_dim=v_head_dim,
                              start_layer=0, end_layer=layers)
    return MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, layout,
        pin_memory=False, device="cpu", device_capacity_tokens=device.size,
        start_layer=device.start_layer, end_layer=device.end_layer)


def storage_config(endpoint, model="sgl-test/model", tp_rank=0, tp_size=1,
                   is_mla=False, **extra):
    extra_config = {"backend_name": "radixkv", "module_path": MODULE,
                    "class_name": "RadixKVStorage", "interface_v1": 1,
                    "endpoint": endpoint, "call_timeout": 0.5, **extra}
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=is_mla, enable_storage_metrics=False,
        is_page_first_layout=False, model_name=model, extra_config=extra_config)


def backend(endpoint, pool, **kw):
    """The backend as SGLang's controller makes it: the factory with
    --hicache-storage-backend dynamic, then register_mem_pool_host."""
    b = StorageBackendFactory.create_backend("dynamic", storage_config(endpoint, **kw),
                                             pool)
    b.register_mem_pool_host(pool)
    assert b.client.wait_for_session(10), b.client.state()
    return b


def fill_random(pool, seed):
    """Random bits in the whole host pool (NaN payloads included)."""
    g = torch.Generator().manual_seed(seed)
    bits = pool.kv_buffer.view(torch.int16)
    bits.copy_(torch.randint(-2**15, 2**15, bits.shape, generator=g, dtype=torch.int16))


def token_kv(pool, layer, kv, token):
    """K (kv 0) or V (kv 1) of one token of one layer, (heads, head_dim), read
    through SGLang's own per-layer host views (page_head: its buffer dims
    (2, pages, heads, page_size, layers, head_dim))."""
    p = pool.page_size
    if pool.layout == "page_head":
        return pool.kv_buffer[kv, token // p, :, token % p, layer, :]
    refs = pool.k_data_refs if kv == 0 else pool.v_data_refs
    if pool.layout == "page_first_direct":
        return refs[layer][token // p][token % p]
    return refs[layer][token]


def page_bits(pool, start):
    """The page at host slot `start` as (layer, kv, head, slot, dim) int16 bits."""
    p = pool.page_size
    out = torch.empty((pool.layer_num, 2, pool.head_num, p, pool.head_dim),
                      dtype=pool.dtype)
    for layer in range(pool.layer_num):
        for kv in range(2):
            for s in range(p):
                out[layer, kv, :, s, :] = token_kv(pool, layer, kv, start + s)
    return out.view(torch.int16)


def page_hashes(tokens, page_size, prior=None):
    try:
        return get_hash_str(tokens, prior, page_size=page_size)
    except RuntimeError as e:
        pytest.skip(f"SGLang's page hash (native extension hicache_hash_cpp) "
                    f"cannot be built here: {e!r}")


def pages(pool, n):
    """n pages of the host pool: their host slots, as SGLang passes them."""
    idx = pool.alloc(n * pool.page_size)
    assert idx is not None
    return idx


def starts(idx, p):
    return idx.reshape(-1)[::p].tolist()


def info(prefix):
    return HiCacheStorageExtraInfo(prefix_keys=list(prefix))


# -- the factory and the namespace ------------------------------------------------


def test_factory_loads_backend_and_namespace_matches_daemon(daemon):
    pool = host_pool("layer_first")
    b = backend(daemon.sock, pool, model_revision="rev7", cache_salt="tenant-a")
    try:
        assert isinstance(b, RadixKVStorage) and isinstance(b, HiCacheStorage)
        ns = b.namespace
        assert (ns.model, ns.num_layers, ns.num_kv_heads, ns.head_dim,
                ns.page_size) == ("sgl-test/model", 3, 2, 8, 4)
        assert ns.dtype == radixkv.pb.DTYPE_FLOAT16
        assert (ns.tp_rank, ns.tp_size) == (0, 1)
        assert ns.model_revision == "rev7#sglang.hicache.v1"
        assert ns.cache_salt == "tenant-a"
        assert namespace_for(b.storage_config, pool) == ns
        # The daemon hashed the same namespace the client did.
        assert b.client.state().namespace_id == b.client.namespace_root
        sessions = daemon.sessions()
        assert len(sessions) == 1
    finally:
        b.close()
    assert_no_leaks(daemon, sessions=0)


def test_page_key_is_one_block_key_step_in_the_namespace():
    h = page_hashes(list(range(8)), 4)
    assert len(h) == 2 and all(len(x) == 64 for x in h)
    spec = radixkv.NamespaceSpec(model="m", num_layers=3, num_kv_heads=2, head_dim=8,
                                 page_size=4, dtype="fp16")
    root = radixkv.namespace_root(spec)
    other = radixkv.namespace_root(radixkv.NamespaceSpec(
        model="m2", num_layers=3, num_kv_heads=2, head_dim=8, page_size=4, dtype="fp16"))
    # H(root || u32(0) tokens || u32(1) extra || str(tag) || str(key)), §1.3.
    body = (root + (0).to_bytes(4, "little") + (1).to_bytes(4, "little") +
            len(b"sglang.page").to_bytes(4, "little") + b"sglang.page" +
            len(h[0]).to_bytes(4, "little") + h[0].encode())
    import xxhash
    assert page_key(root, h[0]) == xxhash.xxh3_128_digest(body)
    # The batch form (one hash input head per call) gives the same keys.
    assert radixkv_sglang._keys(root, h, "keys") == [page_key(root, k) for k in h]
    assert radixkv_sglang._keys(root, ["ü-key"], "keys") == [page_key(root, "ü-key")]
    assert page_key(root, h[0]) != page_key(other, h[0])
    assert page_key(root, h[0]) != page_key(root, h[1])
    with pytest.raises(TypeError, match="key: SGLang page keys are str"):
        page_key(root, b"x")


# -- set -> exists -> get, bit for bit -----------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_set_exists_get_bit_exact(daemon, layout):
    pool = host_pool(layout)
    fill_random(pool, seed=1)
    b = backend(daemon.sock, pool)
    P = pool.page_size
    try:
        keys = page_hashes(list(range(5 * P)), P)
        src = pages(pool, 5)
        assert b.batch_exists(keys, info([])) == 0
        assert not b.exists(keys[0])
        # Pages 0-2, then 3-4 after their prefix, as SGLang's backup does.
        assert b.batch_set_v1(keys[:3], src[:3 * P], info([])) == [True] * 3
        assert b.batch_exists(keys, info([])) == 3
        assert b.batch_set_v1(keys[3:], src[3 * P:], info(keys[:3])) == [True, True]
        assert b.batch_exists(keys, info([])) == 5
        assert b.batch_exists(keys[3:], info(keys[:3])) == 2
        assert b.batch_exists(keys[1:], info(keys[:1])) == 4
        assert b.exists(keys[0])
        # Storing again is a deduplicated success.
        assert b.batch_set_v1(keys[:2], src[:2 * P], info([])) == [True, True]

        # The radixkv pages hold (layer, kv, head, slot, dim) of SGLang's tokens.
        root = b.client.namespace_root
        with b.client.acquire_keys([page_key(root, k) for k in keys],
                                   allocate=False) as lease:
            assert lease.matched_blocks == 5
            for i, s in enumerate(starts(src, P)):
                got = lease.page_tensor(i).view(torch.int16)
                assert torch.equal(got, page_bits(pool, s)), (layout, i)

        # Load into other host slots: bit for bit, and partial hits stop at the miss.
        dst = pages(pool, 5)
        assert b.batch_get_v1(keys, dst, info([])) == [True] * 5
        for s, d in zip(starts(src, P), starts(dst, P)):
            assert torch.equal(page_bits(pool, s), page_bits(pool, d))
        other = page_hashes(list(range(100, 100 + 2 * P)), P, prior=keys[1])
        dst2 = pages(pool, 3)
        assert b.batch_get_v1([keys[2]] + other, dst2, info(keys[:2])) == [True, False, False]
        assert torch.equal(page_bits(pool, starts(dst2, P)[0]),
                           page_bits(pool, starts(src, P)[2]))
    finally:
        b.close()
    assert_no_leaks(daemon, sessions=0)


def test_pages_move_between_host_layouts(daemon):
    """A page stored from one host layout loads into every other one with the
    same K/V per token: the radixkv page is layout independent."""
    writer = host_pool("page_first")
    fill_random(writer, seed=2)
    w = backend(daemon.sock, writer)
    P = writer.page_size
    keys = page_hashes(list(range(7, 7 + 3 * P)), P)
    src = pages(writer, 3)
    readers = []
    try:
        assert w.batch_set_v1(keys, src, info([])) == [True] * 3
        for layout in ("layer_first", "page_first_direct", "page_head"):
            pool = host_pool(layout)
            r = backend(daemon.sock, pool)
            readers.append(r)
            dst = pages(pool, 3)
            assert r.batch_get_v1(keys, dst, info([])) == [True] * 3
            for s, d in zip(starts(src, P), starts(dst, P)):
                assert torch.equal(page_bits(writer, s), page_bits(pool, d)), layout
    finally:
        for r in readers + [w]:
            r.close()
    assert_no_leaks(daemon, sessions=0)


@pytest.mark.parametrize("layout", ("layer_first", "page_head"))
def test_tensor_forms_get_set_batch(daemon, layout):
    """get/set/batch_get/batch_set with SGLang's flat data pages
    (get_data_page, get_dummy_flat_data_page, set_from_flat_data_page)."""
    pool = host_pool(layout)
    fill_random(pool, seed=3)
    b = backend(daemon.sock, pool)
    P = pool.page_size
    try:
        keys = page_hashes(list(range(50, 50 + 3 * P)), P)
        src = starts(pages(pool, 3), P)
        data = [pool.get_data_page(s, flat=True) for s in src]
        assert b.batch_set(keys, data)
        assert b.batch_exists(keys) == 3
        outs = b.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
        assert all(o is not None for o in outs)
        dst = starts(pages(pool, 3), P)
        for o, s, d in zip(outs, src, dst):
            pool.set_from_flat_data_page(d, o)
            assert torch.equal(page_bits(pool, s), page_bits(pool, d))
        # set/get of one page (a chain of its own).
        one = page_hashes(list(range(900, 900 + P)), P)[0]
        assert b.get(one, pool.get_dummy_flat_data_page()) is None
        assert b.set(one, pool.get_data_page(src[1], flat=True))
        got = b.get(one, pool.get_dummy_flat_data_page())
        assert got is not None
        assert torch.equal(got.view(torch.int16),
                           pool.get_data_page(src[1], flat=True).view(torch.int16))
        # A page the zero-copy path stored reads through the tensor form.
        k2 = page_hashes(list(range(700, 700 + P)), P)
        idx = pages(pool, 1)
        assert b.batch_set_v1(k2, idx, None) == [True]
        got2 = b.batch_get(k2, [pool.get_dummy_flat_data_page()])[0]
        assert torch.equal(got2.view(torch.int16),
                           pool.get_data_page(int(idx[0]), flat=True).view(torch.int16))
    finally:
        b.close()
    assert_no_leaks(daemon, sessions=0)


def test_without_prefix_keys_a_batch_is_a_chain_of_its_own(daemon, caplog):
    """SGLang without hicache_storage_pass_prefix_keys passes prefix_keys
    None: each batch is keyed from its first page, found by a lookup that
    starts there too, and never by one that starts elsewhere."""
    pool = host_pool("page_first_direct")
    fill_random(pool, seed=11)
    b = backend(daemon.sock, pool)
    P = pool.page_size
    keys = page_hashes(list(range(300, 300 + 4 * P)), P)
    none = HiCacheStorageExtraInfo(prefix_keys=None)
    try:
        with caplog.at_level("WARNING", logger="radixkv.integrations.sglang"):
            assert b.batch_set_v1(keys[2:], pages(pool, 2), none) == [True, True]
            assert b.batch_exists(keys[2:], none) == 2
        assert sum("hicache_storage_pass_prefix_keys" in r.getMessage()
                   for r in caplog.records) == 1
        assert b.batch_exists(keys, info([])) == 0        # the chain from page 0
        assert b.batch_exists(keys[3:], none) == 0        # another starting page
        assert b.batch_get_v1(keys[2:], pages(pool, 2), none) == [True, True]
    finally:
        b.close()
    assert_no_leaks(daemon, sessions=0)


# -- namespaces ---------------------------------------------------------------------


def test_namespace_isolation(daemon):
    """Equal SGLang keys in two models (or two TP shards, or two cache
    salts) never share a block."""
    pools = {name: host_pool("layer_first") for name in ("a", "b", "tp1", "salt")}
    for i, p in enumerate(pools.values()):
        fill_random(p, seed=10 + i)
    made = {
        "a": backend(daemon.sock, pools["a"], model="org/model-a", tp_size=2),
        "b": backend(daemon.sock, pools["b"], model="org/model-b", tp_size=2),
        "tp1": backend(daemon.sock, pools["tp1"], model="org/model-a", tp_rank=1,
                       tp_size=2),
        "salt": backend(daemon.sock, pools["salt"], model="org/model-a", tp_size=2,
                        cache_salt="other-tenant"),
    }
    P = 4
    keys = page_hashes(list(range(3 * P)), P)
    try:
        roots = {n: b.client.namespace_root for n, b in made.items()}
        assert len(set(roots.values())) == 4
        assert made["a"].batch_set_v1(keys, pages(pools["a"], 3), info([])) == [True] * 3
        assert made["a"].batch_exists(keys, info([])) == 3
        for n in ("b", "tp1", "salt"):
            assert made[n].batch_exists(keys, info([])) == 0, n
            assert made[n].batch_get_v1(keys, pages(pools[n], 3), info([])) == [False] * 3
        # b stores its own pages under the same keys; a still reads its own.
        src_b = pages(pools["b"], 3)
        assert made["b"].batch_set_v1(keys, src_b, info([])) == [True] * 3
        dst = pages(pools["a"], 3)
        assert made["a"].batch_get_v1(keys, dst, info([])) == [True] * 3
        a_src = starts(dst, P)
        b_src = starts(src_b, P)
        assert not torch.equal(page_bits(pools["a"], a_src[0]),
                               page_bits(pools["b"], b_src[0]))
    finally:
        for b in made.values():
            b.close()
    assert_no_leaks(daemon, sessions=0)


def test_fp8_cache_stored_as_uint8_needs_its_format(daemon_factory):
    """SGLang keeps an fp8 KV cache in uint8 tensors; the backend takes the
    format from extra_config.kv_cache_dtype (a namespace field) and refuses
    to guess."""
    d = daemon_factory("--allow_key_mode")
    pool = host_pool("page_first", dtype=torch.float8_e4m3fn)
    assert pool.dtype == torch.uint8
    with pytest.raises(ValueError, match=r"mem_pool_host.dtype: torch.uint8 .* "
                                         r"extra_config.kv_cache_dtype"):
        RadixKVStorage(storage_config(d.sock), {}).register_mem_pool_host(pool)
    g = torch.Generator().manual_seed(9)
    pool.kv_buffer.copy_(torch.randint(0, 256, pool.kv_buffer.shape, generator=g,
                                       dtype=torch.uint8))
    b = backend(d.sock, pool, kv_cache_dtype="fp8_e4m3")
    P = pool.page_size
    try:
        assert b.namespace.dtype == radixkv.pb.DTYPE_FLOAT8_E4M3
        keys = page_hashes(list(range(2 * P)), P)
        src, dst = pages(pool, 2), pages(pool, 2)
        assert b.batch_set_v1(keys, src, info([])) == [True, True]
        assert b.batch_get_v1(keys, dst, info([])) == [True, True]
        for s_, d_ in zip(starts(src, P), starts(dst, P)):
            assert torch.equal(pool.get_data_page(s_), pool.get_data_page(d_))
        # radixkv's fp8 page: 384 element bytes, then one fp32 scale per
        # (layer, K|V, head) run (docs/CONTRACTS.md §2.1), here 1.0: the
        # elements are SGLang's, scaled by SGLang's own per-layer scales.
        root = b.client.namespace_root
        with b.client.acquire_keys([page_key(root, k) for k in keys],
                                   allocate=False) as lease:
            raw = bytes(lease.page(0))
        assert len(raw) == b.client.pool.page_bytes == 384 + 3 * 2 * 2 * 4
        assert torch.frombuffer(bytearray(raw[384:]), dtype=torch.float32).eq(1.0).all()
    finally:
        b.close()
    assert_no_leaks(d, sessions=0)


# -- MLA ----------------------------------------------------------------------------


def mla_host_pool(layout, layers=3, kv_lora_rank=16, rope_dim=8, page_size=4,
                  tokens=64):
    """SGLang's MLA device pool on the CPU (bf16) and its host pool."""
    device = MLATokenToKVPool(tokens, page_size, torch.bfloat16, kv_lora_rank,
                              rope_dim, layers, "cpu", False, start_layer=0,
                              end_layer=layers)
    return MLATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info, 2.0, 0, page_size, layout,
        pin_memory=False, device="cpu", device_capacity_tokens=device.size,
        start_layer=device.start_layer, end_layer=device.end_layer,
        target_layer_num=device.layer_num)


def mla_token(pool, layer, token):
    """The latent row of one token of one layer, by the host buffer's dims:
    layer_first (layers, slots, 1, dim), page_first (slots, layers, 1, dim),
    page_first_direct (pages, layers, page_size, 1, dim)."""
    b, p = pool.kv_buffer, pool.page_size
    if pool.layout == "layer_first":
        return b[layer, token, 0]
    if pool.layout == "page_first":
        return b[token, layer, 0]
    return b[token // p, layer, token % p, 0]


def mla_page_bits(pool, start):
    return torch.stack([torch.stack([mla_token(pool, layer, start + s)
                                     for s in range(pool.page_size)])
                        for layer in range(pool.layer_num)]).view(torch.int16)


def test_mla_one_namespace_for_all_ranks_rank0_writes(daemon_factory):
    """MLA: the latent cache is the same on every TP rank, so every rank is in
    one namespace (tp 0 of 1) and only SGLang's storage writer (rank 0)
    stores; another rank in another host layout loads the pages bit for bit."""
    d = daemon_factory("--allow_key_mode")
    pool0, pool1 = mla_host_pool("page_first"), mla_host_pool("layer_first")
    fill_random(pool0, seed=6)
    fill_random(pool1, seed=7)
    r0 = backend(d.sock, pool0, model="org/mla", is_mla=True, tp_rank=0, tp_size=2)
    r1 = backend(d.sock, pool1, model="org/mla", is_mla=True, tp_rank=1, tp_size=2)
    P = pool0.page_size
    keys = page_hashes(list(range(3 * P)), P)
    try:
        ns = r0.namespace
        assert (ns.num_layers, ns.num_kv_heads, ns.head_dim, ns.page_size) == (3, 1, 12, 4)
        assert (ns.tp_rank, ns.tp_size, ns.dtype) == (0, 1, radixkv.pb.DTYPE_BFLOAT16)
        assert ns.model_revision == "#sglang.hicache.v1,mla"
        assert r0.client.namespace_root == r1.client.namespace_root
        # Rank 1 is no storage writer: it stores nothing.
        assert r1.batch_set_v1(keys, pages(pool1, 3), info([])) == [False] * 3
        assert r1.batch_exists(keys, info([])) == 0
        src = pages(pool0, 3)
        assert r0.batch_set_v1(keys, src, info([])) == [True] * 3
        assert r1.batch_exists(keys, info([])) == 3
        dst = pages(pool1, 3)
        assert r1.batch_get_v1(keys, dst, info([])) == [True] * 3
        for s_, d_ in zip(starts(src, P), starts(dst, P)):
            assert torch.equal(mla_page_bits(pool0, s_), mla_page_bits(pool1, d_))
        # The radixkv page holds (layer, slot, latent) in its bytes.
        root = r0.client.namespace_root
        with r0.client.acquire_keys([page_key(root, k) for k in keys],
                                    allocate=False) as lease:
            got = lease.page_tensor(0).reshape(3, P, 24).view(torch.int16)
            assert torch.equal(got, mla_page_bits(pool0, starts(src, P)[0]))
    finally:
        r0.close()
        r1.close()
    assert_no_leaks(d, sessions=0)


# -- bad input ----------------------------------------------------------------------


def test_bad_input_names_the_field(daemon, daemon_factory):
    pool = host_pool("layer_first")
    b = backend(daemon.sock, pool)
    P = pool.page_size
    keys = page_hashes(list(range(2 * P)), P)
    try:
        with pytest.raises(ValueError, match=r"host_indices: 4 slots for 2 keys of page_size 4 \(want 8\)"):
            b.batch_set_v1(keys, pages(pool, 1), info([]))
        with pytest.raises(TypeError, match=r"host_indices: integer slots"):
            b.batch_get_v1(keys, torch.zeros(8, dtype=torch.float32), info([]))
        with pytest.raises(ValueError, match=r"host_indices\[0:4\]: the slots of one page must be consecutive"):
            b.batch_set_v1(keys[:1], torch.tensor([0, 2, 1, 3]), info([]))
        with pytest.raises(ValueError, match=r"host_indices\[4\]: slot 10000 does not start a page"):
            b.batch_set_v1(keys, torch.cat([torch.arange(4), torch.arange(10000, 10004)]),
                           info([]))
        with pytest.raises(TypeError, match=r"keys\[1\]: a non-empty str page key"):
            b.batch_exists([keys[0], 17])
        with pytest.raises(TypeError, match=r"extra_info.prefix_keys\[0\]"):
            b.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=[b"x"]))
        page = pool.get_data_page(0, flat=True)
        with pytest.raises(ValueError, match=r"values\[0\]: dtype torch.float32, the host pool's is torch.float16"):
            b.batch_set(keys[:1], [page.float()])
        with pytest.raises(ValueError, match=r"values\[1\]: 10 elements, a page holds 384"):
            b.batch_set(keys, [page, page[:10].clone()])
        with pytest.raises(ValueError, match=r"values: 1 tensors for 2 keys"):
            b.batch_set(keys, [page])
        with pytest.raises(ValueError, match=r"target_locations\[0\]: dtype torch.bfloat16"):
            b.batch_get(keys[:1], [torch.zeros(384, dtype=torch.bfloat16)])
        # Nothing was stored by the refused calls.
        assert b.batch_exists(keys, info([])) == 0
    finally:
        b.close()
    with pytest.raises(TypeError, match=r"extra_config.endpoint: a string is required"):
        RadixKVStorage(storage_config(7), {})
    with pytest.raises(ValueError, match=r"extra_config.call_timeout"):
        RadixKVStorage(storage_config(daemon.sock, call_timeout="fast"), {})
    with pytest.raises(ValueError, match=r"storage_config.model_name: empty"):
        RadixKVStorage(storage_config(daemon.sock, model=None), {})
    with pytest.raises(TypeError, match=r"storage_config: an SGLang HiCacheStorageConfig"):
        RadixKVStorage({"model_name": "m"}, {})
    # K and V of different widths have no radixkv page.
    odd = host_pool("layer_first", v_head_dim=4)
    with pytest.raises(ValueError, match=r"mem_pool_host.v_head_dim: 4 differs from head_dim 8"):
        RadixKVStorage(storage_config(daemon.sock), {}).register_mem_pool_host(odd)
    # The daemon's pool has 768-byte pages: another geometry is refused by name.
    big = host_pool("layer_first", layers=4)
    with pytest.raises(radixkv.FailedPrecondition):
        RadixKVStorage(storage_config(daemon.sock), {}).register_mem_pool_host(big)
    assert_no_leaks(daemon, sessions=0)


# -- daemon faults ------------------------------------------------------------------


def test_daemon_restart_mid_run(daemon):
    """SGLang's threads keep calling while radixkvd stops and restarts: every
    call returns (misses, False), none raises; hits resume after the
    restart."""
    pool = host_pool("page_first")
    fill_random(pool, seed=4)
    b = backend(daemon.sock, pool)
    P = pool.page_size
    keys = page_hashes(list(range(4 * P)), P)
    src = pages(pool, 4)
    dst = pages(pool, 4)
    errors, calls = [], {"n": 0}
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            try:
                b.batch_set_v1(keys, src, info([]))
                b.batch_exists(keys, info([]))
                b.batch_get_v1(keys, dst, info([]))
                b.exists(keys[0])
                calls["n"] += 1
            except Exception as e:  # pylint: disable=broad-except
                errors.append(repr(e))
                return

    try:
        assert b.batch_set_v1(keys, src, info([])) == [True] * 4
        worker = threading.Thread(target=traffic)
        worker.start()
        time.sleep(0.3)
        daemon.stop()
        t0 = time.monotonic()
        # Down: misses, quickly (no session: no call is even made).
        assert b.batch_exists(keys, info([])) == 0
        assert b.batch_get_v1(keys, dst, info([])) == [False] * 4
        assert b.batch_set_v1(keys, src, info([])) == [False] * 4
        assert b.exists(keys[0]) is False
        assert b.get(keys[0], pool.get_dummy_flat_data_page()) is None
        assert b.set(keys[0], pool.get_data_page(0, flat=True)) is False
        assert time.monotonic() - t0 < 5
        time.sleep(0.5)
        daemon.start()
        assert b.client.wait_for_session(15), b.client.state()
        # The restarted daemon's pool is empty; SGLang's next backup stores again.
        deadline = time.monotonic() + 10
        while b.batch_exists(keys, info([])) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        worker.join(30)
        assert not worker.is_alive()
        assert errors == []
        assert calls["n"] > 0
        assert b.batch_exists(keys, info([])) == 4
        fresh = pages(pool, 4)
        assert b.batch_get_v1(keys, fresh, info([])) == [True] * 4
        for s, d in zip(starts(src, P), starts(fresh, P)):
            assert torch.equal(page_bits(pool, s), page_bits(pool, d))
        assert b.client.state().reconnects >= 1
    finally:
        stop.set()
        b.close()
    assert_no_leaks(daemon, sessions=0)


def test_daemon_hung_is_a_miss_within_the_deadline(daemon, tmp_path):
    """radixkvd stopped (SIGSTOP) under an SGLang process: every call returns
    within its deadline as a miss, hits resume after SIGCONT, and once the
    process has exited the daemon holds nothing of it. (An Acquire the
    daemon answers after the client's deadline leaves a lease the client
    never learned of; the daemon frees it when the process exits.)"""
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "hang", daemon.sock,
         str(tmp_path), "0", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "ready").exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.05)
        time.sleep(0.3)
        daemon.pause()
        time.sleep(2.0)
        daemon.resume()
        (tmp_path / "resumed").touch()
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    r = json.loads((tmp_path / "result0.json").read_text())
    assert r["errors"] == []
    assert r["misses"] > 0                  # calls made while the daemon was stopped
    assert r["longest_call_s"] < 2.5, r     # call_timeout 0.5 s, plus a reconnect
    assert r["hits_after"] == 4 and r["bit_exact_after"] is True
    assert_no_leaks(daemon, sessions=0)


# -- copy rates ------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ("page_first_direct", "layer_first"))
def test_copy_rates_of_one_batch(daemon_factory, layout):
    """One SGLang batch of 64 pages of a 16-layer, 8-head, 128-dim bf16 model
    (page_size 16, 1 MiB a page): stored, found and loaded bit for bit. The
    rates are printed (pytest -s); they depend on the machine's load."""
    d = daemon_factory("--allow_key_mode", pool="host,bytes=160MiB")
    n, P = 64, 16
    pool = host_pool(layout, layers=16, heads=8, head_dim=128, page_size=P,
                     dtype=torch.bfloat16, tokens=n * P)
    fill_random(pool, seed=8)
    b = backend(d.sock, pool)
    keys = page_hashes(list(range(n * P)), P)
    src, dst = pages(pool, n), pages(pool, n)
    mib = n * b.namespace.page_bytes / 2**20
    try:
        t0 = time.perf_counter()
        assert b.batch_set_v1(keys, src, info([])) == [True] * n
        t1 = time.perf_counter()
        assert b.batch_exists(keys, info([])) == n
        t2 = time.perf_counter()
        assert b.batch_get_v1(keys, dst, info([])) == [True] * n
        t3 = time.perf_counter()
        print(f"\nsglang {layout}: {n} pages, {mib:.0f} MiB: set {(t1 - t0) * 1e3:.1f} ms "
              f"({mib / (t1 - t0):.0f} MiB/s), exists {(t2 - t1) * 1e3:.2f} ms, "
              f"get {(t3 - t2) * 1e3:.1f} ms ({mib / (t3 - t2):.0f} MiB/s)")
        for k in (0, n // 2, n - 1):
            s_, d_ = starts(src, P)[k], starts(dst, P)[k]
            assert torch.equal(pool.get_data_page(s_, flat=True).view(torch.int16),
                               pool.get_data_page(d_, flat=True).view(torch.int16))
    finally:
        b.close()
    assert_no_leaks(d, sessions=0)


# -- several processes ----------------------------------------------------------------


def test_processes_share_one_daemon(daemon, tmp_path):
    """Three SGLang processes store their own chains and one common chain at
    once, then each loads every other's pages bit for bit."""
    n = 3
    procs = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "worker", daemon.sock,
         str(tmp_path), str(i), str(n)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(n)]
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        outputs.append(out)
    for i, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"worker {i}:\n{out}"
    results = [json.loads((tmp_path / f"result{i}.json").read_text()) for i in range(n)]
    for r in results:
        assert r["own_set"] == [True] * r["own_pages"]
        assert r["common_set"] == [True] * r["common_pages"]
        assert r["others_exist"] == [r["own_pages"]] * (n - 1)
        assert r["others_bit_exact"] == [True] * (n - 1)
        assert r["common_bit_exact"] is True
    s = daemon.stats()
    # Each common page is cached once, however many processes stored it.
    own, common = results[0]["own_pages"], results[0]["common_pages"]
    assert s.cached_pages == n * own + common, s
    assert_no_leaks(daemon, sessions=0)


# -- the worker process of test_processes_share_one_daemon --------------------------

OWN_PAGES, COMMON_PAGES = 4, 3


def canonical_pages(seed, n, pool):
    """n pages of random bits, (page, layer, kv, head, slot, dim), from seed."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, pool.layer_num, 2, pool.head_num, pool.page_size, pool.head_dim)
    return torch.randint(-2**15, 2**15, shape, generator=g, dtype=torch.int16)


def put_page(pool, start, bits):
    """Writes one (layer, kv, head, slot, dim) page of bits at host slot start."""
    for layer in range(pool.layer_num):
        for kv in range(2):
            for s in range(pool.page_size):
                token_kv(pool, layer, kv, start + s).view(torch.int16).copy_(
                    bits[layer, kv, :, s, :])


def own_tokens(i):
    return list(range(i * 1000, i * 1000 + OWN_PAGES * GEOMETRY["page_size"]))


def worker(endpoint, out_dir, i, n):
    layout = LAYOUTS[i % len(LAYOUTS)]
    pool = host_pool(layout)
    P = pool.page_size
    b = backend(endpoint, pool)
    result = {"layout": layout, "own_pages": OWN_PAGES, "common_pages": COMMON_PAGES}
    own_keys = get_hash_str(own_tokens(i), None, page_size=P)
    own_src = pages(pool, OWN_PAGES)
    for k, s in enumerate(starts(own_src, P)):
        put_page(pool, s, canonical_pages(100 + i, OWN_PAGES, pool)[k])
    common_keys = get_hash_str(list(range(5000, 5000 + COMMON_PAGES * P)), None,
                               page_size=P)
    common = canonical_pages(777, COMMON_PAGES, pool)
    common_src = pages(pool, COMMON_PAGES)
    for k, s in enumerate(starts(common_src, P)):
        put_page(pool, s, common[k])
    half = OWN_PAGES // 2
    result["own_set"] = (b.batch_set_v1(own_keys[:half], own_src[:half * P], info([])) +
                         b.batch_set_v1(own_keys[half:], own_src[half * P:],
                                        info(own_keys[:half])))
    result["common_set"] = b.batch_set_v1(common_keys, common_src, info([]))
    open(os.path.join(out_dir, f"stored{i}"), "w").close()
    deadline = time.monotonic() + 300
    while not all(os.path.exists(os.path.join(out_dir, f"stored{j}")) for j in range(n)):
        if time.monotonic() > deadline:
            raise RuntimeError("the other workers did not store their pages")
        time.sleep(0.05)
    result["others_exist"], result["others_bit_exact"] = [], []
    for j in range(n):
        if j == i:
            continue
        keys = get_hash_str(own_tokens(j), None, page_size=P)
        result["others_exist"].append(b.batch_exists(keys, info([])))
        dst = pages(pool, OWN_PAGES)
        ok = b.batch_get_v1(keys, dst, info([]))
        want = canonical_pages(100 + j, OWN_PAGES, pool)
        result["others_bit_exact"].append(all(ok) and all(
            torch.equal(page_bits(pool, d), want[k])
            for k, d in enumerate(starts(dst, P))))
    dst = pages(pool, COMMON_PAGES)
    ok = b.batch_get_v1(common_keys, dst, info([]))
    result["common_bit_exact"] = all(ok) and all(
        torch.equal(page_bits(pool, d), common[k]) for k, d in enumerate(starts(dst, P)))
    b.close()
    with open(os.path.join(out_dir, f"result{i}.json"), "w") as f:
        json.dump(result, f)


def hang_worker(endpoint, out_dir, *_):
    """Calls the backend in a loop until the parent has stopped and resumed
    the daemon, then checks that hits are back."""
    pool = host_pool("layer_first")
    fill_random(pool, seed=5)
    P = pool.page_size
    b = backend(endpoint, pool)
    keys = get_hash_str(list(range(4 * P)), None, page_size=P)
    src = pages(pool, 4)
    dst = pages(pool, 4)
    result = {"errors": [], "misses": 0, "longest_call_s": 0.0}
    assert b.batch_set_v1(keys, src, info([])) == [True] * 4
    open(os.path.join(out_dir, "ready"), "w").close()

    def timed(fn, *args):
        t0 = time.monotonic()
        out = fn(*args)
        result["longest_call_s"] = max(result["longest_call_s"], time.monotonic() - t0)
        return out

    resumed = os.path.join(out_dir, "resumed")
    while not os.path.exists(resumed):
        try:
            n = timed(b.batch_exists, keys, info([]))
            got = timed(b.batch_get_v1, keys, dst, info([]))
            timed(b.batch_set_v1, keys, src, info([]))
            if n < 4 or not all(got):
                result["misses"] += 1
        except Exception as e:  # pylint: disable=broad-except
            result["errors"].append(repr(e))
            break
        time.sleep(0.01)
    deadline = time.monotonic() + 30
    while b.batch_exists(keys, info([])) < 4 and time.monotonic() < deadline:
        b.batch_set_v1(keys, src, info([]))
        time.sleep(0.05)
    result["hits_after"] = b.batch_exists(keys, info([]))
    fresh = pages(pool, 4)
    ok = b.batch_get_v1(keys, fresh, info([]))
    result["bit_exact_after"] = all(ok) and all(
        torch.equal(page_bits(pool, s), page_bits(pool, d))
        for s, d in zip(starts(src, P), starts(fresh, P)))
    b.close()
    with open(os.path.join(out_dir, "result0.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__" and len(sys.argv) == 6:
    {"worker": worker, "hang": hang_worker}[sys.argv[1]](
        sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
