"""radixkv for Hugging Face transformers causal LMs (transformers 5.x Cache API).

    from radixkv.integrations.transformers import PrefixCache

    model = AutoModelForCausalLM.from_pretrained(path)
    with PrefixCache(model, endpoint="/tmp/radixkvd.sock") as pc:
        out = pc.generate(input_ids, max_new_tokens=32)      # model.generate
        res = pc.prefill(input_ids)                          # next-token logits
        # or by hand, with model.generate:
        with pc.prepare(input_ids) as hit:
            out = model.generate(hit.input_ids, past_key_values=hit.cache, ...)
        # leaving the `with` writes the prompt's new blocks and commits them

What a prompt of n tokens goes through (docs/INTEGRATION.md):

* Namespace: model id, revision (plus the RoPE parameters and, for a local
  directory without a revision, a digest of its weight files' names, sizes
  and mtimes), the KV dtype (the model's dtype), the number of layers,
  KV heads, head dim and the caller's page size (default 16), all taken
  from the model's config (namespace_from_model).
* Acquire: the longest cached prefix is pinned; at most n - 1 tokens of it
  are used, rounded down to whole blocks (the last prompt token always
  runs, so the first output token comes from logits computed here).
* Load: the cached pages are copied into a transformers DynamicCache (one
  DynamicLayer per decoder layer, shape (1, kv_heads, tokens, head_dim));
  the copy counts only when the lease was still live after it
  (Lease.confirm_read), otherwise the prompt is a miss.
* Run: the model sees only the suffix; positions continue after the cache.
* Save: the K/V of the lease's new blocks (the suffix's full blocks) are
  copied from the cache into the new pages, page layout
  page -> layer -> {K,V} -> kv_head -> slot -> dim in the namespace's
  dtype, and committed only after every copy finished.
* A daemon that is down, restarting or late gives a miss and a full
  prefill; a lost lease only costs future hits. Neither raises.

Mistakes of the caller (bad input_ids, a client whose namespace differs
from the model's, a model whose cache is not one full-attention
DynamicLayer per layer) raise radixkv.InvalidArgument naming the field.

One prompt at a time (batch size 1). Thread safety: a PrefixCache may be
used from several threads (its Client is thread-safe); a CachedPrefix
belongs to one thread.
"""
import hashlib
import json
import logging
import os
from typing import Optional

import torch
from transformers import DynamicCache, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import DynamicLayer

import radixkv
from radixkv import errors
from radixkv.errors import InvalidArgument
from radixkv.pool import torch_dtype

__all__ = ["PrefixCache", "CachedPrefix", "PrefillResult", "namespace_from_model",
           "DEFAULT_PAGE_SIZE"]

DEFAULT_PAGE_SIZE = 16

_log = logging.getLogger("radixkv.integrations.transformers")

# torch dtype of the model's K/V -> radixkv dtype name.
_KV_DTYPES = {
    torch.float32: "DTYPE_FLOAT32",
    torch.float16: "DTYPE_FLOAT16",
    torch.bfloat16: "DTYPE_BFLOAT16",
}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _invalid(field: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{field}: {message}", field=field,
                           reason=errors.REASON_INVALID)


def _text_config(model_or_config):
    config = getattr(model_or_config, "config", model_or_config)
    return config, config.get_text_config(decoder=True)


