#!/usr/bin/python3
"""Synthetic prefix-caching workloads in the Mooncake trace format.

Writes JSON lines with the fields of bench/data/README.md: timestamp (ms
from the first request), input_length and output_length (tokens) and
hash_ids (the prompt as 512-token blocks). Block ids are prefix-chained:
two prompts get the same id at position i exactly when their first
(i + 1) * 512 tokens are equal, so equal prefixes share ids and a block's
id also names everything before it. The last block of a prompt may be
partial; it is then a different block from any longer prompt's full block
at that position, as in the real trace.

A prompt is built from segments (a system prompt, a document, a user
message, a tool result ...); each segment is a run of tokens with an
identity, so two prompts share a block when the segments laid over it, and
their offsets, are the same. Output is a pure function of the shape, its
parameters and --seed.

Shapes (one subcommand each; `all` writes every shape with its defaults):

  agent    Agent loops: sessions with one of a few long system prompts
           (tool definitions; Zipf-popular), a task, then steps that each
           append an action and a tool result; steps of a session follow
           each other after a short pause, many sessions run at once.
  rag      Retrieval-augmented queries: system prompt + k documents drawn
           from a Zipf-popular set (in retrieval order) + a question.
  oneshot  Many independent prompts: a short template (few, Zipf-popular)
           and unique content; a small share are retried verbatim soon
           after. Little reuse.
  chat     Multi-turn chat with long pauses: each turn's prompt is the
           previous prompt, the reply and a new message; turns of a
           conversation are hundreds to thousands of requests apart.

  bench/workloads/gen.py agent --requests=25000 --seed=1 --out=agent.jsonl
  bench/workloads/gen.py all --out_dir=build/default/data/workloads
  bench/workloads/gen.py self_test

Standard library only.
"""

import argparse
import heapq
import json
import math
import os
import random
import sys

BLOCK = 512


class Blocks:
    """Turns prompts (lists of segments) into prefix-chained block ids.

    A segment is (segment id, length in tokens). A block's content is the
    tuple of (segment id, first token, last token + 1) pieces it covers; its
    id is interned from (parent block id, content), so ids are equal exactly
    when whole prefixes are equal. Ids are handed out in first-seen order.
    """

    def __init__(self):
        self.ids = {}

    def hash_ids(self, segments):
        out = []
        parent = -1
        pieces = []
        room = BLOCK
        for seg, length in segments:
            pos = 0
            while pos < length:
                take = min(room, length - pos)
                pieces.append((seg, pos, pos + take))
                pos += take
                room -= take
                if room == 0:
                    parent = self._intern(parent, pieces)
                    out.append(parent)
                    pieces = []
                    room = BLOCK
        if pieces:
            out.append(self._intern(parent, pieces))
        return out

    def _intern(self, parent, pieces):
        key = (parent, tuple(pieces))
        bid = self.ids.get(key)
        if bid is None:
            bid = len(self.ids)
            self.ids[key] = bid
        return bid


class Segments:
    """Hands out fresh segment ids (distinct content)."""

    def __init__(self):
        self.next = 0

    def new(self):
        self.next += 1
        return self.next


def zipf_sampler(rng, n, s):
    """A function drawing ranks 0..n-1 with P(r) proportional to 1/(r+1)^s."""
    weights = [1.0 / (r + 1) ** s for r in range(n)]
    total = sum(weights)
    cum = []
    acc = 0.0
    for w in weights:
        acc += w / total
        cum.append(acc)

    def draw():
        u = rng.random()
        lo, hi = 0, n - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if cum[mid] < u:
                lo = mid + 1
            else:
                hi = mid
        return lo
    return draw


def lognormal_int(rng, median, sigma, lo, hi):
    """A lognormal draw around `median`, rounded and clamped to [lo, hi]."""
    return int(min(hi, max(lo, round(median * math.exp(rng.gauss(0, sigma))))))


