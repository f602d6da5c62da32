#!/usr/bin/env python3
"""Time to first token of a transformers model on CPU with radixkv
(radixkv.integrations.transformers.PrefixCache.prefill) when 90 % of a
2k-token prompt is cached, against no cache, and against the ideal.

    PYTHONPATH=build/default/python nice .venv/bin/python bench/integrations/hf_ttft.py \
        --radixkvd=build/default/daemon/radixkvd

Timed (medians of --repeats rounds; the kinds alternate within a round):
  full     the model's own forward over the whole prompt (no radixkv)
  suffix   the model's own forward over the uncached suffix on a cache
           prefilled in memory (no radixkv): the least a hit can cost
  hit      PrefixCache.prefill of a prompt whose first cached_tokens are
           in radixkv: acquire, copy the pages into a DynamicCache, the
           suffix's forward, write its new blocks, commit
  miss     PrefixCache.prefill of a prompt radixkv has never seen: the
           whole forward plus writing every full block, then commit
Every prompt of a round is new past the shared prefix, so a hit matches the
prefix only. All forwards ask for the last position's logits only.

ideal speed-up = full / suffix; achieved = full / hit; ratio = achieved /
ideal = suffix / hit (goal: >= 0.8), from wall-clock medians; the same
from this process's CPU time (time.process_time, all its threads) is
"cpu_time", the figure to read on a machine other jobs share (the 1-minute
load average before and after is printed beside the core count). Prints
one JSON object.
"""
import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--radixkvd", default=os.environ.get("RADIXKVD", ""),
                   help="radixkvd binary (default $RADIXKVD)")
    p.add_argument("--model", default="",
                   help="a saved causal LM to load instead of the random Llama")
    p.add_argument("--prompt_tokens", type=int, default=2048)
    p.add_argument("--cached_fraction", type=float, default=0.9)
    p.add_argument("--page_size", type=int, default=16)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv_heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--pool", default="host,bytes=512MiB")
    return p.parse_args(argv)


