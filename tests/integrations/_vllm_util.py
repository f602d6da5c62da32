"""Building blocks of the vLLM connector tests, from vLLM's own classes: a
tiny random-weight Llama (GQA) saved offline, VllmConfig with a
KVTransferConfig naming radixkv.integrations.vllm, a real
vllm.v1.core.sched.scheduler.Scheduler, real Requests, per-layer KV cache
tensors allocated by vLLM's allocate_kv_cache in a chosen KVCacheLayout,
and one engine step (scheduler -> worker connector -> update_from_output).

Run as a script, it is one side of the two-process round trip:
    python _vllm_util.py save|load <socket> <model_dir> <layout> <packing> <seed> <n>
'save' prefills a prompt (random K/V written by "attention" into vLLM's
blocks), saves and commits it; 'load' looks the prompt up in a fresh
scheduler, loads it into fresh vLLM blocks and checks the bytes equal the
ones 'save' wrote (regenerated from the seed). Prints one JSON line.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

BLOCK = 16
LAYERS = 2
KV_HEADS = 2
HEAD_DIM = 32
NUM_BLOCKS = 64
LAYER_NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def make_model(path, seed=0):
    """A 2-layer Llama with 4 query heads and 2 KV heads (head_dim 32),
    random weights, saved with save_pretrained (config.json + weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=LAYERS, num_attention_heads=4,
                      num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                      max_position_embeddings=4096)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def vllm_config(model_dir, extra, block_size=BLOCK, dtype="float32",
                cache_dtype="auto", num_blocks=NUM_BLOCKS, tp=1, max_batched=4096):
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                             ParallelConfig, SchedulerConfig, VllmConfig)
    mc = ModelConfig(model=model_dir, tokenizer=None, skip_tokenizer_init=True,
                     dtype=dtype, seed=0, max_model_len=4096)
    cc = CacheConfig(block_size=block_size, cache_dtype=cache_dtype)
    sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=max_batched,
                         max_model_len=4096, enable_chunked_prefill=True,
                         is_encoder_decoder=False)
    kt = KVTransferConfig(kv_connector="RadixKVConnector",
                          kv_connector_module_path="radixkv.integrations.vllm",
                          kv_role="kv_both", kv_connector_extra_config=dict(extra))
    vc = VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc,
                    parallel_config=ParallelConfig(tensor_parallel_size=tp),
                    kv_transfer_config=kt, device_config=DeviceConfig("cpu"))
    vc.cache_config.num_gpu_blocks = num_blocks
    return vc


def attention_spec(vc):
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    mc = vc.model_config
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    cache_dtype = vc.cache_config.cache_dtype
    dtype = mc.dtype if cache_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
    return FullAttentionSpec(block_size=vc.cache_config.block_size,
                             num_kv_heads=mc.get_total_num_kv_heads() //
                             vc.parallel_config.tensor_parallel_size,
                             head_size=mc.get_head_size(), dtype=dtype)