def _local_weights_digest(path: str) -> str:
    """Digest of a local model directory's config.json bytes and its weight
    files' names, sizes and mtimes: a directory rewritten with other weights
    gets another namespace (a miss, never the old K/V)."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            continue
        if name == "config.json":
            with open(full, "rb") as f:
                h.update(b"config.json\0" + f.read())
        elif name.endswith(_WEIGHT_SUFFIXES):
            st = os.stat(full)
            h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]


def namespace_from_model(model, page_size: int = DEFAULT_PAGE_SIZE,
                         model_id: Optional[str] = None,
                         revision: Optional[str] = None, *, lora: str = "",
                         cache_salt: str = "", dtype=None) -> radixkv.NamespaceSpec:
    """The radixkv namespace of `model` (a transformers causal LM, or its
    config with `dtype` given):

      model           model_id, else config._name_or_path
      model_revision  revision, else the hub commit the weights came from
                      (config._commit_hash), else for a local directory
                      "local:<digest of config.json and the weight files'
                      names, sizes and mtimes>"; then ";rope=<JSON of the
                      RoPE parameters>" when the config has any
      num_layers, num_kv_heads, head_dim   from the decoder config
      page_size       the caller's (default 16)
      dtype           the model's dtype (float32, float16, bfloat16)

    InvalidArgument naming the field when one cannot be derived: model_id
    (a model built in memory has no name), revision (in-memory weights have
    none), dtype, page_size, or config.layer_types (a layer whose cache is
    not a full-attention DynamicLayer: sliding-window, chunked, linear or
    shared-KV layers cannot be cached as whole-prompt pages)."""
    config, text = _text_config(model)
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise _invalid("page_size", f"must be a positive int, got {page_size!r}")
    if model_id is None:
        model_id = getattr(config, "_name_or_path", "") or ""
    if not model_id:
        raise _invalid("model_id", "the model has no name (config._name_or_path is "
                       "empty); pass model_id= and revision=")
    if revision is None:
        revision = getattr(config, "_commit_hash", None) or ""
        if not revision:
            if os.path.isdir(model_id):
                revision = "local:" + _local_weights_digest(model_id)
            else:
                raise _invalid("revision", f"no revision is known for {model_id!r} "
                               "(no hub commit, not a local directory); pass "
                               "revision= naming these weights")
    rope = getattr(text, "rope_parameters", None)
    if rope:
        revision += ";rope=" + json.dumps(rope, sort_keys=True, default=str)

    layer_types = [type(layer) for layer in DynamicCache(config=config).layers]
    num_layers = text.num_hidden_layers
    if len(layer_types) != num_layers or any(t is not DynamicLayer for t in layer_types):
        raise _invalid("config.layer_types", "every decoder layer must keep a "
                       "full-attention DynamicLayer cache; got "
                       f"{[t.__name__ for t in layer_types]} for {num_layers} layers")
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads

    if dtype is None:
        dtype = getattr(model, "dtype", None)
    if dtype not in _KV_DTYPES:
        raise _invalid("dtype", f"K/V dtype {dtype} has no radixkv page type; "
                       "use float32, float16 or bfloat16")
    return radixkv.NamespaceSpec(
        model=model_id, model_revision=revision, lora=lora, cache_salt=cache_salt,
        num_layers=num_layers, num_kv_heads=kv_heads, head_dim=head_dim,
        page_size=page_size, dtype=_KV_DTYPES[dtype])


def _prompt_tensor(input_ids, device) -> torch.Tensor:
    """input_ids as a (1, n) int64 tensor on `device`; InvalidArgument
    (field input_ids) otherwise."""
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids
    else:
        try:
            ids = torch.as_tensor(input_ids)
        except (TypeError, ValueError, RuntimeError) as e:
            raise _invalid("input_ids", f"not a sequence of token ids ({e})") from None
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise _invalid("input_ids", f"token ids must be integers, got {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise _invalid("input_ids", f"want one prompt, shape (n,) or (1, n); got "
                       f"{tuple(ids.shape)}")
    n = ids.shape[1]
    if n == 0:
        raise _invalid("input_ids", "the prompt is empty")
    if bool((ids < 0).any()) or bool((ids > 0xFFFFFFFF).any()):
        raise _invalid("input_ids", "token ids must lie in 0 .. 2**32 - 1")
    return ids.to(device=device, dtype=torch.long)


class PrefillResult:
    """What PrefixCache.prefill returns: `logits` (1, vocab) of the next
    token, `cache` (a DynamicCache holding the whole prompt), `cached_tokens`
    (the prompt tokens loaded from radixkv), `saved_blocks` (blocks this
    call committed) and `prompt_tokens`."""

    __slots__ = ("logits", "cache", "cached_tokens", "saved_blocks", "prompt_tokens")

    def __init__(self, logits, cache, cached_tokens, saved_blocks, prompt_tokens):
        self.logits = logits
        self.cache = cache
        self.cached_tokens = cached_tokens
        self.saved_blocks = saved_blocks
        self.prompt_tokens = prompt_tokens

    def __repr__(self) -> str:
        return (f"PrefillResult(prompt_tokens={self.prompt_tokens}, cached_tokens="
                f"{self.cached_tokens}, saved_blocks={self.saved_blocks})")


class CachedPrefix:
    """One prompt's lease: `cache` is a DynamicCache holding the K/V of the
    first `cached_tokens` prompt tokens (none on a miss); `suffix_ids` are
    the tokens the model still has to run. After the model has run the
    prompt on `cache` (model(...) on suffix_ids, or model.generate on the
    whole prompt), save() writes the new blocks and commits them. A context
    manager: leaving it without an exception saves, then ends the lease.

    Invariant: nothing is committed unless every new page of it was written
    from cache positions the model computed for this prompt."""

    def __init__(self, owner: "PrefixCache", input_ids: torch.Tensor, lease,
                 cache, cached_tokens: int):
        self._owner = owner
        self.input_ids = input_ids
        self.lease = lease
        self.cache = cache
        self.cached_tokens = cached_tokens
        self.saved_blocks = 0
        self._done = False

    @property
    def prompt_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def suffix_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.cached_tokens:]

    @property
    def hit(self) -> bool:
        return self.cached_tokens > 0

    def save_after_prefill(self) -> LogitsProcessor:
        """A LogitsProcessor for model.generate that calls save() when
        generate first asks for scores, i.e. right after the prompt's
        forward pass and before decoding goes on; it leaves scores as they
        are."""
        return _SaveOnFirstScores(self)

    def save(self) -> int:
        """Writes the lease's new blocks from `cache` and commits them; then
        ends the lease. Returns the number of blocks committed (0 for a
        degraded or lost lease, or a daemon that does not answer). Runs
        once; later calls return the first result.

        REQUIRES: the model has run the whole prompt on `cache`. Raises
        InvalidArgument (field past_key_values) when `cache` holds fewer
        positions than the blocks to save, or K/V of another shape or dtype
        than the namespace's."""
        if self._done:
            return self.saved_blocks
        lease = self.lease
        try:
            if lease.held and lease.new_blocks > 0:
                self.saved_blocks = self._owner._write_and_commit(lease, self.cache)
        finally:
            self._done = True
            self.close()
        return self.saved_blocks

    def close(self) -> None:
        """Ends the lease without saving anything more (idempotent)."""
        self._done = True
        try:
            self.lease.release()
        except radixkv.Error as e:
            _log.debug("release: %s", e)

    def __enter__(self) -> "CachedPrefix":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.save()
        else:
            self.close()

    def __repr__(self) -> str:
        return (f"CachedPrefix(prompt_tokens={self.prompt_tokens}, cached_tokens="
                f"{self.cached_tokens}, lease={self.lease!r})")


