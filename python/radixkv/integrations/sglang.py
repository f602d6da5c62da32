"""radixkv as an SGLang HiCache storage backend (L3), for sglang 0.5.23.

    python -m sglang.launch_server ... --page-size 16 \\
        --enable-hierarchical-cache --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{
            "backend_name": "radixkv",
            "module_path": "radixkv.integrations.sglang",
            "class_name": "RadixKVStorage",
            "interface_v1": 1,
            "hicache_storage_pass_prefix_keys": true,
            "endpoint": "/run/radixkv/radixkvd.sock"}'

radixkvd must run with --allow_key_mode and a host pool (docs/integrations/
sglang.md). SGLang's factory constructs the class as
RadixKVStorage(storage_config, kwargs) and then calls
register_mem_pool_host(host_pool); the radixkv session opens there, because
the page geometry (layers, heads, head dim, dtype, page size) comes from the
host pool.

Contracts:

* Keys. SGLang names each page by a string (a SHA-256 hex digest chained
  over every earlier page). Its radixkv block key (key mode) is
  chain_key(namespace root, no tokens, extras [("sglang.page", key)]): one
  step of radixkv's block-key function, so the key names its namespace and
  equal SGLang keys of two namespaces never meet in the daemon. A batch's
  keys are looked up and stored as the chain `extra_info.prefix_keys +
  keys` from block 0, so the daemon's tree follows SGLang's prefixes.
  Without prefix_keys (SGLang's hicache_storage_pass_prefix_keys off, or
  the tensor forms get/set/batch_get/batch_set, which SGLang calls without
  them) the chain starts at the batch's first key: hits are then only as
  good as the batching lines up, but a hit is never another page's data,
  because each SGLang key already covers every earlier token.
* Namespace. model = storage_config.model_name (or extra_config "model"),
  model_revision = extra_config "model_revision" + "#sglang.hicache.v1" and
  tags for MLA, pipeline and attention context-parallel shards, lora and
  cache_salt from extra_config, the host pool's geometry, and tp_rank /
  tp_size from storage_config (MLA: 0 / 1, the latent is the same on every
  rank). Two models, two TP shards or two geometries never share a block.
* Page layout. A radixkv page is (layer, {K, V}, kv_head, slot, dim).
  Every SGLang MHA host layout (layer_first, page_first, page_first_direct,
  page_head) is converted by one strided copy per page (NumPy views, bit
  for bit). An MLA page holds the latent rows in (layer, slot, latent)
  order in the page's elements (num_kv_heads 1, head_dim = latent / 2).
  fp8 caches (SGLang keeps them in uint8; extra_config kv_cache_dtype
  names the format) are stored as they are, each radixkv page scale 1.0.
* Faults. A daemon that is away, slow or restarting costs hits, never an
  exception: exists/batch_exists answer False / 0, gets miss, sets answer
  False. Input that cannot be right (keys that are not strings, index or
  tensor sizes and dtypes that do not fit the pool) raises ValueError or
  TypeError naming the argument.
* Writes are committed only after their copies into the pages returned;
  a set whose prefix the daemon no longer holds stores nothing (False), as
  radixkv caches blocks only after their parent.

Thread safety: SGLang calls a backend from its prefetch and backup threads
at once; radixkv.Client is thread-safe and each call uses its own lease.
"""
import logging
import struct
import threading
from typing import Any, List, Optional, Sequence

import numpy as np
import torch
import xxhash

import radixkv
from radixkv import errors as rkv_errors
from radixkv.client import grpc_target
from radixkv.keys import chain_key
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage,
                                                  HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo)

__all__ = ["RadixKVStorage", "page_key", "namespace_for", "NAMESPACE_TAG", "KEY_TAG"]

logger = logging.getLogger(__name__)

# Part of every namespace this backend makes (in model_revision): the byte
# layout of its pages and the key function (page_key).
NAMESPACE_TAG = "sglang.hicache.v1"