def kv_cache_config(vc, layout="LBHNC", num_blocks=NUM_BLOCKS):
    """The KVCacheConfig vLLM would build for one full-attention group,
    with the tensor placement of `layout` (layer- or block-outermost)."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
    spec = attention_spec(vc)
    page = spec.page_size_bytes
    if layout.startswith("L"):
        layer_stride, block_stride = page * num_blocks, page
    else:
        layer_stride, block_stride = page, page * LAYERS
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[KVCacheTensor(size=LAYERS * num_blocks * page, layers=LAYER_NAMES,
                                        layer_stride=layer_stride,
                                        block_stride=block_stride)],
        kv_cache_groups=[KVCacheGroupSpec(list(LAYER_NAMES), spec)],
        kv_cache_layout=layout)


def allocate(kcc, layout):
    """Per-layer KV tensors on the CPU, as the model runner allocates them
    (vllm.v1.worker.utils.allocate_kv_cache)."""
    from vllm.v1.kv_cache_interface import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache
    return allocate_kv_cache(kcc, torch.device("cpu"), KVCacheLayout[layout])


def scheduler(vc, kcc):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager
    return Scheduler(vllm_config=vc, kv_cache_config=kcc,
                     structured_output_manager=StructuredOutputManager(vc),
                     block_size=vc.cache_config.block_size, log_stats=True)


def worker_connector(vc, kcc):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    return KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kcc)


def request(rid, tokens, max_tokens=1):
    from vllm import SamplingParams
    from vllm.v1.request import Request
    return Request(request_id=rid, prompt_token_ids=list(tokens),
                   sampling_params=SamplingParams(max_tokens=max_tokens),
                   pooling_params=None)


def kv_views(caches, packing):
    """K and V of each layer as the attention backend reads them, from
    vLLM's own backend conventions: the CPU backend views each layer as
    [B, H, 2N, D] and takes the first N rows as K; the CUDA backends split
    the content dim C = [K | V]."""
    out = {}
    for name, kv in caches.items():
        if packing == "head_blocks":
            b, h, n, _ = kv.shape
            k, v = kv.view(b, h, 2 * n, -1).chunk(2, dim=2)
        else:
            k, v = kv.split(HEAD_DIM, dim=-1)
        out[name] = (k, v)
    return out


def bits(t):
    """The bytes of a tensor, for bit-exact comparison."""
    return t.contiguous().view(-1).view(torch.uint8)


def fill_blocks(caches, packing, block_ids, seed, block_offset=0):
    """Writes deterministic random K/V into vLLM blocks, as attention's
    cache write would: block j of the prompt (block_offset + j) gets values
    from (seed, j) alone, so another process can regenerate them."""
    for li, (name, (k, v)) in enumerate(sorted(kv_views(caches, packing).items())):
        for j, b in enumerate(block_ids):
            g = torch.Generator().manual_seed(seed * 1000003 + (block_offset + j) * 101 + li)
            kk = torch.randn(k[b].shape, generator=g, dtype=torch.float32).to(k.dtype)
            vv = torch.randn(v[b].shape, generator=g, dtype=torch.float32).to(v.dtype)
            k[b].copy_(kk)
            v[b].copy_(vv)


def expected_blocks(caches, packing, n_blocks, seed):
    """What fill_blocks wrote for prompt blocks 0..n-1: {layer: [(K, V)]}."""
    out = {}
    for li, (name, (k, v)) in enumerate(sorted(kv_views(caches, packing).items())):
        rows = []
        for j in range(n_blocks):
            g = torch.Generator().manual_seed(seed * 1000003 + j * 101 + li)
            kk = torch.randn(k[0].shape, generator=g, dtype=torch.float32).to(k.dtype)
            vv = torch.randn(v[0].shape, generator=g, dtype=torch.float32).to(v.dtype)
            rows.append((kk, vv))
        out[name] = rows
    return out


def run_step(sched, worker, caches, packing, seed, fill=True):
    """One engine step: schedule, the worker connector's load -> per layer
    wait/"attention writes the computed blocks"/save -> wait_for_save, and
    the step's output back into the scheduler. Returns (scheduler_output,
    connector metadata, worker metadata, load errors)."""
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    so = sched.schedule()
    meta = so.kv_connector_metadata
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(None)
    # Tokens each scheduled request had computed before this step.
    cached = so.scheduled_cached_reqs
    before = {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs}
    before.update(zip(cached.req_ids, cached.num_computed_tokens))
    if fill:
        for rid, done in before.items():
            blocks = sched.kv_cache_manager.get_block_ids(rid)[0]
            first = done // BLOCK
            last = (done + so.num_scheduled_tokens[rid]) // BLOCK
            fill_blocks(caches, packing, blocks[first:last], seed, block_offset=first)
    for name in sorted(caches):
        worker.wait_for_layer_load(name)
        worker.save_kv_layer(name, caches[name], None)
    worker.wait_for_save()
    wmeta = worker.build_connector_worker_meta()
    load_errors = worker.get_block_ids_with_load_errors()
    worker.clear_connector_metadata()
    req_ids = list(so.num_scheduled_tokens)
    # A token is sampled only by a step that reaches the end of the prompt
    # (a partial chunked-prefill step samples nothing).
    sampled = [[7] if before.get(r, 0) + so.num_scheduled_tokens[r] >=
               sched.requests[r].num_prompt_tokens else [] for r in req_ids]
    out = ModelRunnerOutput(
        req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
        kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=wmeta,
                                              invalid_block_ids=set(load_errors)))
    sched.update_from_output(so, out)
    return so, meta, wmeta, load_errors


def _side(mode, sock, model_dir, layout, packing, seed, n_tokens):
    extra = {"endpoint": sock, "kv_packing": packing}
    vc = vllm_config(model_dir, extra)
    kcc = kv_cache_config(vc, layout)
    caches = allocate(kcc, layout)
    sched = scheduler(vc, kcc)
    worker = worker_connector(vc, kcc)
    worker.register_kv_caches(caches)
    tokens = [(i * 7 + seed) % 256 for i in range(n_tokens)]
    sched.add_request(request(f"{mode}-0", tokens))
    result = {"mode": mode}
    so, meta, wmeta, errs = run_step(sched, worker, caches, packing, seed,
                                     fill=(mode == "save"))
    result["loads"] = sum(len(x.pages) for x in meta.loads)
    result["saves"] = sum(len(x.pages) for x in meta.saves)
    result["load_errors"] = len(errs)
    if mode == "load":
        new = so.scheduled_new_reqs[0]
        loaded = meta.loads[0].block_ids if meta.loads else []
        want = expected_blocks(caches, packing, len(loaded), seed)
        views = kv_views(caches, packing)
        equal = bool(loaded)
        for name, rows in want.items():
            k, v = views[name]
            for j, b in enumerate(loaded):
                equal &= torch.equal(bits(k[b]), bits(rows[j][0]))
                equal &= torch.equal(bits(v[b]), bits(rows[j][1]))
        result["bit_exact"] = equal
        result["num_computed_tokens"] = new.num_computed_tokens
    sched.connector.shutdown()
    worker.shutdown()
    return result


if __name__ == "__main__":
    mode, sock, model_dir, layout, packing, seed, n = sys.argv[1:8]
    print(json.dumps(_side(mode, sock, model_dir, layout, packing, int(seed), int(n))),
          flush=True)