class _SaveOnFirstScores(LogitsProcessor):
    """Calls CachedPrefix.save() the first time generate computes scores."""

    def __init__(self, prefix: CachedPrefix):
        self._prefix = prefix

    def __call__(self, input_ids, scores):
        if not self._prefix._done:  # pylint: disable=protected-access
            self._prefix.save()
        return scores


class PrefixCache:
    """radixkv's prefix cache for one transformers causal LM.

    model: the model (eval mode, batch size 1 prompts). client: a
    radixkv.Client with attach_pool=True in this model's namespace; without
    one, a Client is made (and closed by close()) with `endpoint` and
    **client_options (radixkv.Client keywords such as initial_wait,
    call_timeout). page_size, model_id, revision, lora, cache_salt: see
    namespace_from_model.

    Raises InvalidArgument naming the field when the model cannot be
    cached, or `client`'s namespace differs from the model's
    (namespace.<field>); the Client's own errors when the daemon refuses
    the namespace (e.g. FailedPrecondition, field namespace, for a pool
    whose page_bytes were fixed by another layout). A daemon that is down
    raises nothing: every prompt is then a miss."""

    def __init__(self, model, client: Optional["radixkv.Client"] = None, *,
                 endpoint: Optional[str] = None, page_size: int = DEFAULT_PAGE_SIZE,
                 model_id: Optional[str] = None, revision: Optional[str] = None,
                 lora: str = "", cache_salt: str = "",
                 client_name: str = "transformers", **client_options):
        self.model = model
        self.spec = namespace_from_model(model, page_size, model_id, revision,
                                         lora=lora, cache_salt=cache_salt)
        # The torch dtype of page views (torch.bfloat16 for bf16).
        self._page_dtype = torch_dtype(self.spec.dtype)
        if client is None:
            self.client = radixkv.Client(endpoint=endpoint, namespace=self.spec,
                                         client_name=client_name, attach_pool=True,
                                         **client_options)
            self._own_client = True
        else:
            self._check_client(client)
            self.client = client
            self._own_client = False
        # The CachedPrefix of the latest generate() call (cached_tokens,
        # saved_blocks): informational.
        self.last: Optional[CachedPrefix] = None

    def _check_client(self, client) -> None:
        mine, theirs = self.spec.to_dict(), client.namespace.normalized().to_dict()
        mine_n = self.spec.normalized().to_dict()
        for field in mine_n:
            if mine_n[field] != theirs.get(field):
                raise _invalid(f"namespace.{field}", f"the client's namespace has "
                               f"{theirs.get(field)!r}, the model needs {mine[field]!r}")
        if not client.options.attach_pool:
            raise _invalid("client", "the client must map the pool (attach_pool=True) "
                           "to read and write pages")

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Closes the Client this PrefixCache made (not one passed in)."""
        if self._own_client:
            self.client.close()

    def __enter__(self) -> "PrefixCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the three steps ---------------------------------------------------------

    def new_cache(self) -> DynamicCache:
        """An empty DynamicCache for this model."""
        return DynamicCache(config=self.model.config)

    def prepare(self, input_ids) -> CachedPrefix:
        """Acquires the prompt's lease and loads its usable cached prefix
        into a new DynamicCache. Never raises because of the daemon: a
        degraded, lost or late lease gives cached_tokens 0. InvalidArgument
        (field input_ids) for a prompt that is not one sequence of u32
        token ids."""
        ids = _prompt_tensor(input_ids, self.model.device)
        n = ids.shape[1]
        try:
            lease = self.client.acquire(ids[0].to("cpu").numpy())
        except (radixkv.InvalidArgument, radixkv.FailedPrecondition):
            raise
        except radixkv.Error as e:  # a daemon-side refusal: serve a miss
            _log.warning("acquire failed, serving a miss: %s", e)
            lease = None
        cache, cached = self.new_cache(), 0
        if lease is not None and lease.held:
            usable = min(lease.matched_blocks, (n - 1) // self.spec.page_size)
            if usable > 0:
                loaded = self._load(lease, usable)
                if loaded is not None:
                    cache, cached = loaded, usable * self.spec.page_size
        if lease is None:
            lease = _NoLease()
        return CachedPrefix(self, ids, lease, cache, cached)

    def _page_runs(self, lease, first: int, count: int):
        """Pages first .. first + count - 1 of `lease` as [(j, tensor)]: the
        tensor of shape (run, L, 2, H, P, D) shares the pool's memory of
        pages first + j .. first + j + run - 1. In a host pool a run is
        every stretch of pages that lie back to back in memory (checked
        page by page); in a cuda pool each page is a run of its own (a
        tensor on the pool's device). Page views come from the lease, so
        they are given only while it is live (LeaseLost otherwise) and a
        view of a new page counts the lease as a writer."""
        import numpy as np  # pylint: disable=import-outside-toplevel
        spec = self.spec
        arrays = [lease.page_array(first + j) for j in range(count)]
        if not isinstance(arrays[0], np.ndarray):
            return [(j, lease.page_tensor(first + j).unsqueeze(0)) for j in range(count)]
        addresses = [a.ctypes.data for a in arrays]
        page_bytes = arrays[0].nbytes
        runs, start = [], 0
        for j in range(1, count + 1):
            if j == count or addresses[j] != addresses[j - 1] + page_bytes:
                view = np.lib.stride_tricks.as_strided(
                    arrays[start], shape=(j - start,) + spec.page_shape,
                    strides=(page_bytes,) + arrays[start].strides, writeable=True)
                runs.append((start, torch.from_numpy(view).view(self._page_dtype)))
                start = j
        return runs

    @staticmethod
    def _wait_for_copies(runs) -> None:
        """Returns once the copies into or out of `runs` have completed:
        CPU copies already have; copies on a CUDA device are waited for."""
        devices = {run.device for _, run in runs if run.device.type == "cuda"}
        for device in devices:
            torch.cuda.synchronize(device)

    def _load(self, lease, blocks: int) -> Optional[DynamicCache]:
        """The first `blocks` matched pages as a DynamicCache, or None when
        the lease was not live for the whole copy (a miss)."""
        spec = self.spec
        L, _, H, P, D = spec.page_shape
        device = self.model.device
        try:
            runs = self._page_runs(lease, 0, blocks)
            # (L, 2, H, tokens, D) on the pool's side, filled block by block:
            # one copy per run.
            kv = torch.empty((L, 2, H, blocks * P, D), dtype=self._page_dtype,
                             device=runs[0][1].device)
            by_block = kv.view(L, 2, H, blocks, P, D)
            for j, run in runs:
                by_block[:, :, :, j:j + run.shape[0]].copy_(run.permute(1, 2, 3, 0, 4, 5))
            self._wait_for_copies(runs)
        except radixkv.Error as e:
            _log.info("reading cached pages failed, serving a miss: %s", e)
            return None
        if not lease.confirm_read():
            return None
        kv = kv.to(device)
        cache = self.new_cache()
        for l, layer in enumerate(cache.layers):
            k, v = kv[l, 0].unsqueeze(0), kv[l, 1].unsqueeze(0)
            # A DynamicLayer holds its K/V as keys/values (1, H, tokens, D);
            # setting them directly saves update()'s concatenation copy.
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
        return cache

    def _write_and_commit(self, lease, cache) -> int:
        """Copies the lease's new blocks out of `cache` into its new pages,
        then commits them (release=True). 0 when the lease is lost or the
        daemon does not answer (nothing is committed then)."""
        spec = self.spec
        L, _, H, P, D = spec.page_shape
        first, count = lease.matched_blocks, lease.new_blocks
        start, stop = first * P, (first + count) * P
        layers = getattr(cache, "layers", None)
        if layers is None or len(layers) != L:
            raise _invalid("past_key_values", f"want a Cache with {L} layers, got "
                           f"{type(cache).__name__} with "
                           f"{len(layers) if layers is not None else 'no'} layers")
        for i, layer in enumerate(layers):
            k, v = layer.keys, layer.values
            if k is None or k.dim() != 4 or k.shape[0] != 1 or k.shape[1] != H or \
                    k.shape[3] != D or k.shape[2] < stop or v.shape != k.shape:
                got = None if k is None else tuple(k.shape)
                raise _invalid("past_key_values", f"layer {i}: K/V shape {got}; want "
                               f"(1, {H}, >= {stop}, {D}) (num_kv_heads, prompt "
                               "positions up to the last block to save, head_dim)")
            if k.dtype != self._page_dtype:
                raise _invalid("past_key_values", f"layer {i}: K/V dtype {k.dtype}; the "
                               f"namespace's dtype is {self._page_dtype}")
        # Prompt token t lies in block t // P, slot t % P of that block's
        # page: per layer and K/V, the cache's (H, count * P, D) is viewed as
        # (count, H, P, D) and copied per run of pages, with no intermediate
        # tensor beyond a move to the pool's device.
        try:
            runs = self._page_runs(lease, first, count)
            device = runs[0][1].device
            sources = [[x[0, :, start:stop].to(device).view(H, count, P, D).permute(1, 0, 2, 3)
                        for x in (layer.keys, layer.values)] for layer in layers]
            for j, run in runs:
                stop_j = j + run.shape[0]
                for l, kv in enumerate(sources):
                    run[:, l, 0].copy_(kv[0][j:stop_j])
                    run[:, l, 1].copy_(kv[1][j:stop_j])
            self._wait_for_copies(runs)   # the pages are complete
            lease.commit(count, release=True)
        except radixkv.Error as e:
            _log.info("saving %d blocks failed; they stay uncached: %s", count, e)
            return 0
        return count

    # -- whole requests ----------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, input_ids, **forward_kwargs) -> PrefillResult:
        """Prefill with radixkv: load the cached prefix, run the model on the
        suffix, save the new blocks. Returns the next token's logits (float32
        as the model gives them) and the cache of the whole prompt."""
        prefix = self.prepare(input_ids)
        try:
            out = self.model(input_ids=prefix.suffix_ids, past_key_values=prefix.cache,
                             use_cache=True, logits_to_keep=1, **forward_kwargs)
            saved = prefix.save()
        finally:
            prefix.close()
        return PrefillResult(out.logits[:, -1], prefix.cache, prefix.cached_tokens,
                             saved, prefix.prompt_tokens)

    def generate(self, input_ids, **generate_kwargs):
        """model.generate(input_ids, **generate_kwargs) with the prompt's
        cached prefix as past_key_values; the prompt's new blocks are saved
        right after its forward pass. Greedy and sampling decoding, one
        prompt (num_beams and num_return_sequences 1). The result is
        model.generate's."""
        for name in ("num_beams", "num_return_sequences"):
            if generate_kwargs.get(name, 1) != 1:
                raise _invalid(name, "must be 1: the cached prefix is one sequence")
        if "past_key_values" in generate_kwargs:
            raise _invalid("past_key_values", "is made by PrefixCache.generate")
        prefix = self.prepare(input_ids)
        processors = LogitsProcessorList(generate_kwargs.pop("logits_processor", None) or [])
        processors.append(prefix.save_after_prefill())
        try:
            out = self.model.generate(prefix.input_ids, past_key_values=prefix.cache,
                                      logits_processor=processors, **generate_kwargs)
            prefix.save()   # when generate asked for no scores at all
        finally:
            prefix.close()
        self.last = prefix
        return out


class _NoLease:
    """The lease of an acquire that failed on the daemon's side: holds
    nothing, like a degraded radixkv.Lease."""
    held = False
    degraded = True
    new_blocks = 0
    matched_blocks = 0

    def release(self) -> None:
        pass

    def __repr__(self) -> str:
        return "Lease(degraded=True)"
