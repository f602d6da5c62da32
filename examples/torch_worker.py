#!/usr/bin/env python3
"""torch_worker: radixkv-worker's model in PyTorch, serving prompts through radixkvd.

    radixkv-worker export-weights --model small --out small.safetensors
    PYTHONPATH=build/default/python examples/torch_worker.py \\
        --weights small.safetensors --text prompt.txt --decode 16

Both workers run the identical model (reference_model.py loads the weights
radixkv-worker exported and checks its forward pass against the file's probe
logits) in the identical namespace (the file's `namespace` metadata, the one
radixkv-worker builds for the same model flags), so each hits the blocks the
other committed. Per prompt, as worker/engine.cc does:

  1. acquire(prompt): the daemon pins the longest cached prefix and gives
     pages for the next full blocks;
  2. the cached prefix's K/V are read from the pool's pages through
     zero-copy views (radixkv.Client(attach_pool=True), host pool) into the
     request's context; every cached token is reused except the last prompt
     token, which always runs so that the first output has logits;
  3. only the suffix is prefilled; its attention reads the prefix K/V;
  4. the new full blocks' K/V are written into the new pages and committed
     (the lease stays held: decode keeps reading the prefix);
  5. greedy decode; the lease is released at the end.

Output: one JSON object per prompt with the keys of `radixkv-worker run
--json` (prompt, tokens, matched_tokens, cache, ttft_s, decode_tokens_per_s,
committed_blocks, generated) plus `logits`, a summary of the last prompt
token's logits (argmax, max, min, mean, top5 as [token, logit] pairs).
`--logits-out FILE` also saves those logits, one row per prompt, as .npy.

Input is radixkv-worker's: `--text FILE` (each line's bytes are its tokens),
`--prompts FILE` (token ids separated by spaces or commas), or `--tokens`
(ids on the command line). Without a daemon (or with --no-cache) every prompt
is prefilled in full and the generated tokens are the same.

Exit codes: 0 ok, 1 error, 3 bad arguments (as radixkv-worker).
"""
import argparse
import json
import os
import re
import sys
import time
from typing import List, Optional, Sequence

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_model import ReferenceModel  # noqa: E402

EXIT_ERROR = 1
EXIT_USAGE = 3
# The most the file's probe logits may differ from this forward pass's.
PROBE_TOLERANCE = 1e-3


def namespace_spec(model: ReferenceModel):
    """The NamespaceSpec radixkv-worker uses for the exported model."""
    from radixkv.keys import NamespaceSpec  # pylint: disable=import-outside-toplevel
    return NamespaceSpec(**model.namespace)


def radixkv_error():
    from radixkv.errors import Error  # pylint: disable=import-outside-toplevel
    return Error


def open_client(model: ReferenceModel, endpoint: Optional[str], timeout: float,
                client_name: str = "torch-worker"):
    """A radixkv.Client in the model's namespace with the pool mapped; a note
    on stderr when no session opens within `timeout` (acquires then degrade
    to misses)."""
    from radixkv.client import Client  # pylint: disable=import-outside-toplevel
    client = Client(endpoint=endpoint, namespace=namespace_spec(model),
                    client_name=client_name, attach_pool=True,
                    call_timeout=timeout, initial_wait=timeout)
    if not client.connected:
        print(f"torch_worker: no session with radixkvd at {endpoint or 'the default socket'}"
              "; prefilling without the cache", file=sys.stderr)
    return client


def logits_summary(logits: torch.Tensor) -> dict:
    top = torch.topk(logits, k=min(5, logits.numel()))
    return {
        "argmax": int(torch.argmax(logits)),
        "max": round(float(logits.max()), 6),
        "min": round(float(logits.min()), 6),
        "mean": round(float(logits.mean()), 6),
        "top5": [[int(i), round(float(v), 6)] for v, i in zip(top.values, top.indices)],
    }


