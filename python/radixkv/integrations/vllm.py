"""radixkv as a vLLM KV connector: RadixKVConnector (KVConnectorBase_V1).

Load it with

    --kv-transfer-config '{"kv_connector": "RadixKVConnector",
        "kv_connector_module_path": "radixkv.integrations.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"endpoint": "/run/radixkv/radixkvd.sock"}}'

docs/integrations/vllm.md describes the flags, the extra_config keys and
what is proven. The contracts this module keeps:

* One namespace per engine configuration, derived from vLLM's config
  (namespace_for_vllm_config): model, revision (plus anything else that
  changes K/V bytes), KV dtype, layers, KV heads, head dim, and
  page_size = vLLM's block size. All tensor-parallel ranks share it: the
  namespace holds every KV head (tp_size 1) and rank r reads and writes only
  its contiguous sub-run of heads in each (layer, K/V) run of a page.
* Scheduler side: one radixkv.Client (no pool mapping). The first
  get_num_new_matched_tokens of a request acquires its prompt's full blocks
  (token mode) and keeps the lease under the request id; later calls answer
  from that lease. At most n - 1 tokens of an n-token sequence are reported,
  rounded down to blocks. The lease lives until its loads are acknowledged
  and its new blocks are committed, or until the request finishes, is
  aborted or preempted; it is never released while a worker may still be
  writing its pages.
* Worker side: no session of its own. Each worker maps the pool with the
  scheduler session's id (radixkv.attach), so the daemon counts it as a
  writer of that session's pages (a killed worker never leaves a page to be
  reused while it is written), and a daemon restart makes stale page
  numbers unusable (the attach is refused) instead of pointing into another
  session's pages.
* Loads finish before start_load_kv returns; saves finish before
  save_kv_layer returns. The worker reports the saved blocks
  (build_connector_worker_meta); the scheduler commits a block, in block
  order, once every worker of the engine reported it saved.
* Anything that goes wrong on the way (daemon down, restarting, refusing,
  a lease too close to its expiry, a failed attach) is a miss or a load
  error vLLM recomputes, never a failed request and never K/V read from a
  page that is not the cached block.
"""
import dataclasses
import json
import logging
import re
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

import radixkv
from radixkv import errors
from radixkv.errors import InvalidArgument
from radixkv.keys import NamespaceSpec

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole,
    KVConnectorWorkerMetadata, SupportsHMA)

__all__ = ["RadixKVConnector", "RadixKVConnectorMetadata", "RadixKVWorkerMetadata",
           "LoadSpec", "SaveSpec", "namespace_for_vllm_config", "kv_layer_views",
           "EXTRA_CONFIG_KEYS"]

logger = logging.getLogger("radixkv.integrations.vllm")

# kv_connector_extra_config keys this connector reads; any other key is an
# InvalidArgument naming it.
EXTRA_CONFIG_KEYS = {
    "endpoint": "daemon endpoint: /path, unix:/path or host:port (default: "
                "$RADIXKVCTL_ENDPOINT, else the daemon's default socket)",
    "model": "namespace.model (default: vLLM's served model path or name)",
    "model_revision": "namespace.model_revision, used verbatim (default: "
                      "derived from the revision, quantization, KV cache dtype "
                      "and RoPE settings)",
    "cache_salt": "namespace.cache_salt: the deployment's tenant salt (default \"\")",
    "client_name": "session name shown by radixkvctl sessions (default vllm-<role>)",
    "call_timeout": "seconds, deadline of Acquire/Commit (default 2.0)",
    "initial_wait": "seconds the scheduler waits for its first session at start "
                    "(default 2.0; 0: do not wait)",
    "min_lease_time_left": "seconds a lease must still be live for when a load "
                           "or save is planned (default 1.0)",
    "attach_timeout": "seconds, deadline of a worker's pool attach (default 5.0)",
    "kv_packing": "override of how the attention backend packs K and V in a "
                  "block: \"content_split\" or \"head_blocks\" (default: from "
                  "the backend)",
}

# Backends whose per-layer view [B, H, N, C] holds K in C[:D] and V in C[D:]
# (vLLM 0.33, RFC #42082 layouts: any stride order).
_CONTENT_SPLIT_BACKENDS = {"FLASH_ATTN", "TRITON_ATTN", "FLASHINFER", "FLEX_ATTENTION"}
# Backends that read each (block, head) run of N * C elements as K of the N
# slots followed by V of the N slots (the CPU backend's view
# [B, H, 2N, D].chunk(2, dim=2)).
_HEAD_BLOCKS_BACKENDS = {"CPU_ATTN"}