_TORCH_TO_RKV_DTYPE = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int8: "int8",
}
for _name, _rkv in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")):
    if hasattr(torch, _name):
        _TORCH_TO_RKV_DTYPE[getattr(torch, _name)] = _rkv
_FP8_NAMES = ("fp8_e4m3", "fp8_e5m2")
_SCALED = frozenset(_FP8_NAMES + ("int8",))

# Per host layout: the shape of one page as the host pool stores it (and as
# its flat data pages are ordered), and the permutation to radixkv's order.
# MHA: radixkv order (layer, kv, head, slot, dim).
_MHA_LAYOUTS = {
    "layer_first": ("kv layer slot head dim", (1, 0, 3, 2, 4)),
    "page_first": ("kv slot layer head dim", (2, 0, 3, 1, 4)),
    "page_first_direct": ("kv layer slot head dim", (1, 0, 3, 2, 4)),
    "page_head": ("kv head slot layer dim", (3, 0, 1, 2, 4)),
}
# MLA: radixkv order (layer, slot, latent).
_MLA_LAYOUTS = {
    "layer_first": ("layer slot latent", (0, 1, 2)),
    "page_first": ("slot layer latent", (1, 0, 2)),
    "page_first_direct": ("layer slot latent", (0, 1, 2)),
}

# The extra (tag) under which an SGLang page key enters its radixkv key.
KEY_TAG = "sglang.page"
# What follows the root in every page key's hash input: u32(0) tokens,
# u32(1) extra, str(KEY_TAG); then str(key) (docs/CONTRACTS.md §1.1, §1.3).
_KEY_HEAD = (struct.pack("<II", 0, 1) + struct.pack("<I", len(KEY_TAG.encode())) +
             KEY_TAG.encode())


def page_key(root: bytes, key: str) -> bytes:
    """The 16-byte radixkv block key of SGLang page key `key` in the
    namespace with root `root`: one step of the block-key function
    (docs/CONTRACTS.md §1.3) from the root, with no tokens and the single
    extra (KEY_TAG, key). SGLang's key already covers every earlier token of
    the sequence; the root makes the key name its namespace, so two
    namespaces never present the same key to the daemon."""
    if not isinstance(key, str):
        raise TypeError(f"key: SGLang page keys are str, got {type(key).__name__}")
    if not key:
        raise ValueError("key: empty page key")
    return chain_key(root, (), ((KEY_TAG, key),))


