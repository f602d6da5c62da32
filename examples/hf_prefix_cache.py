#!/usr/bin/env python3
"""A transformers model with radixkv's prefix cache, offline.

    # a radixkvd of its own (a child process on a temporary socket):
    PYTHONPATH=build/default/python .venv/bin/python examples/hf_prefix_cache.py \
        --radixkvd=build/default/daemon/radixkvd
    # or a daemon that already runs (the default socket, or --endpoint):
    PYTHONPATH=build/default/python .venv/bin/python examples/hf_prefix_cache.py

Without --model it builds a small random-weight Llama (GQA, RoPE) and saves
it to --model_dir (default: a temporary directory), so that every run, and
every process, loads the same weights; --model=PATH loads a saved causal LM
instead (with its tokenizer, when it has one). The same prompt is generated
twice: the first run misses and saves the prompt's blocks, the second loads
them and computes only the rest. Both print the same tokens.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.generation.streamers import BaseStreamer

from radixkv.integrations.transformers import PrefixCache


def small_llama(path: str):
    if not os.path.exists(os.path.join(path, "config.json")):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=4000, hidden_size=256, intermediate_size=688,
                             num_hidden_layers=4, num_attention_heads=8,
                             num_key_value_heads=2, max_position_embeddings=4096)
        LlamaForCausalLM(config).save_pretrained(path)
    return LlamaForCausalLM.from_pretrained(path).eval()


class FirstTokenClock(BaseStreamer):
    """generate() hands a streamer the prompt, then each new token: the
    time of the first new token is the time to first token."""

    def __init__(self):
        self.start = time.perf_counter()
        self.calls = 0
        self.first_token_s = None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:
            self.first_token_s = time.perf_counter() - self.start

    def end(self):
        pass


def start_daemon(binary: str, workdir: str):
    sock = os.path.join(workdir, "radixkvd.sock")
    log_path = os.path.join(workdir, "radixkvd.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([binary, "--socket=" + sock, "--metrics_listen=",
                                 "--pool=host,bytes=256MiB"], stdout=log,
                                stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        with open(log_path) as f:
            if "radixkvd: ready" in f.read():
                return proc, sock
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    sys.exit(f"radixkvd did not start; see {log_path}")


def main() -> int:
    p = argparse.ArgumentParser(description="transformers + radixkv prefix cache")
    p.add_argument("--model", default="", help="a saved causal LM directory")
    p.add_argument("--model_dir", default="", help="where the small Llama is saved")
    p.add_argument("--radixkvd", default="", help="start this radixkvd as a child")
    p.add_argument("--endpoint", default=None, help="socket of a running radixkvd")
    p.add_argument("--prompt_tokens", type=int, default=1000)
    p.add_argument("--new_tokens", type=int, default=16)
    args = p.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="hf_prefix_cache")
    workdir = tmp.name
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    else:
        model = small_llama(args.model_dir or os.path.join(workdir, "small-llama"))
    daemon, endpoint = None, args.endpoint
    if args.radixkvd:
        daemon, endpoint = start_daemon(args.radixkvd, workdir)

    vocab = model.config.get_text_config(decoder=True).vocab_size
    prompt = torch.randint(1, vocab, (1, args.prompt_tokens),
                           generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():   # one-time start-up costs, not counted below
        model(input_ids=prompt[:, :16])
    try:
        with PrefixCache(model, endpoint=endpoint) as pc:
            print(f"namespace: model={pc.spec.model!r} layers={pc.spec.num_layers} "
                  f"kv_heads={pc.spec.num_kv_heads} head_dim={pc.spec.head_dim} "
                  f"page_size={pc.spec.page_size} dtype={model.dtype}")
            outputs = []
            for run in (1, 2):
                clock = FirstTokenClock()
                out = pc.generate(prompt, max_new_tokens=args.new_tokens,
                                  do_sample=False, pad_token_id=0, streamer=clock)
                new = out[0, args.prompt_tokens:].tolist()
                outputs.append(new)
                print(f"run {run}: {pc.last.cached_tokens} of {args.prompt_tokens} "
                      f"prompt tokens from radixkv, {pc.last.saved_blocks} blocks "
                      f"saved, first token after {clock.first_token_s:.3f} s; "
                      f"tokens {new}")
            if not pc.client.connected:
                print("radixkvd is not reachable: both runs were full prefills")
            print("same tokens:", outputs[0] == outputs[1])
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