_TORCH_TO_RADIXKV = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
}
_CACHE_DTYPE_TO_RADIXKV = {
    "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32",
    "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
}


def _bad(field: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{field}: {message}", field=field,
                           reason=errors.REASON_INVALID)


# ---------------------------------------------------------------------------
# Configuration and namespace
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Settings:
    endpoint: Optional[str]
    client_name: str
    call_timeout: float
    initial_wait: float
    min_lease_time_left: float
    attach_timeout: float
    kv_packing: Optional[str]


def _settings(extra: Dict[str, Any], role: str) -> _Settings:
    extra = dict(extra or {})
    for key in extra:
        if key not in EXTRA_CONFIG_KEYS:
            raise _bad(f"kv_connector_extra_config.{key}",
                       f"unknown key; known keys: {sorted(EXTRA_CONFIG_KEYS)}")

    def seconds(key, default, allow_zero=False):
        value = extra.get(key, default)
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise _bad(f"kv_connector_extra_config.{key}",
                       f"{value!r} is not a number of seconds") from None
        if value < 0 or (value == 0 and not allow_zero):
            raise _bad(f"kv_connector_extra_config.{key}",
                       f"{value} must be {'non-negative' if allow_zero else 'positive'}")
        return value

    for key in ("endpoint", "model", "model_revision", "cache_salt", "client_name",
                "kv_packing"):
        if key in extra and not isinstance(extra[key], str):
            raise _bad(f"kv_connector_extra_config.{key}", "must be a string")
    packing = extra.get("kv_packing")
    if packing is not None and packing not in ("content_split", "head_blocks"):
        raise _bad("kv_connector_extra_config.kv_packing",
                   f"{packing!r}: use \"content_split\" or \"head_blocks\"")
    return _Settings(
        endpoint=extra.get("endpoint"),
        client_name=extra.get("client_name", f"vllm-{role}"),
        call_timeout=seconds("call_timeout", 2.0),
        initial_wait=seconds("initial_wait", 2.0, allow_zero=True),
        min_lease_time_left=seconds("min_lease_time_left", 1.0, allow_zero=True),
        attach_timeout=seconds("attach_timeout", 5.0),
        kv_packing=packing)


def _kv_dtype(vllm_config) -> str:
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    if cache_dtype == "auto":
        dtype = vllm_config.model_config.dtype
        if dtype not in _TORCH_TO_RADIXKV:
            raise _bad("model_config.dtype", f"{dtype} has no radixkv KV dtype")
        return _TORCH_TO_RADIXKV[dtype]
    if cache_dtype not in _CACHE_DTYPE_TO_RADIXKV:
        raise _bad("cache_config.cache_dtype",
                   f"{cache_dtype!r} is not supported (supported: auto, "
                   f"{', '.join(sorted(_CACHE_DTYPE_TO_RADIXKV))})")
    return _CACHE_DTYPE_TO_RADIXKV[cache_dtype]