def emit(out, blocks, now_ms, segments, output_length):
    ids = blocks.hash_ids(segments)
    out.append({
        "timestamp": int(now_ms),
        "input_length": sum(length for _, length in segments),
        "output_length": int(output_length),
        "hash_ids": ids,
    })


def gen_agent(a, rng):
    """Agent loops over shared system prompts; see the module docstring.

    `a.active` sessions run at once; a session's next step is ready
    exp(a.step_ms) after its previous request; a finished session is
    replaced by a new one at once. Steps per session: geometric with mean
    a.steps (at most 4x that).
    """
    segs = Segments()
    blocks = Blocks()
    system = [(segs.new(), lognormal_int(rng, a.system_tokens, 0.5, 1024,
                                         8 * a.system_tokens))
              for _ in range(a.systems)]
    pick_system = zipf_sampler(rng, a.systems, 1.0)

    def new_session():
        prompt = [system[pick_system()],
                  (segs.new(), lognormal_int(rng, 600, 0.8, 50, 6000))]
        steps = min(4 * a.steps, 1 + int(rng.expovariate(1.0 / a.steps)))
        return {"prompt": prompt, "left": steps}

    ready = []
    clock = 0.0
    for i in range(a.active):
        heapq.heappush(ready, (rng.expovariate(1.0 / a.step_ms), i,
                               new_session()))
    out = []
    serial = a.active
    while len(out) < a.requests:
        clock, i, s = heapq.heappop(ready)
        emit(out, blocks, clock, s["prompt"],
             lognormal_int(rng, 150, 0.7, 5, 2000))
        s["left"] -= 1
        if s["left"] <= 0:
            serial += 1
            i, s = serial, new_session()
        else:
            s["prompt"] = s["prompt"] + [
                (segs.new(), lognormal_int(rng, 150, 0.7, 5, 2000)),
                (segs.new(), lognormal_int(rng, a.tool_tokens, 1.0, 20,
                                           16 * a.tool_tokens))]
        heapq.heappush(ready, (clock + rng.expovariate(1.0 / a.step_ms), i,
                               s))
    return out


def gen_rag(a, rng):
    """RAG queries over a Zipf-popular document set; see the module doc."""
    segs = Segments()
    blocks = Blocks()
    system = [(segs.new(), lognormal_int(rng, a.system_tokens, 0.4, 256,
                                         8192)) for _ in range(a.systems)]
    pick_system = zipf_sampler(rng, a.systems, 1.0)
    docs = [(segs.new(), lognormal_int(rng, a.doc_tokens, 0.6, 100,
                                       8 * a.doc_tokens))
            for _ in range(a.docs)]
    pick_doc = zipf_sampler(rng, a.docs, a.zipf)
    out = []
    clock = 0.0
    for _ in range(a.requests):
        clock += rng.expovariate(a.rate / 1000.0)
        chosen = []
        while len(chosen) < a.k:
            d = pick_doc()
            if d not in chosen:
                chosen.append(d)
        prompt = [system[pick_system()]] + [docs[d] for d in chosen]
        prompt.append((segs.new(), lognormal_int(rng, 60, 0.6, 8, 600)))
        emit(out, blocks, clock, prompt, lognormal_int(rng, 200, 0.6, 5, 2000))
    return out


def gen_oneshot(a, rng):
    """Independent prompts with short templates; see the module docstring.

    A share a.retry of requests repeats a recent prompt (one of the last
    a.retry_window) verbatim.
    """
    segs = Segments()
    blocks = Blocks()
    templates = [(segs.new(), lognormal_int(rng, a.template_tokens, 0.6, 64,
                                            4096))
                 for _ in range(a.templates)]
    pick = zipf_sampler(rng, a.templates, 1.0)
    out = []
    recent = []
    clock = 0.0
    for _ in range(a.requests):
        clock += rng.expovariate(a.rate / 1000.0)
        if recent and rng.random() < a.retry:
            prompt = recent[rng.randrange(len(recent))]
        else:
            prompt = [templates[pick()],
                      (segs.new(), lognormal_int(rng, a.content_tokens, 1.0,
                                                 16, 64000))]
            recent.append(prompt)
            if len(recent) > a.retry_window:
                recent.pop(0)
        emit(out, blocks, clock, prompt, lognormal_int(rng, 250, 0.8, 1, 4000))
    return out