def _check_keys(keys: Sequence[str], field: str) -> Sequence[str]:
    """`keys` when it is a sequence of non-empty str; TypeError naming the
    field (and index) otherwise."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"{field}: a list of str page keys is required, got "
                        f"{type(keys).__name__}")
    for i, key in enumerate(keys):
        if not isinstance(key, str) or not key:
            raise TypeError(f"{field}[{i}]: a non-empty str page key is required, "
                            f"got {key!r}")
    return keys


def _keys(root: bytes, keys: Sequence[str], field: str) -> List[bytes]:
    """page_key(root, k) of each key: the same bytes, with the constant head
    (root, no tokens, one extra, its tag) hashed in once per call."""
    head = root + _KEY_HEAD
    h = xxhash.xxh3_128_digest
    return [h(head + struct.pack("<I", len(b)) + b)
            for b in (k.encode("utf-8") for k in _check_keys(keys, field))]


class _Geometry:
    """One page of the registered host pool: its radixkv shape, and how the
    host pool stores it."""

    def __init__(self, host, is_mla: bool, kv_cache_dtype: Optional[str] = None):
        layout = getattr(host, "layout", None)
        self.layout = layout
        self.is_mla = is_mla
        self.page_size = int(host.page_size)
        self.layer_num = int(host.layer_num)
        self.dtype = host.dtype
        self.kv_buffer = host.kv_buffer
        if self.dtype == torch.uint8:
            # SGLang stores fp8 KV caches as uint8: the format must be named.
            if kv_cache_dtype not in _FP8_NAMES:
                raise ValueError(
                    "mem_pool_host.dtype: torch.uint8 (SGLang's storage of an fp8 KV "
                    "cache): set extra_config.kv_cache_dtype to "
                    f"{' or '.join(repr(n) for n in _FP8_NAMES)}, got {kv_cache_dtype!r}")
            self.rkv_dtype = kv_cache_dtype
        elif self.dtype in _TORCH_TO_RKV_DTYPE:
            self.rkv_dtype = _TORCH_TO_RKV_DTYPE[self.dtype]
            if kv_cache_dtype is not None and kv_cache_dtype != self.rkv_dtype:
                raise ValueError(
                    f"extra_config.kv_cache_dtype: {kv_cache_dtype!r} differs from the "
                    f"host pool's dtype {self.dtype} ({self.rkv_dtype!r})")
        else:
            raise ValueError(
                f"mem_pool_host.dtype: {self.dtype} has no radixkv dtype (supported: "
                f"{', '.join(str(d) for d in _TORCH_TO_RKV_DTYPE)}, and torch.uint8 "
                "with extra_config.kv_cache_dtype)")
        if self.kv_buffer is None or not isinstance(self.kv_buffer, torch.Tensor):
            raise ValueError("mem_pool_host.kv_buffer: the host pool has no single "
                             "KV tensor (a layout this backend cannot address)")
        if is_mla:
            if layout not in _MLA_LAYOUTS:
                raise ValueError(f"mem_pool_host.layout: {layout!r} is not supported "
                                 f"for MLA (supported: {', '.join(_MLA_LAYOUTS)})")
            self.latent = int(host.kv_cache_dim)
            if self.latent % 2:
                raise ValueError(f"mem_pool_host.kv_cache_dim: {self.latent} is odd; "
                                 "an MLA page is stored as head_dim = latent / 2")
            self.num_kv_heads, self.head_dim = 1, self.latent // 2
            self.rkv_shape = (self.layer_num, self.page_size, self.latent)
            order, self.perm = _MLA_LAYOUTS[layout]
            sizes = {"layer": self.layer_num, "slot": self.page_size,
                     "latent": self.latent}
        else:
            if layout not in _MHA_LAYOUTS:
                raise ValueError(f"mem_pool_host.layout: {layout!r} is not supported "
                                 f"(supported: {', '.join(_MHA_LAYOUTS)})")
            v_head_dim = int(getattr(host, "v_head_dim", host.head_dim))
            if v_head_dim != int(host.head_dim):
                raise ValueError(
                    f"mem_pool_host.v_head_dim: {v_head_dim} differs from head_dim "
                    f"{host.head_dim}; a radixkv page holds K and V of one head_dim")
            self.num_kv_heads, self.head_dim = int(host.head_num), int(host.head_dim)
            self.rkv_shape = (self.layer_num, 2, self.num_kv_heads, self.page_size,
                              self.head_dim)
            order, self.perm = _MHA_LAYOUTS[layout]
            sizes = {"kv": 2, "layer": self.layer_num, "slot": self.page_size,
                     "head": self.num_kv_heads, "dim": self.head_dim}
        self.host_page_shape = tuple(sizes[a] for a in order.split())
        self.page_elems = 1
        for s in self.host_page_shape:
            self.page_elems *= s
        self.host_tokens = int(host.size)
        if self.kv_buffer.device.type != "cpu":
            raise ValueError(f"mem_pool_host.kv_buffer: on {self.kv_buffer.device}; "
                             "the host pool must be in host memory")
        self.host_raw = _raw(self.kv_buffer)
        self.raw = self.host_raw.dtype
        self.elems = self.page_elems
        # radixkv pages of fp8 and int8 end in one fp32 scale per (layer, K|V,
        # head) run, from the next multiple of 16 bytes after the elements.
        self.scaled = self.rkv_dtype in _SCALED
        elems_bytes = self.elems * self.raw.itemsize
        self.scale_offset = -(-elems_bytes // 16) * 16

    def spec_fields(self) -> dict:
        return dict(num_layers=self.layer_num, num_kv_heads=self.num_kv_heads,
                    head_dim=self.head_dim, page_size=self.page_size,
                    dtype=self.rkv_dtype)

    # Copies go through NumPy views of the same memory, as unsigned integers
    # of the element size: bit for bit, single-threaded (torch's intra-op
    # threads make small strided copies many times slower on a busy host).
    def host_page(self, token_index: int) -> np.ndarray:
        """The host pool's page starting at host slot `token_index`, as a view
        of kv_buffer in radixkv's order (no copy)."""
        p, b = self.page_size, self.host_raw
        i = token_index
        if self.is_mla:
            if self.layout == "layer_first":
                view = b[:, i:i + p, 0, :]
            elif self.layout == "page_first":
                view = b[i:i + p, :, 0, :]
            else:
                view = b[i // p, :, :, 0, :]
        elif self.layout == "layer_first":
            view = b[:, :, i:i + p]
        elif self.layout == "page_first":
            view = b[:, i:i + p]
        else:  # page_first_direct, page_head: one page per index of axis 1
            view = b[:, i // p]
        return view.transpose(self.perm)

    def flat_page(self, flat: torch.Tensor) -> np.ndarray:
        """A flat data page (SGLang's get_data_page / set_from_flat_data_page
        order for this layout) as a view in radixkv's order."""
        return _raw(flat).reshape(self.host_page_shape).transpose(self.perm)

    def page_view(self, lease, i: int, write: bool = False) -> np.ndarray:
        """Page i of a lease in radixkv's order (MLA: (layer, slot, latent)
        over the page's elements), a view of the daemon's shared memory.
        Scaled dtypes (fp8, int8; docs/CONTRACTS.md §2.1): the elements are
        SGLang's bytes as they are, with SGLang's own per-layer scales; with
        `write` every run's radixkv scale is set to 1.0 (the elements are
        taken as stored)."""
        mem = lease.page(i)
        page = np.frombuffer(mem, dtype=self.raw, count=self.elems)
        if write and self.scaled:
            runs = self.layer_num * 2 * self.num_kv_heads
            np.frombuffer(mem, dtype="<f4", count=runs, offset=self.scale_offset)[:] = 1.0
        return page.reshape(self.rkv_shape)


_TORCH_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _raw(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as a NumPy array of unsigned integers of its
    element size (no copy)."""
    size = t.element_size()
    return t.view(_TORCH_RAW[size]).numpy().view(np.dtype(f"u{size}"))


def _revision(config: HiCacheStorageConfig, revision: str) -> str:
    """model_revision: the user's revision, then '#', NAMESPACE_TAG and a tag
    per shard kind that changes what a page holds (mla; ppR of S for a
    pipeline stage's layers; cpR of S, dcpR of S for context-parallel
    slices)."""
    tags = [NAMESPACE_TAG]
    if config.is_mla_model:
        tags.append("mla")
    if config.pp_size > 1:
        tags.append(f"pp{config.pp_rank}of{config.pp_size}")
    if config.attn_cp_size > 1:
        tags.append(f"cp{config.attn_cp_rank}of{config.attn_cp_size}")
    if getattr(config, "dcp_size", 1) > 1:
        tags.append(f"dcp{config.dcp_rank}of{config.dcp_size}")
    return f"{revision}#{','.join(tags)}"


def namespace_for(storage_config: HiCacheStorageConfig, mem_pool_host) -> "radixkv.NamespaceSpec":
    """The radixkv namespace of an SGLang rank: model (extra_config.model or
    storage_config.model_name), model_revision (see _revision), lora and
    cache_salt from extra_config, the host pool's geometry and dtype, and
    tp_rank / tp_size (MLA: 0 / 1, one namespace for all ranks)."""
    extra = storage_config.extra_config or {}
    model = extra.get("model") or storage_config.model_name
    if not model:
        raise ValueError("storage_config.model_name: empty; set SGLang's model "
                         "name or extra_config.model (the radixkv namespace's model)")
    geometry = _Geometry(mem_pool_host, bool(storage_config.is_mla_model),
                         extra.get("kv_cache_dtype"))
    mla = bool(storage_config.is_mla_model)
    tp_rank, tp_size = (0, 1) if mla else (storage_config.tp_rank, storage_config.tp_size)
    return radixkv.NamespaceSpec(
        model=model, model_revision=_revision(storage_config, extra.get("model_revision") or ""),
        lora=extra.get("lora") or "", cache_salt=extra.get("cache_salt") or "",
        tp_rank=tp_rank, tp_size=tp_size, **geometry.spec_fields())


class RadixKVStorage(HiCacheStorage):
    """SGLang's HiCacheStorage over radixkvd; see the module docstring.

    storage_config: SGLang's HiCacheStorageConfig; its extra_config (the
    --hicache-storage-backend-extra-config JSON) may set endpoint,
    model, model_revision, lora, cache_salt, kv_cache_dtype, client_name,
    call_timeout, initial_wait (docs/integrations/sglang.md). kwargs: what
    SGLang's factory passes after it (unused)."""

    _OPTIONS = ("backend_name", "module_path", "class_name", "interface_v1",
                "endpoint", "model", "model_revision", "lora", "cache_salt",
                "client_name", "call_timeout", "initial_wait", "allocator",
                "kv_cache_dtype")

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None):
        if not isinstance(storage_config, HiCacheStorageConfig):
            raise TypeError("storage_config: an SGLang HiCacheStorageConfig is "
                            f"required, got {type(storage_config).__name__}")
        extra = storage_config.extra_config or {}
        if not isinstance(extra, dict):
            raise TypeError("storage_config.extra_config: a dict is required, got "
                            f"{type(extra).__name__}")
        for name in ("endpoint", "model", "model_revision", "lora", "cache_salt",
                     "client_name", "kv_cache_dtype"):
            if name in extra and extra[name] is not None and not isinstance(extra[name], str):
                raise TypeError(f"extra_config.{name}: a string is required, got "
                                f"{type(extra[name]).__name__}")
        for name in ("call_timeout", "initial_wait"):
            if name in extra and (not isinstance(extra[name], (int, float)) or
                                  isinstance(extra[name], bool) or extra[name] < 0):
                raise ValueError(f"extra_config.{name}: a non-negative number of "
                                 f"seconds is required, got {extra[name]!r}")
        unknown = sorted(set(extra) - set(self._OPTIONS))
        if unknown:
            logger.info("radixkv storage: extra_config keys not used here: %s", unknown)
        model = extra.get("model") or storage_config.model_name
        if not model:
            raise ValueError("storage_config.model_name: empty; set SGLang's model "
                             "name or extra_config.model (the radixkv namespace's model)")
        self.storage_config = storage_config
        self.model = model
        self.endpoint = extra.get("endpoint")
        grpc_target(self.endpoint)  # InvalidArgument (field "endpoint") now
        self.client_name = extra.get("client_name") or (
            f"sglang-tp{storage_config.tp_rank}")
        self.call_timeout = float(extra.get("call_timeout", 2.0))
        self.initial_wait = float(extra.get("initial_wait", 2.0))
        if self.call_timeout <= 0:
            raise ValueError("extra_config.call_timeout: must be positive")
        self.is_mla = bool(storage_config.is_mla_model)
        self.client: Optional["radixkv.Client"] = None
        self.namespace: Optional[radixkv.NamespaceSpec] = None
        self._geometry: Optional[_Geometry] = None
        self._lock = threading.Lock()
        self._warned_no_prefix = False

    # -- setup ---------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Keeps the host pool and opens the radixkv session in the namespace
        of its geometry. Raises ValueError (naming mem_pool_host.<field>) for
        a pool this backend cannot address, and radixkv's InvalidArgument /
        FailedPrecondition when the daemon refuses the namespace (e.g.
        another page size than its pool's). A daemon that is down is no
        error: the session opens when it comes up."""
        super().register_mem_pool_host(mem_pool_host)
        extra = self.storage_config.extra_config or {}
        geometry = _Geometry(mem_pool_host, self.is_mla, extra.get("kv_cache_dtype"))
        spec = namespace_for(self.storage_config, mem_pool_host)
        client = radixkv.Client(
            endpoint=self.endpoint, namespace=spec, client_name=self.client_name,
            attach_pool=True, call_timeout=self.call_timeout,
            initial_wait=self.initial_wait)
        with self._lock:
            old, self.client = self.client, client
            self.namespace, self._geometry = spec, geometry
        if old is not None:
            old.close()

    def close(self) -> None:
        """Ends the radixkv session (SGLang calls it on detach)."""
        with self._lock:
            client, self.client = self.client, None
        if client is not None:
            client.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # pylint: disable=broad-except
            pass

    # -- helpers ---------------------------------------------------------------

    def _ready(self):
        """(client, geometry), or (None, None) before register_mem_pool_host."""
        with self._lock:
            return self.client, self._geometry

    def _chain(self, client, keys: Sequence[str], extra_info) -> tuple:
        """(prefix block keys, this batch's block keys) in client's namespace."""
        root = client.namespace_root
        mine = _keys(root, keys, "keys")
        prefix_keys = getattr(extra_info, "prefix_keys", None) if extra_info else None
        if prefix_keys is None:
            if not self._warned_no_prefix and extra_info is not None:
                self._warned_no_prefix = True
                logger.warning(
                    "radixkv storage: SGLang passes no prefix_keys; each batch is "
                    "keyed as a chain of its own (set "
                    "\"hicache_storage_pass_prefix_keys\": true in the extra config)")
            return [], mine
        return _keys(root, prefix_keys, "extra_info.prefix_keys"), mine

    def _host_indices(self, host_indices, n_keys: int, geometry: _Geometry) -> List[int]:
        """The first host slot of each key's page, checked against the pool."""
        if not isinstance(host_indices, torch.Tensor):
            raise TypeError("host_indices: a torch tensor of host-pool slots is "
                            f"required, got {type(host_indices).__name__}")
        if host_indices.dtype.is_floating_point or host_indices.dtype == torch.bool:
            raise TypeError(f"host_indices: integer slots are required, got dtype "
                            f"{host_indices.dtype}")
        p = geometry.page_size
        want = n_keys * p
        if host_indices.numel() != want:
            raise ValueError(
                f"host_indices: {host_indices.numel()} slots for {n_keys} keys of "
                f"page_size {p} (want {want})")
        pages = host_indices.reshape(n_keys, p).to(torch.int64)
        steps = pages - pages[:, :1]
        if n_keys and not torch.equal(steps, torch.arange(p).expand(n_keys, p)):
            bad = int((steps != torch.arange(p)).any(dim=1).nonzero()[0, 0])
            raise ValueError(
                f"host_indices[{bad * p}:{bad * p + p}]: the slots of one page must be "
                f"consecutive, got {pages[bad].tolist()}")
        starts = pages[:, 0].tolist()
        for i, s in enumerate(starts):
            if s % p or not 0 <= s <= geometry.host_tokens - p:
                raise ValueError(
                    f"host_indices[{i * p}]: slot {s} does not start a page of the "
                    f"host pool (page_size {p}, {geometry.host_tokens} slots)")
        return starts

    def _check_page_tensor(self, t, field: str, geometry: _Geometry) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{field}: a torch tensor is required, got {type(t).__name__}")
        if t.dtype != geometry.dtype:
            raise ValueError(f"{field}: dtype {t.dtype}, the host pool's is "
                             f"{geometry.dtype}")
        if t.numel() != geometry.page_elems:
            raise ValueError(f"{field}: {t.numel()} elements, a page holds "
                             f"{geometry.page_elems} {tuple(geometry.host_page_shape)}")
        if t.device.type != "cpu":
            raise ValueError(f"{field}: on {t.device}, pages are copied on the host (cpu)")
        if not t.is_contiguous():
            raise ValueError(f"{field}: must be contiguous (a flat data page)")

    def _matched(self, client, chain: List[bytes]) -> int:
        """Leading blocks of `chain` the daemon holds (pool and tiers); 0 when
        it does not answer."""
        try:
            r = client.match_keys(chain)
        except rkv_errors.Error as e:
            logger.debug("radixkv storage: match failed: %s", e)
            return 0
        return r.matched_blocks + r.tier_matched_blocks

    # -- lookups ---------------------------------------------------------------

    def exists(self, key: str) -> bool:
        """Whether `key` is cached as the first page of a chain."""
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many leading keys of `keys` are cached after prefix_keys."""
        client, _ = self._ready()
        if client is None:
            _check_keys(keys, "keys")
            return 0
        prefix, mine = self._chain(client, keys, extra_info)
        if not mine:
            return 0
        return max(0, min(len(mine), self._matched(client, prefix + mine) - len(prefix)))

    # -- reads -----------------------------------------------------------------

    def _read(self, keys, extra_info, copy_out) -> List[bool]:
        """Pins the chain's cached pages, calls copy_out(k, page) for each hit
        of this batch in order, releases. One bool per key."""
        client, geometry = self._ready()
        if client is None:
            return [False] * len(_check_keys(keys, "keys"))
        prefix, mine = self._chain(client, keys, extra_info)
        result = [False] * len(mine)
        if not mine:
            return result
        try:
            lease = client.acquire_keys(prefix + mine, allocate=False)
        except rkv_errors.Error as e:
            logger.warning("radixkv storage: read refused: %s", e)
            return result
        with lease:
            hits = max(0, min(len(mine), lease.matched_blocks - len(prefix)))
            try:
                for k in range(hits):
                    copy_out(k, geometry.page_view(lease, len(prefix) + k))
            except rkv_errors.LeaseLost:
                return result
            # The copies finished (synchronous CPU copies): were the pages still pinned?
            if hits and lease.confirm_read():
                result[:hits] = [True] * hits
        return result

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Copies the cached pages of `keys` into the host pool at
        host_indices (page_size slots per key). True for the leading hits."""
        client, geometry = self._ready()
        if geometry is None:
            return [False] * len(_check_keys(keys, "keys"))
        starts = self._host_indices(host_indices, len(keys), geometry)

        def copy_out(k, page):
            np.copyto(geometry.host_page(starts[k]), page)
        return self._read(keys, extra_info, copy_out)

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        """Fills the flat data pages target_locations[i] (SGLang's
        get_dummy_flat_data_page) with the cached pages; the tensor for a
        hit, None for a miss."""
        _, geometry = self._ready()
        if geometry is None:
            return [None] * len(_check_keys(keys, "keys"))
        if target_locations is None or len(target_locations) != len(keys):
            raise ValueError(
                f"target_locations: {0 if target_locations is None else len(target_locations)} "
                f"tensors for {len(keys)} keys")
        for i, t in enumerate(target_locations):
            self._check_page_tensor(t, f"target_locations[{i}]", geometry)

        def copy_out(k, page):
            np.copyto(geometry.flat_page(target_locations[k]), page)
        ok = self._read(keys, None, copy_out)
        return [t if hit else None for t, hit in zip(target_locations, ok)]

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        """One page into the flat tensor target_location (allocated when
        None); None on a miss."""
        _, geometry = self._ready()
        if geometry is None:
            return None
        if target_location is None:
            target_location = torch.empty(geometry.page_elems, dtype=geometry.dtype)
        return self.batch_get([key], [target_location])[0]

    # -- writes ----------------------------------------------------------------

    def _write(self, keys, extra_info, copy_in) -> List[bool]:
        """Allocates pages for the chain's uncached blocks, calls copy_in(k,
        page) for each of this batch's new blocks, commits them. One bool per
        key: True when it is cached afterwards."""
        client, geometry = self._ready()
        if client is None:
            return [False] * len(_check_keys(keys, "keys"))
        prefix, mine = self._chain(client, keys, extra_info)
        result = [False] * len(mine)
        if not mine:
            return result
        if not self.storage_config.is_storage_writer:
            return result  # an MLA replica: rank 0 of its group writes the pages
        try:
            lease = client.acquire_keys(prefix + mine, allocate=True)
        except rkv_errors.Error as e:
            logger.warning("radixkv storage: write refused: %s", e)
            return result
        with lease:
            if lease.degraded:
                return result
            matched = lease.matched_blocks
            if matched < len(prefix):
                # The prefix is no longer cached: blocks after it cannot be.
                return result
            cached = min(len(mine), matched - len(prefix))
            result[:cached] = [True] * cached
            new = lease.new_blocks
            if not new:
                return result
            try:
                for j in range(new):
                    copy_in(cached + j, geometry.page_view(lease, matched + j, write=True))
                response = lease.commit(new)
            except rkv_errors.Error as e:
                logger.warning("radixkv storage: %d pages not stored: %s", new, e)
                return result
            stored = response.inserted + response.deduplicated
            for k in range(cached, min(len(mine), cached + stored)):
                result[k] = True
        return result

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Stores the host pool's pages at host_indices under `keys`. True
        for each key cached afterwards (a page cached before counts)."""
        _, geometry = self._ready()
        if geometry is None:
            return [False] * len(_check_keys(keys, "keys"))
        starts = self._host_indices(host_indices, len(keys), geometry)

        def copy_in(k, page):
            np.copyto(page, geometry.host_page(starts[k]))
        return self._write(keys, extra_info, copy_in)

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores flat data pages (SGLang's get_data_page(flat=True) of the
        registered host pool) under `keys`; True when all are cached."""
        _, geometry = self._ready()
        if geometry is None:
            _check_keys(keys, "keys")
            return False
        if values is None or len(values) != len(keys):
            raise ValueError(f"values: {0 if values is None else len(values)} tensors "
                             f"for {len(keys)} keys")
        for i, t in enumerate(values):
            self._check_page_tensor(t, f"values[{i}]", geometry)

        def copy_in(k, page):
            np.copyto(page, geometry.flat_page(values[k]))
        return all(self._write(keys, None, copy_in)) and len(keys) > 0

    def set(self, key: str, value: Optional[Any] = None,
            target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        """Stores one flat data page under `key`."""
        return self.batch_set([key], [value])

    # -- the rest ----------------------------------------------------------------

    def clear(self) -> None:
        """Nothing: dropping cached blocks is an operator action
        (radixkvctl evict / clear), shared by every engine of the daemon."""

    def get_stats(self):
        """None: SGLang's storage metrics are SGLang's own (daemon_stats()
        gives radixkvd's)."""
        return None

    def daemon_stats(self):
        """radixkvd's radixkv.v1.Stats (raises radixkv.Unavailable when the
        daemon does not answer)."""
        client, _ = self._ready()
        if client is None:
            raise rkv_errors.FailedPrecondition(
                "daemon_stats: no host pool registered yet", field="mem_pool_host")
        return client.stats()