def start_daemon(binary, workdir, pool):
    sock = os.path.join(workdir, "radixkvd.sock")
    log = open(os.path.join(workdir, "radixkvd.log"), "w")
    proc = subprocess.Popen([binary, "--socket=" + sock, "--metrics_listen=",
                             "--pool=" + pool], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        with open(log.name) as f:
            if "radixkvd: ready" in f.read():
                return proc, sock
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    with open(log.name) as f:
        raise RuntimeError("radixkvd did not become ready:\n" + f.read())


def build_model(args, workdir):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    if args.model:
        return AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         max_position_embeddings=max(4096, args.prompt_tokens))
    path = os.path.join(workdir, "bench-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def main(argv=None):
    args = parse_args(argv)
    if not args.radixkvd or not os.access(args.radixkvd, os.X_OK):
        sys.exit("--radixkvd (or $RADIXKVD) must name the radixkvd binary")
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import DynamicCache

    from radixkv.integrations.transformers import PrefixCache

    n, P = args.prompt_tokens, args.page_size
    shared = int(n * args.cached_fraction)         # the prefix every hit prompt shares
    with tempfile.TemporaryDirectory(prefix="hf_ttft") as workdir:
        model = build_model(args, workdir)
        vocab = model.config.get_text_config(decoder=True).vocab_size
        proc, sock = start_daemon(args.radixkvd, workdir, args.pool)
        try:
            gen = torch.Generator().manual_seed(1)

            def tokens(count):
                return torch.randint(1, vocab, (1, count), generator=gen)

            prefix = tokens(shared)
            cached = (shared // P) * P                  # what a hit can load
            with PrefixCache(model, endpoint=sock) as pc, torch.inference_mode():
                seeded = pc.prefill(torch.cat([prefix, tokens(n - shared)], 1))
                prefix_kv = [(layer.keys[:, :, :cached].clone(),
                              layer.values[:, :, :cached].clone())
                             for layer in seeded.cache.layers]
                del seeded

                def timed(fn, *a, **kw):
                    """(wall seconds, this process's CPU seconds, fn's result)."""
                    w, c = time.perf_counter(), time.process_time()
                    out = fn(*a, **kw)
                    return time.perf_counter() - w, time.process_time() - c, out

                def run_full():
                    ids = tokens(n)
                    return timed(model, input_ids=ids, use_cache=True, logits_to_keep=1,
                                 past_key_values=DynamicCache(config=model.config))[:2]

                def run_suffix():
                    cache = DynamicCache(prefix_kv, config=model.config)
                    ids = tokens(n - cached)
                    return timed(model, input_ids=ids, past_key_values=cache,
                                 use_cache=True, logits_to_keep=1)[:2]

                hit_cached = []

                def run_hit():
                    wall, cpu, res = timed(pc.prefill, torch.cat([prefix, tokens(n - shared)], 1))
                    hit_cached.append(res.cached_tokens)
                    return wall, cpu

                miss_saved = []

                def run_miss():
                    wall, cpu, res = timed(pc.prefill, tokens(n))
                    assert res.cached_tokens == 0
                    miss_saved.append(res.saved_blocks)
                    return wall, cpu

                kinds = {"full": run_full, "suffix": run_suffix, "hit": run_hit,
                         "miss": run_miss}
                load_before = os.getloadavg()
                for fn in kinds.values():     # warm-up
                    fn()
                times = {k: [] for k in kinds}
                cpu = {k: [] for k in kinds}
                for _ in range(args.repeats):
                    for k, fn in kinds.items():
                        wall, c = fn()
                        times[k].append(wall)
                        cpu[k].append(c)

                # One hit split into its steps.
                ids = torch.cat([prefix, tokens(n - shared)], 1)
                t0 = time.perf_counter()
                hit = pc.prepare(ids)
                t1 = time.perf_counter()
                model(input_ids=hit.suffix_ids, past_key_values=hit.cache, use_cache=True,
                      logits_to_keep=1)
                t2 = time.perf_counter()
                saved = hit.save()
                t3 = time.perf_counter()
                stats = pc.client.stats()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)

    med = {k: statistics.median(v) for k, v in times.items()}
    ideal = med["full"] / med["suffix"]
    achieved = med["full"] / med["hit"]
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    ideal_cpu = med_cpu["full"] / med_cpu["suffix"]
    achieved_cpu = med_cpu["full"] / med_cpu["hit"]
    cfg = model.config.get_text_config(decoder=True)
    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "torch_threads": torch.get_num_threads(),
        "model": {"hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers,
                  "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
                  "intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size,
                  "dtype": "float32", "params": sum(p.numel() for p in model.parameters())},
        "prompt_tokens": n, "shared_prefix_tokens": shared,
        "cached_tokens": sorted(set(hit_cached)), "suffix_tokens": n - cached,
        "page_size": P, "repeats": args.repeats,
        "load_average_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "all_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "median_cpu_s": {k: round(v, 4) for k, v in med_cpu.items()},
        "all_cpu_s": {k: [round(x, 4) for x in v] for k, v in cpu.items()},
        "hit_steps_s": {"acquire_and_load": round(t1 - t0, 4), "forward": round(t2 - t1, 4),
                        "write_and_commit": round(t3 - t2, 4), "saved_blocks": saved},
        "miss_saved_blocks": sorted(set(miss_saved)),
        "ideal_speedup": round(ideal, 3),
        "achieved_speedup": round(achieved, 3),
        "ratio_to_ideal": round(achieved / ideal, 3),
        "goal_ratio": 0.8,
        "cpu_time": {"ideal_speedup": round(ideal_cpu, 3),
                     "achieved_speedup": round(achieved_cpu, 3),
                     "ratio_to_ideal": round(achieved_cpu / ideal_cpu, 3)},
        "miss_overhead": round(med["miss"] / med["full"] - 1, 4),
        "daemon": {"leases": stats.leases, "writing_pages": stats.writing_pages,
                   "hit_tokens": stats.hit_tokens, "inserted_blocks": stats.inserted_blocks},
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