class TorchWorker:
    """Runs requests of `model` through `client` (None: no cache). Mirrors
    radixkv-worker's Engine::Run."""

    def __init__(self, model: ReferenceModel, client=None):
        self.model = model
        self.client = client

    def _acquire(self, prompt: Sequence[int]):
        """The lease for `prompt`, or None when its pages cannot be read (no
        cache, daemon away, no mapped pool): such a request is a miss."""
        if self.client is None:
            return None, "none"
        lease = self.client.acquire(prompt, allocate=True)
        if lease.degraded:
            return None, "degraded"
        try:
            for i in range(len(lease.pages)):
                lease.page_tensor(i)
        except Exception as e:  # pylint: disable=broad-except
            print(f"torch_worker: lease pages not readable ({e}); prefilling "
                  "without the cache", file=sys.stderr)
            lease.release()
            return None, "degraded"
        return lease, "daemon"

    def _write_and_commit(self, lease, ctx) -> int:
        """Writes the lease's new blocks (the ones after the matched prefix,
        computed into `ctx`) into its new pages and commits them, keeping the
        lease. Returns the blocks committed; a failed commit only costs
        future hits (a note on stderr)."""
        ps = self.model.page_size
        if lease.new_blocks == 0:
            return 0
        try:
            for j in range(lease.new_blocks):
                b = lease.matched_blocks + j
                page = lease.page_tensor(b)  # LeaseLost once it is not live
                page[:, 0] = ctx.k[:, :, b * ps:(b + 1) * ps]
                page[:, 1] = ctx.v[:, :, b * ps:(b + 1) * ps]
        except radixkv_error() as e:
            # The lease expired or its session ended: its pages are no longer
            # this worker's to write. The blocks stay uncached.
            print(f"torch_worker: lease lost before writing ({e}); the blocks "
                  "stay uncached", file=sys.stderr)
            return 0
        try:
            lease.commit(lease.new_blocks, release=False)
        except radixkv_error() as e:
            print(f"torch_worker: commit failed ({e}); the blocks stay uncached",
                  file=sys.stderr)
            return 0
        return lease.new_blocks

    def _read_prefix(self, lease, ctx, pages: int) -> bool:
        """Copies the first `pages` pages of the cached prefix into `ctx`;
        False when the lease stopped being live before the copy finished."""
        ps = self.model.page_size
        try:
            for b in range(pages):
                page = lease.page_tensor(b)  # (L, 2, H, P, D), a view of the page
                ctx.k[:, :, b * ps:(b + 1) * ps] = page[:, 0]
                ctx.v[:, :, b * ps:(b + 1) * ps] = page[:, 1]
        except radixkv_error():
            return False
        return lease.confirm_read()

    def run(self, prompt: Sequence[int], decode: int = 1) -> dict:
        """Serves one prompt; returns the run --json fields plus
        `first_logits` (torch tensor) and `matched_blocks`."""
        m, ps = self.model, self.model.page_size
        prompt = [int(t) for t in prompt]
        n = len(prompt)
        if n == 0 or decode < 1:
            raise ValueError("a prompt needs tokens and decode must be >= 1")
        t0 = time.perf_counter()
        lease, cache = self._acquire(prompt)
        try:
            matched = lease.matched_blocks if lease is not None else 0
            # Reuse every cached token but the last prompt token.
            prefix = min(matched * ps, n - 1)
            prefix_pages = -(-prefix // ps)
            ctx = m.new_context(max(prefix_pages * ps, n + decode))
            if prefix_pages and not self._read_prefix(lease, ctx, prefix_pages):
                # The lease was lost while reading: what was read may not be
                # this prefix's K/V. A miss: prefill everything.
                prefix, matched, cache = 0, 0, "degraded"
            ctx.size = prefix
            logits = m.forward(ctx, prompt[prefix:])
            token = int(torch.argmax(logits))
            ttft = time.perf_counter() - t0
            generated, first_logits = [token], logits
            committed = self._write_and_commit(lease, ctx) if lease is not None else 0

            t1 = time.perf_counter()
            for _ in range(decode - 1):
                logits = m.forward(ctx, [token])
                token = int(torch.argmax(logits))
                generated.append(token)
            decode_s = time.perf_counter() - t1
        finally:
            if lease is not None:
                lease.drop()  # the release rides on the next acquire
        return {
            "tokens": n,
            "matched_tokens": prefix,
            "matched_blocks": matched,
            "cache": cache,
            "ttft_s": round(ttft, 6),
            "decode_tokens_per_s": round((decode - 1) / decode_s, 2)
                                   if decode > 1 and decode_s > 0 else 0.0,
            "committed_blocks": committed,
            "generated": generated,
            "first_logits": first_logits,
        }


def read_prompts(path: str, text: bool, vocab: int) -> List[List[int]]:
    """radixkv-worker's prompt file: one prompt per line, empty lines
    skipped. ValueError naming the line for a bad token."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    prompts = []
    for no, line in enumerate(lines, 1):
        if text:
            p = list(line)
        else:
            p = []
            for tok in re.split(rb"[ ,\t\r]+", line):
                if not tok:
                    continue
                if not tok.isdigit():
                    raise ValueError(f"{path}:{no}: \"{tok.decode(errors='replace')}\" "
                                     "is not a token id")
                p.append(int(tok))
        if not p:
            continue
        bad = [t for t in p if t >= vocab]
        if bad:
            raise ValueError(f"{path}:{no}: token {bad[0]} is not below vocab {vocab}")
        prompts.append(p)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="radixkv-worker's model in PyTorch: prefill only the uncached "
                    "suffix of each prompt through radixkvd, decode greedily.")
    p.add_argument("--weights", required=True, metavar="FILE",
                   help="file written by radixkv-worker export-weights")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", metavar="FILE", help="prompts as text (a line's bytes)")
    src.add_argument("--prompts", metavar="FILE", help="prompts as token ids")
    src.add_argument("--tokens", metavar="IDS",
                     help="one prompt: ids separated by spaces or commas")
    p.add_argument("--decode", type=int, default=16, help="tokens to generate (>= 1)")
    p.add_argument("--no-cache", action="store_true", help="do not contact the daemon")
    p.add_argument("--endpoint", default=None,
                   help="radixkvd endpoint, as radixkvctl's (default: the daemon's socket)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="deadline of each call and of the first session")
    p.add_argument("--logits-out", metavar="FILE",
                   help="save each prompt's last-token logits (.npy, one row per prompt)")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        sys.exit(EXIT_USAGE if e.code else 0)
    if args.decode < 1:
        p.print_usage(sys.stderr)
        print("torch_worker: --decode must be >= 1", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        model = ReferenceModel.load(args.weights)
    except (OSError, ValueError, KeyError) as e:
        print(f"torch_worker: {args.weights}: {e}", file=sys.stderr)
        return EXIT_USAGE
    diff = model.check_probe()
    if diff > PROBE_TOLERANCE:
        print(f"torch_worker: forward pass differs from the exported probe logits "
              f"by {diff:g}", file=sys.stderr)
        return EXIT_ERROR
    try:
        if args.tokens is not None:
            prompts = [[int(t) for t in re.split(r"[ ,\t]+", args.tokens.strip()) if t]]
            if not prompts[0] or max(prompts[0]) >= model.vocab:
                raise ValueError(f"--tokens: want ids below vocab {model.vocab}")
        else:
            prompts = read_prompts(args.text or args.prompts, args.text is not None,
                                   model.vocab)
    except (OSError, ValueError) as e:
        print(f"torch_worker: {e}", file=sys.stderr)
        return EXIT_USAGE
    client = None if args.no_cache else open_client(model, args.endpoint, args.timeout)
    worker = TorchWorker(model, client)
    rows = []
    try:
        for i, prompt in enumerate(prompts):
            r = worker.run(prompt, args.decode)
            rows.append(r["first_logits"].numpy())
            out = {"prompt": i}
            out.update({k: r[k] for k in ("tokens", "matched_tokens", "cache", "ttft_s",
                                          "decode_tokens_per_s", "committed_blocks",
                                          "generated")})
            out["logits"] = logits_summary(r["first_logits"])
            print(json.dumps(out), flush=True)
    finally:
        if client is not None:
            client.close()
    if args.logits_out:
        np.save(args.logits_out, np.stack(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