def gen_chat(a, rng):
    """Multi-turn conversations with long pauses; see the module docstring.

    New conversations arrive as a Poisson process (a.rate per second) with
    one of a few short system prompts; turns per conversation: geometric
    with mean a.turns (at most 6x that); the pause before the next turn is
    lognormal with median a.gap_s seconds.
    """
    segs = Segments()
    blocks = Blocks()
    system = [(segs.new(), lognormal_int(rng, 700, 0.3, 200, 2000))
              for _ in range(a.systems)]
    pick_system = zipf_sampler(rng, a.systems, 1.0)
    pending = []  # (time ms, serial, conversation)
    out = []
    clock = 0.0
    serial = 0
    next_new = rng.expovariate(a.rate / 1000.0)
    while len(out) < a.requests:
        if pending and pending[0][0] < next_new:
            clock, _, c = heapq.heappop(pending)
        else:
            clock = next_new
            next_new += rng.expovariate(a.rate / 1000.0)
            turns = min(6 * a.turns, 1 + int(rng.expovariate(1.0 / a.turns)))
            c = {"prompt": [system[pick_system()]], "left": turns}
        c["prompt"] = c["prompt"] + [
            (segs.new(), lognormal_int(rng, a.message_tokens, 1.0, 5, 30000))]
        reply = lognormal_int(rng, 400, 0.7, 5, 4000)
        emit(out, blocks, clock, c["prompt"], reply)
        c["left"] -= 1
        if c["left"] > 0:
            c["prompt"] = c["prompt"] + [(segs.new(), reply)]
            serial += 1
            gap = a.gap_s * 1000.0 * math.exp(rng.gauss(0, a.gap_sigma))
            heapq.heappush(pending, (clock + gap, serial, c))
    return out


SHAPES = {
    "agent": gen_agent,
    "rag": gen_rag,
    "oneshot": gen_oneshot,
    "chat": gen_chat,
}


def add_shape_args(sub):
    """Each shape's parameters, with their defaults."""
    p = {}
    p["agent"] = sub.add_parser("agent", help="agent loops")
    p["agent"].add_argument("--active", type=int, default=160,
                            help="sessions running at once")
    p["agent"].add_argument("--systems", type=int, default=6,
                            help="distinct system prompts")
    p["agent"].add_argument("--system_tokens", type=int, default=6000,
                            help="median system prompt length")
    p["agent"].add_argument("--steps", type=float, default=12,
                            help="mean steps per session")
    p["agent"].add_argument("--tool_tokens", type=int, default=500,
                            help="median tool result length")
    p["agent"].add_argument("--step_ms", type=float, default=4000,
                            help="mean pause between a session's steps")
    p["rag"] = sub.add_parser("rag", help="retrieval-augmented queries")
    p["rag"].add_argument("--systems", type=int, default=3)
    p["rag"].add_argument("--system_tokens", type=int, default=1200)
    p["rag"].add_argument("--docs", type=int, default=20000,
                          help="documents in the corpus")
    p["rag"].add_argument("--doc_tokens", type=int, default=900,
                          help="median document length")
    p["rag"].add_argument("--zipf", type=float, default=0.9,
                          help="document popularity exponent")
    p["rag"].add_argument("--k", type=int, default=4,
                          help="documents per prompt")
    p["rag"].add_argument("--rate", type=float, default=8.0,
                          help="requests per second")
    p["oneshot"] = sub.add_parser("oneshot", help="independent prompts")
    p["oneshot"].add_argument("--templates", type=int, default=40)
    p["oneshot"].add_argument("--template_tokens", type=int, default=700)
    p["oneshot"].add_argument("--content_tokens", type=int, default=2500,
                              help="median unique content length")
    p["oneshot"].add_argument("--retry", type=float, default=0.03,
                              help="share of verbatim retries")
    p["oneshot"].add_argument("--retry_window", type=int, default=200,
                              help="retries repeat one of this many latest")
    p["oneshot"].add_argument("--rate", type=float, default=10.0)
    p["chat"] = sub.add_parser("chat", help="multi-turn chat, long pauses")
    p["chat"].add_argument("--systems", type=int, default=4)
    p["chat"].add_argument("--turns", type=float, default=4,
                           help="mean turns per conversation")
    p["chat"].add_argument("--message_tokens", type=int, default=300,
                           help="median user message length")
    p["chat"].add_argument("--gap_s", type=float, default=240,
                           help="median pause between turns, seconds")
    p["chat"].add_argument("--gap_sigma", type=float, default=0.8)
    p["chat"].add_argument("--rate", type=float, default=2.0,
                           help="new conversations per second")
    for q in p.values():
        q.add_argument("--requests", type=int, default=25000)
        q.add_argument("--seed", type=int, default=1)
        q.add_argument("--out", default="-", help="file, or - for stdout")
    return p