def _num_layers(model_config) -> int:
    text = model_config.hf_text_config
    for name in ("num_hidden_layers", "num_layers", "n_layer"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise _bad("model_config.hf_config.num_hidden_layers",
               "the model config names no number of layers")


def _derived_revision(vllm_config) -> str:
    """Everything that changes K/V bytes without changing the layout: the
    weights' revision, the weight quantization, the KV cache dtype string
    (fp8 scales follow from the checkpoint and this setting) and RoPE."""
    mc = vllm_config.model_config
    text = mc.hf_text_config
    rope = {}
    for name in ("rope_scaling", "rope_theta", "rope_parameters"):
        value = getattr(text, name, None)
        if value is not None:
            rope[name] = value
    parts = {
        "revision": mc.revision or "",
        "quantization": str(mc.quantization or ""),
        "kv_cache_dtype": str(vllm_config.cache_config.cache_dtype),
        "rope": rope,
    }
    return "vllm:" + json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class _Geometry:
    spec: NamespaceSpec        # the namespace (all KV heads, tp_size 1)
    tp_size: int
    heads_per_rank: int


def namespace_for_vllm_config(vllm_config, extra: Optional[Dict[str, Any]] = None
                              ) -> NamespaceSpec:
    """The radixkv namespace of a vLLM engine configuration (see the module
    docstring); `extra` defaults to the config's kv_connector_extra_config.
    InvalidArgument naming the field for a configuration the connector
    cannot serve."""
    if extra is None:
        kt = getattr(vllm_config, "kv_transfer_config", None)
        extra = dict(getattr(kt, "kv_connector_extra_config", None) or {})
    return _geometry(vllm_config, extra).spec


def _geometry(vllm_config, extra: Dict[str, Any]) -> _Geometry:
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    if mc is None:
        raise _bad("model_config", "vLLM config without a model")
    if getattr(mc, "use_mla", False):
        raise _bad("model_config.use_mla", "MLA latent caches are not supported")
    head_dim = mc.get_head_size()
    head_dim_v = getattr(mc, "get_head_size_v", None)
    if callable(head_dim_v) and head_dim_v() not in (None, head_dim):
        raise _bad("model_config.head_size_v",
                   f"{head_dim_v()} differs from head_size {head_dim}")
    total_heads = mc.get_total_num_kv_heads()
    tp = pc.tensor_parallel_size
    if total_heads >= tp:
        if total_heads % tp:
            raise _bad("parallel_config.tensor_parallel_size",
                       f"{tp} does not divide the {total_heads} KV heads")
        per_rank = total_heads // tp
    else:
        if tp % total_heads:
            raise _bad("parallel_config.tensor_parallel_size",
                       f"{tp} is no multiple of the {total_heads} KV heads")
        per_rank = 1
    if getattr(pc, "decode_context_parallel_size", 1) > 1 or \
            getattr(pc, "prefill_context_parallel_size", 1) > 1:
        raise _bad("parallel_config.decode_context_parallel_size",
                   "context parallelism splits a block's tokens across ranks; "
                   "not supported")
    block_size = cc.block_size
    if not block_size:
        raise _bad("cache_config.block_size", "the block size is not set")
    spec = NamespaceSpec(
        model=extra.get("model") or str(mc.model),
        model_revision=extra.get("model_revision") or _derived_revision(vllm_config),
        cache_salt=extra.get("cache_salt", ""),
        num_layers=_num_layers(mc), num_kv_heads=total_heads, head_dim=head_dim,
        page_size=block_size, dtype=_kv_dtype(vllm_config), tp_rank=0, tp_size=1)
    return _Geometry(spec=spec, tp_size=tp, heads_per_rank=per_rank)


# ---------------------------------------------------------------------------
# Metadata between the two sides
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class LoadSpec:
    """Copy page pages[j] into vLLM block block_ids[j], all layers. `token`
    names the scheduler's lease state (acknowledgements carry it)."""
    req_id: str
    token: int
    session_id: str
    pages: List[int]
    block_ids: List[int]


@dataclasses.dataclass
class SaveSpec:
    """Copy vLLM block block_ids[j] into page pages[j]; block_indices[j] is
    the prompt block's index (reported back with `token`)."""
    req_id: str
    token: int
    session_id: str
    block_indices: List[int]
    pages: List[int]
    block_ids: List[int]


@dataclasses.dataclass
class RadixKVConnectorMetadata(KVConnectorMetadata):
    """One engine step's work for the workers."""
    attach_socket: str = ""
    loads: List[LoadSpec] = dataclasses.field(default_factory=list)
    saves: List[SaveSpec] = dataclasses.field(default_factory=list)
    # vLLM blocks counted as cached whose load was cancelled (the lease was
    # too close to its expiry): reported as load errors, vLLM recomputes them.
    cancelled_block_ids: List[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RadixKVWorkerMetadata(KVConnectorWorkerMetadata):
    """What the workers did in one step: per (lease token, block index) and
    per lease token's load, [workers that succeeded, workers that failed]."""
    saves: Dict[Tuple[int, int], List[int]] = dataclasses.field(default_factory=dict)
    loads: Dict[int, List[int]] = dataclasses.field(default_factory=dict)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "RadixKVWorkerMetadata":
        if not isinstance(other, RadixKVWorkerMetadata):
            return self
        out = RadixKVWorkerMetadata(
            saves={k: list(v) for k, v in self.saves.items()},
            loads={k: list(v) for k, v in self.loads.items()})
        for table, theirs in ((out.saves, other.saves), (out.loads, other.loads)):
            for key, (ok, failed) in theirs.items():
                mine = table.setdefault(key, [0, 0])
                mine[0] += ok
                mine[1] += failed
        return out


# ---------------------------------------------------------------------------
# vLLM's KV cache layout
# ---------------------------------------------------------------------------

def kv_layer_views(kv: torch.Tensor, packing: str, num_heads: int, block_size: int,
                   head_dim: int, layer: str = "") -> Tuple[torch.Tensor, torch.Tensor]:
    """K and V of one layer's cache as views of shape [blocks, heads, slots,
    head_dim] (slot = token within the block), sharing kv's memory.

    kv is the per-layer tensor vLLM registers: the logical view
    [B, H, N, C] with C = 2 * head_dim in any stride order; packing says
    where K and V live ("content_split": C[:D] and C[D:]; "head_blocks":
    each (block, head) run of N * C elements is K of the N slots, then V).
    Older vLLM layouts, [2, B, N, H, D] and [B, 2, N, H, D], are recognized
    by shape. InvalidArgument naming the field when the tensor does not
    match the namespace."""
    where = f"kv_caches[{layer!r}]"
    if kv.dim() == 5:
        if kv.shape[0] == 2 and tuple(kv.shape[2:]) == (block_size, num_heads, head_dim):
            return kv[0].transpose(1, 2), kv[1].transpose(1, 2)
        if kv.shape[1] == 2 and tuple(kv.shape[2:]) == (block_size, num_heads, head_dim):
            return kv[:, 0].transpose(1, 2), kv[:, 1].transpose(1, 2)
        raise _bad(f"{where}.shape", f"{tuple(kv.shape)} is no known 5-D KV layout for "
                   f"block_size={block_size}, kv_heads={num_heads}, head_dim={head_dim}")
    if kv.dim() != 4:
        raise _bad(f"{where}.shape", f"{tuple(kv.shape)}: want [blocks, heads, slots, 2*head_dim]")
    _, heads, slots, content = kv.shape
    if heads != num_heads:
        raise _bad("num_kv_heads", f"{where} has {heads} KV heads on this rank; the "
                   f"namespace gives {num_heads} per rank")
    if slots != block_size:
        raise _bad("block_size", f"{where} has {slots} slots per block; the namespace's "
                   f"page_size is {block_size} (kernel blocks smaller than vLLM's "
                   "block size are not supported)")
    if content != 2 * head_dim:
        raise _bad("head_dim", f"{where} holds {content} elements per (head, slot); "
                   f"want 2 * head_dim = {2 * head_dim}")
    if packing == "content_split":
        return kv[..., :head_dim], kv[..., head_dim:]
    if packing == "head_blocks":
        s_b, s_h, s_n, s_c = kv.stride()
        if s_c != 1 or s_n != content:
            raise _bad(f"{where}.stride", f"{kv.stride()}: the head_blocks packing needs "
                       "each (block, head) run of slots * 2 * head_dim elements contiguous")
        shape = (kv.shape[0], heads, slots, head_dim)
        stride = (s_b, s_h, head_dim, 1)
        k = kv.as_strided(shape, stride, kv.storage_offset())
        v = kv.as_strided(shape, stride, kv.storage_offset() + slots * head_dim)
        return k, v
    raise _bad("kv_packing", f"unknown packing {packing!r}")


def _layer_index(name: str) -> Optional[int]:
    """The layer number in an attention layer's name
    ("model.layers.3.self_attn.attn" -> 3); None unless exactly one."""
    found = re.findall(r"\.(\d+)(?=\.)", "." + name + ".")
    return int(found[0]) if len(found) == 1 else None


# ---------------------------------------------------------------------------
# The connector
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class _Request:
    """Scheduler-side state of one lease of a request."""
    rid: str
    token: int
    lease: Any
    num_tokens: int
    local_tokens: int = 0
    load_from: int = 0
    load_count: int = 0
    load_pending: bool = False
    load_acks: List[int] = dataclasses.field(default_factory=lambda: [0, 0])
    load_in_flight: bool = False
    block_ids: List[int] = dataclasses.field(default_factory=list)
    next_save: int = 0
    save_end: int = 0
    saving: bool = True
    save_acks: Dict[int, List[int]] = dataclasses.field(default_factory=dict)
    in_flight: set = dataclasses.field(default_factory=set)
    commit_failed: bool = False
    finished: bool = False


class RadixKVConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector backed by radixkvd; see the module docstring."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role,
                         kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        role_name = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        self._settings = _settings(extra, role_name)
        self._geometry = _geometry(vllm_config, extra)
        self._spec = self._geometry.spec
        self._block_size = self._spec.page_size
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) > 1:
            raise _bad("kv_cache_config.kv_cache_groups",
                       f"{len(groups)} KV cache groups (hybrid attention); the "
                       "connector serves models with one full-attention group")
        self._lock = threading.Lock()
        # scheduler side
        self._client = None
        self._requests: Dict[str, _Request] = {}    # live request id -> state
        self._states: Dict[int, _Request] = {}      # token -> state, until drained
        self._next_token = 0
        self._world_size = max(1, int(getattr(vllm_config.parallel_config,
                                              "world_size", 1) or 1))
        # worker side
        self._layers: Dict[str, Tuple[int, torch.Tensor, torch.Tensor]] = {}
        self._pools: Dict[str, Any] = {}
        self._load_errors: set = set()
        self._step_acks: Optional[RadixKVWorkerMetadata] = None
        self._saved_layers: Dict[Tuple[int, int], Dict[int, bool]] = {}
        self._head_range = (0, self._spec.num_kv_heads)
        if role == KVConnectorRole.SCHEDULER:
            # A load this connector cannot complete is reported as a load
            # error; the request must then be recomputed, never failed.
            if getattr(self._kv_transfer_config, "kv_load_failure_policy",
                       "recompute") != "recompute":
                logger.info("radixkv: setting kv_load_failure_policy=recompute "
                            "(a cache miss must never fail a request)")
                self._kv_transfer_config.kv_load_failure_policy = "recompute"
            self._start_scheduler()
        else:
            self._start_worker()

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a save dropped by preemption is a future miss.
        return False

    # -- start -----------------------------------------------------------------

    def _start_scheduler(self) -> None:
        s = self._settings
        # Raises InvalidArgument/FailedPrecondition naming the field when the
        # daemon refuses the namespace (e.g. other page_bytes than its pool);
        # a daemon that is down is no error: lookups are misses until it is up.
        self._client = radixkv.Client(
            endpoint=s.endpoint, namespace=self._spec, client_name=s.client_name,
            attach_pool=False, call_timeout=s.call_timeout, initial_wait=s.initial_wait)

    def _start_worker(self) -> None:
        tp = self._geometry.tp_size
        rank = 0
        if tp > 1:
            from vllm.distributed import parallel_state  # pylint: disable=import-outside-toplevel
            rank = parallel_state.get_tensor_model_parallel_rank()
        per = self._geometry.heads_per_rank
        total = self._spec.num_kv_heads
        first = rank * per if total >= tp else rank * total // tp
        self._head_range = (first, first + per)

    @property
    def namespace(self) -> NamespaceSpec:
        return self._spec

    @property
    def client(self):
        """The scheduler side's radixkv.Client (None on workers)."""
        return self._client

    # ==========================================================================
    # Scheduler side
    # ==========================================================================

    def _cacheable(self, request) -> bool:
        """Token mode covers requests whose K/V follows from the token ids of
        this namespace alone: no LoRA adapter, no per-request cache salt, no
        multimodal inputs, no prompt embeddings (those are misses)."""
        return (request.prompt_token_ids is not None and
                getattr(request, "lora_request", None) is None and
                not getattr(request, "cache_salt", None) and
                not getattr(request, "mm_features", None) and
                getattr(request, "prompt_embeds", None) is None)

    def _acquire(self, request) -> Optional[_Request]:
        tokens = request.prompt_token_ids
        if len(tokens) < self._block_size:
            return None
        try:
            lease = self._client.acquire(tokens, allocate=True)
        except radixkv.Error as e:
            logger.warning("radixkv: lookup of request %s refused (%s); computing it",
                           request.request_id, e)
            return None
        if lease.degraded or not lease.held:
            return None
        self._next_token += 1
        state = _Request(rid=request.request_id, token=self._next_token, lease=lease,
                         num_tokens=len(tokens))
        state.next_save = lease.matched_blocks
        state.save_end = lease.matched_blocks + lease.new_blocks
        return state

    def _usable_blocks(self, state: _Request, num_tokens: int) -> int:
        lease = state.lease
        if lease is None or not lease.live:
            return 0
        if lease.matched_blocks and lease.time_left < self._settings.min_lease_time_left:
            return 0
        # The last token always runs: at most n - 1 tokens, whole blocks.
        return min(lease.matched_blocks, (num_tokens - 1) // self._block_size)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        rid = request.request_id
        with self._lock:
            state = self._requests.get(rid)
            if state is None:
                if not self._cacheable(request):
                    return 0, False
                state = self._acquire(request)
                if state is None:
                    return 0, False
                self._requests[rid] = state
                self._states[state.token] = state
            state.local_tokens = num_computed_tokens
            usable = self._usable_blocks(state, request.num_tokens)
            return max(0, usable * self._block_size - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        with self._lock:
            state = self._requests.get(request.request_id)
            if state is None:
                return
            block_ids = blocks.get_block_ids()
            if block_ids:
                state.block_ids = list(block_ids[0])
            if num_external_tokens <= 0:
                return
            start = state.local_tokens // self._block_size
            count = num_external_tokens // self._block_size
            state.load_from, state.load_count = start, count
            state.load_pending = count > 0

    def _plan(self, state: _Request, done_tokens: int,
              meta: RadixKVConnectorMetadata) -> None:
        lease = state.lease
        min_left = self._settings.min_lease_time_left
        if state.load_pending:
            state.load_pending = False
            end = state.load_from + state.load_count
            blocks = state.block_ids[state.load_from:end]
            if (lease is not None and lease.live and lease.time_left >= min_left and
                    end <= lease.matched_blocks and len(blocks) == state.load_count):
                meta.loads.append(LoadSpec(state.rid, state.token, _session_of(lease),
                                           lease.pages[state.load_from:end], blocks))
                state.load_in_flight = True
                state.load_acks = [0, 0]
            else:
                meta.cancelled_block_ids.extend(blocks)
        if lease is None or not state.saving or state.finished:
            return
        end = min(state.save_end, done_tokens // self._block_size, len(state.block_ids))
        if end <= state.next_save:
            return
        if not (lease.live and lease.time_left >= min_left and _begin_write(lease)):
            state.saving = False
            return
        indices = list(range(state.next_save, end))
        meta.saves.append(SaveSpec(state.rid, state.token, _session_of(lease), indices,
                                   [lease.pages[i] for i in indices],
                                   [state.block_ids[i] for i in indices]))
        state.in_flight.update(indices)
        state.next_save = end

    def _plan_and_settle(self, state: _Request, done_tokens: int,
                         meta: RadixKVConnectorMetadata) -> None:
        self._plan(state, done_tokens, meta)
        # A lease with nothing to load and nothing (more) to save ends now.
        self._advance(state)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = RadixKVConnectorMetadata()
        with self._lock:
            pool_info = self._client.state().pool if self._client is not None else None
            meta.attach_socket = getattr(pool_info, "attach_socket", "") or ""
            scheduled = {r.req_id for r in scheduler_output.scheduled_new_reqs}
            cached = scheduler_output.scheduled_cached_reqs
            resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
            for rid in scheduler_output.preempted_req_ids or ():
                if rid not in scheduled and rid not in resumed:
                    self._finish(rid)
            num_scheduled = scheduler_output.num_scheduled_tokens
            for new in scheduler_output.scheduled_new_reqs:
                state = self._requests.get(new.req_id)
                if state is None:
                    continue
                state.block_ids = list(new.block_ids[0])
                self._plan_and_settle(
                    state, new.num_computed_tokens + num_scheduled.get(new.req_id, 0), meta)
            for i, rid in enumerate(cached.req_ids):
                state = self._requests.get(rid)
                if state is None:
                    continue
                new_ids = cached.new_block_ids[i]
                if rid in resumed:
                    if new_ids is not None:
                        state.block_ids = list(new_ids[0])
                elif new_ids is not None:
                    state.block_ids.extend(new_ids[0])
                self._plan_and_settle(
                    state, cached.num_computed_tokens[i] + num_scheduled.get(rid, 0), meta)
        return meta

    def update_connector_output(self, connector_output) -> None:
        acks = getattr(connector_output, "kv_connector_worker_meta", None)
        if not isinstance(acks, RadixKVWorkerMetadata):
            return
        with self._lock:
            touched = set()
            for (token, index), (ok, failed) in acks.saves.items():
                state = self._states.get(token)
                if state is None:
                    continue
                mine = state.save_acks.setdefault(index, [0, 0])
                mine[0] += ok
                mine[1] += failed
                touched.add(token)
            for token, (ok, failed) in acks.loads.items():
                state = self._states.get(token)
                if state is None:
                    continue
                state.load_acks[0] += ok
                state.load_acks[1] += failed
                if sum(state.load_acks) >= self._world_size:
                    state.load_in_flight = False
                touched.add(token)
            for token in touched:
                self._advance(self._states[token])

    def _advance(self, state: _Request) -> None:
        """Commits the saved blocks in block order; ends the lease once
        nothing of it is in flight and nothing more will be saved."""
        lease = state.lease
        for index in list(state.in_flight):
            ack = state.save_acks.get(index)
            if ack and sum(ack) >= self._world_size:
                state.in_flight.discard(index)
                if ack[1]:
                    state.saving = False
        if lease is not None and lease.held and not state.commit_failed:
            # The longest run of blocks every worker saved, from the first
            # uncommitted one; a failed block ends the run (commits are in
            # block order).
            start = lease.matched_blocks + lease.committed_blocks
            n = 0
            while True:
                ack = state.save_acks.get(start + n)
                if not ack or ack[1] or ack[0] < self._world_size:
                    break
                n += 1
            if n:
                try:
                    _commit_keeping_writer(lease, n, keep=bool(state.in_flight))
                except radixkv.Error as e:
                    logger.warning("radixkv: commit of request %s failed (%s)",
                                   state.rid, e)
                    state.commit_failed = True
                    state.saving = False
        done_saving = (state.finished or not state.saving or
                       state.next_save >= state.save_end)
        if not state.in_flight and not state.load_in_flight and done_saving:
            if lease is not None:
                # Off the scheduler's path: the release rides on the next
                # Acquire, or the session thread sends it within
                # release_delay.
                lease.drop()
                state.lease = None
            if state.finished:
                self._states.pop(state.token, None)

    def _finish(self, rid: str) -> None:
        """The request finished, was aborted or preempted: nothing more is
        loaded or saved for this lease; it ends once the steps that still
        copy its pages have been acknowledged."""
        state = self._requests.pop(rid, None)
        if state is None:
            return
        state.finished = True
        state.load_pending = False
        self._advance(state)

    def request_finished(self, request, block_ids) -> Tuple[bool, Optional[dict]]:
        with self._lock:
            self._finish(request.request_id)
        return False, None

    def request_finished_all_groups(self, request, block_ids) -> Tuple[bool, Optional[dict]]:
        return self.request_finished(request, block_ids)

    def shutdown(self):
        with self._lock:
            for state in self._states.values():
                if state.lease is not None:
                    try:
                        state.lease.release()
                    except radixkv.Error:
                        pass
                    state.lease = None
            self._states.clear()
            self._requests.clear()
            if self._client is not None:
                self._client.close()
            for pool in self._pools.values():
                if pool is not None:
                    pool.close()
            self._pools.clear()

    def held_leases(self) -> List[str]:
        """Request ids with a lease still held (scheduler side), including
        finished requests whose last copies are not yet acknowledged."""
        with self._lock:
            return sorted(s.rid for s in self._states.values()
                          if s.lease is not None and s.lease.held)

    # ==========================================================================
    # Worker side
    # ==========================================================================

    def _packing(self) -> str:
        if self._settings.kv_packing:
            return self._settings.kv_packing
        try:
            from vllm.distributed.kv_transfer.kv_connector.utils import (  # pylint: disable=import-outside-toplevel
                get_current_attn_backend)
            name = get_current_attn_backend(self._vllm_config).get_name()
        except Exception as e:  # pylint: disable=broad-except
            raise _bad("attention_backend", f"cannot determine vLLM's attention "
                       f"backend ({e}); set kv_connector_extra_config.kv_packing") from e
        if name in _CONTENT_SPLIT_BACKENDS:
            return "content_split"
        if name in _HEAD_BLOCKS_BACKENDS:
            return "head_blocks"
        raise _bad("attention_backend", f"{name}: K/V packing of this backend is not "
                   "known; set kv_connector_extra_config.kv_packing if it is one of "
                   "content_split, head_blocks")

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]):
        packing = self._packing()
        spec = self._spec
        per = self._geometry.heads_per_rank
        layers = {}
        names = sorted(kv_caches)
        indices = [_layer_index(n) for n in names]
        if any(i is None for i in indices):
            # No layer numbers in the names: the registration order.
            indices = list(range(len(names)))
        for name, index in zip(names, indices):
            kv = kv_caches[name]
            if index >= spec.num_layers:
                raise _bad("num_layers", f"layer {name!r} has index {index}; the "
                           f"namespace has {spec.num_layers} layers")
            if kv.element_size() != spec.elem_bytes:
                raise _bad("dtype", f"kv_caches[{name!r}] has {kv.dtype} "
                           f"({kv.element_size()} bytes); the namespace's KV dtype has "
                           f"{spec.elem_bytes}")
            k, v = kv_layer_views(kv, packing, per, spec.page_size, spec.head_dim, name)
            layers[name] = (index, k, v)
        if len({i for i, _, _ in layers.values()}) != len(layers):
            raise _bad("kv_caches", "two registered layers map to one layer index "
                       "(cross-layer KV sharing is not supported)")
        self._layers = layers

    def _pool(self, meta: RadixKVConnectorMetadata, session_id: str):
        """The pool mapped for the scheduler's session `session_id`, or None
        when the daemon refuses it (ended session, daemon restarted)."""
        if session_id in self._pools:
            return self._pools[session_id]
        pool = None
        try:
            pool = radixkv.attach(meta.attach_socket, session_id,
                                  timeout=self._settings.attach_timeout)
            if pool.page_bytes < self._spec.page_bytes:
                raise _bad("namespace", f"the pool's pages have {pool.page_bytes} "
                           f"bytes; the namespace needs {self._spec.page_bytes}")
        except radixkv.Error as e:
            logger.warning("radixkv: cannot map the pool of session %s (%s)", session_id, e)
            if pool is not None:
                pool.close()
            pool = None
        # Pools of sessions that ended stay mapped by views only; keep two.
        for old in list(self._pools)[:-1]:
            if self._pools[old] is not None:
                self._pools[old].close()
            del self._pools[old]
        self._pools[session_id] = pool
        return pool

    def _page(self, pool, page: int, dtype) -> torch.Tensor:
        t = pool.page_tensor(page, self._spec)
        if t.dtype != dtype:
            t = t.view(dtype)
        h0, h1 = self._head_range
        return t[:, :, h0:h1]

    def _acks(self) -> RadixKVWorkerMetadata:
        if self._step_acks is None:
            self._step_acks = RadixKVWorkerMetadata()
        return self._step_acks

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, RadixKVConnectorMetadata):
            return
        self._load_errors.update(meta.cancelled_block_ids)
        for load in meta.loads:
            ok = self._load(meta, load)
            ack = self._acks().loads.setdefault(load.token, [0, 0])
            ack[0 if ok else 1] += 1
            if not ok:
                self._load_errors.update(load.block_ids)

    def _load(self, meta, load: LoadSpec) -> bool:
        pool = self._pool(meta, load.session_id)
        if pool is None or not self._layers:
            return False
        try:
            for index, k, v in self._layers.values():
                for page, block in zip(load.pages, load.block_ids):
                    src = self._page(pool, page, k.dtype)[index]
                    k[block].copy_(src[0])
                    v[block].copy_(src[1])
        except (radixkv.Error, IndexError, ValueError) as e:
            logger.warning("radixkv: load for request %s failed (%s)", load.req_id, e)
            return False
        return True

    def wait_for_layer_load(self, layer_name: str) -> None:
        # start_load_kv copies every layer before it returns.
        return

    def _save_layer(self, meta, save: SaveSpec, index: int, k, v) -> bool:
        pool = self._pool(meta, save.session_id)
        if pool is None:
            return False
        try:
            for page, block in zip(save.pages, save.block_ids):
                dst = self._page(pool, page, k.dtype)[index]
                dst[0].copy_(k[block])
                dst[1].copy_(v[block])
        except (radixkv.Error, IndexError, ValueError) as e:
            logger.warning("radixkv: save for request %s failed (%s)", save.req_id, e)
            return False
        return True

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata,
                      **kwargs: Any) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, RadixKVConnectorMetadata) or not meta.saves:
            return
        entry = self._layers.get(layer_name)
        if entry is None:
            return
        index, k, v = entry
        for save in meta.saves:
            done = self._saved_layers.setdefault((save.token, save.block_indices[0]), {})
            done[index] = self._save_layer(meta, save, index, k, v)

    def wait_for_save(self):
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        if not isinstance(meta, RadixKVConnectorMetadata):
            return
        acks = self._acks()
        for save in meta.saves:
            done = self._saved_layers.pop((save.token, save.block_indices[0]), {})
            # Layers whose save_kv_layer did not run (e.g. a replayed CUDA
            # graph skips it) are copied now: the forward has finished.
            for index, k, v in self._layers.values():
                if index not in done:
                    done[index] = self._save_layer(meta, save, index, k, v)
            ok = bool(done) and all(done.values())
            for index in save.block_indices:
                ack = acks.saves.setdefault((save.token, index), [0, 0])
                ack[0 if ok else 1] += 1
        # Copies into a host pool's pages are synchronous (pageable
        # destination); copies into a cuda pool's pages are queued on the
        # current stream, and a page is committed only once they have run.
        if meta.saves and any(k.is_cuda for _, k, _ in self._layers.values()):
            torch.cuda.current_stream().synchronize()
        self._saved_layers.clear()

    def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        acks, self._step_acks = self._step_acks, None
        return acks

    def get_block_ids_with_load_errors(self) -> set:
        errors_, self._load_errors = self._load_errors, set()
        return errors_


def _commit_keeping_writer(lease, blocks: int, keep: bool) -> None:
    """lease.commit(blocks, release=False); with `keep` (later pages are
    still being written by workers) the lease stays counted as a writer of
    its session through the commit."""
    lease.commit(blocks, release=False, keep_writing=keep)


def _session_of(lease) -> str:
    """The id of the session that made the lease."""
    return lease.session_id


def _begin_write(lease) -> bool:
    """Counts the lease as a writer of its session until its next commit or
    release: pages written by a worker in another process are then never
    acknowledged as lost while that write may run. False once the session
    has ended."""
    return lease.begin_external_write()