def write(records, path):
    f = sys.stdout if path == "-" else open(path, "w")
    try:
        for r in records:
            f.write(json.dumps(r) + "\n")
    finally:
        if f is not sys.stdout:
            f.close()


def self_test():
    """Raises AssertionError when a shape breaks the format's contract."""
    parser = argparse.ArgumentParser()
    shape_parsers = add_shape_args(parser.add_subparsers(dest="shape"))
    for name, fn in SHAPES.items():
        a = shape_parsers[name].parse_args(["--requests", "400"])
        first = fn(a, random.Random(a.seed))
        assert first == fn(a, random.Random(a.seed)), (name, "not a "
                                                      "function of seed")
        other = fn(a, random.Random(a.seed + 1))
        assert first != other, (name, "seed ignored")
        assert len(first) == 400, name
        parent = {}
        last_time = 0
        for r in first:
            ids = r["hash_ids"]
            assert len(ids) == -(-r["input_length"] // BLOCK), (name, r)
            assert r["timestamp"] >= last_time, (name, "time goes back")
            last_time = r["timestamp"]
            prev = -1
            for b in ids:
                # Prefix chaining: an id always follows the same id.
                assert parent.setdefault(b, prev) == prev, (name, b)
                prev = b
    # Equal prefixes share ids, and only equal prefixes.
    blocks = Blocks()
    a = blocks.hash_ids([(1, 700), (2, 600)])
    b = blocks.hash_ids([(1, 700), (3, 600)])
    c = blocks.hash_ids([(1, 1024)])
    assert a[0] == b[0] == c[0] and a[1] != b[1] and a[1] != c[1], (a, b, c)
    assert len(a) == 3 and a[2] != b[2], (a, b)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="shape", required=True)
    shape_parsers = add_shape_args(sub)
    every = sub.add_parser("all", help="every shape with its defaults")
    every.add_argument("--out_dir", required=True)
    every.add_argument("--seed", type=int, default=1)
    sub.add_parser("self_test", help="check the generators and exit")
    args = parser.parse_args(argv)
    if args.shape == "self_test":
        self_test()
        print("self test: ok")
        return 0
    if args.shape == "all":
        os.makedirs(args.out_dir, exist_ok=True)
        for name, fn in SHAPES.items():
            a = shape_parsers[name].parse_args(["--seed", str(args.seed)])
            write(fn(a, random.Random(a.seed)),
                  os.path.join(args.out_dir, name + ".jsonl"))
        return 0
    write(SHAPES[args.shape](args, random.Random(args.seed)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
