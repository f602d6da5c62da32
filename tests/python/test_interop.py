"""radixkv-worker (C++) and examples/torch_worker.py (PyTorch) share one daemon.

Both run the reference model (the torch side loads the weights that
`radixkv-worker export-weights` writes) in the same namespace, so each hits
the blocks the other committed:

  1. radixkv-worker prefills and commits; the torch worker acquires the same
     prompt, reads those pages, and its next-token logits equal a full
     prefill's (torch, no cache) within 1e-4;
  2. the torch worker commits; radixkv-worker hits them and generates the
     same tokens as without the cache;
  3. torch_worker.py processes and radixkv-worker runs are SIGKILLed at
     random moments: the daemon ends up with no lease and no page being
     written, and what it cached still gives the uncached tokens.

Environment (set by ctest): PYTHONPATH=<build>/python, RADIXKVD and
RADIXKV_WORKER (the binaries). RADIXKV_TEST_SEED fixes the kill schedule of
test 3 (printed on failure). Skipped without PyTorch (python3-torch).
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from rkv_testutil import assert_no_leaks, executable

torch = pytest.importorskip("torch")  # and NumPy: the examples need both

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
sys.path.insert(0, EXAMPLES)

import torch_worker  # noqa: E402
from reference_model import ReferenceModel  # noqa: E402

MODEL = "tiny"
PAGE = 16  # the tiny model's page size
TOL = 1e-4
TIMEOUT = 120  # seconds per subprocess; generous for a loaded 2-core machine


@pytest.fixture(scope="module")
def worker_bin():
    return executable("RADIXKV_WORKER")


@pytest.fixture(scope="module")
def weights(worker_bin, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("weights") / f"{MODEL}.safetensors")
    p = subprocess.run([worker_bin, "export-weights", "--model", MODEL, "--out", path],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    return path


@pytest.fixture(scope="module")
def model(weights):
    m = ReferenceModel.load(weights)
    assert m.check_probe() < TOL  # the torch forward pass is the C++ one
    assert m.page_size == PAGE
    return m


def text_prompt(seed, n):
    """n printable bytes (a --text line), deterministic per seed."""
    rng = random.Random(seed)
    return [rng.randrange(32, 127) for _ in range(n)]


def write_prompts(path, prompts):
    with open(path, "wb") as f:
        for p in prompts:
            f.write(bytes(p) + b"\n")


def run_cpp(worker_bin, prompt_file, *flags, decode=4):
    """radixkv-worker run --json; returns one dict per prompt."""
    p = subprocess.run([worker_bin, "run", "--text", str(prompt_file), "--model", MODEL,
                        "--device", "cpu", "--decode", str(decode), "--json", *flags],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


def max_diff(a, b):
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())


def test_torch_reads_pages_committed_by_radixkv_worker(daemon_factory, worker_bin,
                                                        model, tmp_path):
    d = daemon_factory()
    # 7 full blocks + 5 tokens, and a prompt of exactly 4 blocks (fully
    # cached next time: its last token is recomputed over a partial page).
    prompts = [text_prompt(1, 7 * PAGE + 5), text_prompt(2, 4 * PAGE)]
    f = tmp_path / "prompts.txt"
    write_prompts(f, prompts)
    cpp = run_cpp(worker_bin, f, "--endpoint", d.sock)
    assert [(r["cache"], r["matched_tokens"], r["committed_blocks"]) for r in cpp] == \
        [("daemon", 0, 7), ("daemon", 0, 4)], cpp

    client = torch_worker.open_client(model, d.sock, 5.0, client_name="interop-test")
    try:
        assert client.connected
        worker = torch_worker.TorchWorker(model, client)
        for prompt, c in zip(prompts, cpp):
            r = worker.run(prompt, decode=4)
            want_matched = min(len(prompt) // PAGE * PAGE, len(prompt) - 1)
            assert (r["cache"], r["matched_tokens"], r["committed_blocks"]) == \
                ("daemon", want_matched, 0), r
            full = model.prefill(prompt)  # torch, no cache
            assert max_diff(r["first_logits"], full) <= TOL
            assert r["generated"] == c["generated"]

        # The pages hold the C++ K/V in the documented layout: each equals
        # the torch full prefill's K/V of its block (post-RoPE K).
        prompt = prompts[0]
        ctx = model.new_context(len(prompt))
        model.forward(ctx, prompt)
        with client.acquire(prompt, allocate=False) as lease:
            assert lease.matched_blocks == 7
            for b in range(lease.matched_blocks):
                page = lease.page_tensor(b)  # (layers, 2, kv_heads, slot, dim)
                assert tuple(page.shape) == (model.num_layers, 2, model.num_kv_heads,
                                             PAGE, model.head_dim)
                assert max_diff(page[:, 0], ctx.k[:, :, b * PAGE:(b + 1) * PAGE]) <= 1e-5
                assert max_diff(page[:, 1], ctx.v[:, :, b * PAGE:(b + 1) * PAGE]) <= 1e-5
    finally:
        client.close()
    assert_no_leaks(d, sessions=0)


def test_radixkv_worker_hits_blocks_committed_by_torch(daemon_factory, worker_bin,
                                                       model, tmp_path):
    d = daemon_factory()
    prompts = [text_prompt(3, 9 * PAGE + 11), text_prompt(4, 2 * PAGE + 1)]
    client = torch_worker.open_client(model, d.sock, 5.0, client_name="interop-test")
    try:
        worker = torch_worker.TorchWorker(model, client)
        torch_runs = [worker.run(p, decode=6) for p in prompts]
    finally:
        client.close()
    assert [(r["cache"], r["matched_tokens"], r["committed_blocks"]) for r in torch_runs] \
        == [("daemon", 0, 9), ("daemon", 0, 2)], torch_runs
    assert d.wait_stats(lambda s: s.cached_pages == 11).cached_pages == 11

    f = tmp_path / "prompts.txt"
    write_prompts(f, prompts)
    hit = run_cpp(worker_bin, f, "--endpoint", d.sock, decode=6)
    uncached = run_cpp(worker_bin, f, "--no-cache", decode=6)
    assert [(r["cache"], r["matched_tokens"], r["committed_blocks"]) for r in hit] == \
        [("daemon", 9 * PAGE, 0), ("daemon", 2 * PAGE, 0)], hit
    for h, u, t in zip(hit, uncached, torch_runs):
        assert h["generated"] == u["generated"] == t["generated"]
    assert_no_leaks(d, sessions=0)


def chaos_prompts(n):
    """Prompts sharing prefixes (so the processes hit each other's blocks)."""
    header = text_prompt(10, 3 * PAGE)
    out = []
    for i in range(n):
        body = text_prompt(100 + i % 7, PAGE * (2 + i % 5)) + text_prompt(1000 + i, 5 + i % 13)
        out.append(header + body)
    return out


def test_sigkilled_workers_leak_nothing(daemon_factory, worker_bin, weights, tmp_path):
    seed = int(os.environ.get("RADIXKV_TEST_SEED", time.time_ns() % (1 << 32)))
    rng = random.Random(seed)
    d = daemon_factory()
    prompts = chaos_prompts(40)
    f = tmp_path / "chaos.txt"
    write_prompts(f, prompts)
    env = dict(os.environ, RADIXKV_THREADS="1", OMP_NUM_THREADS="1")
    torch_cmd = [sys.executable, os.path.join(EXAMPLES, "torch_worker.py"),
                 "--weights", weights, "--text", str(f), "--decode", "48",
                 "--endpoint", d.sock, "--timeout", "5"]
    cpp_cmd = [worker_bin, "run", "--text", str(f), "--model", MODEL, "--device", "cpu",
               "--decode", "400", "--commit-generated", "--json", "--endpoint", d.sock]
    killed = served = held = 0
    for _ in range(2):
        procs = [subprocess.Popen(torch_cmd, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=env) for _ in range(3)]
        procs += [subprocess.Popen(cpp_cmd, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, env=env) for _ in range(2)]
        # Kill each once it serves (its first output line), a random moment
        # later: mid-acquire, mid-write, holding a lease while decoding.
        for p in procs:
            if p.stdout.readline():
                served += 1
            time.sleep(rng.uniform(0.0, 0.4))
            if p.poll() is None:
                held = max(held, d.stats().leases)
                p.send_signal(signal.SIGKILL)
                killed += 1
        for p in procs:
            p.wait(timeout=TIMEOUT)
            p.stdout.close()
    note = f"(seed {seed}: RADIXKV_TEST_SEED={seed} repeats this schedule)"
    assert served > 0 and killed > 0 and held > 0, \
        f"served {served}, killed {killed}, most leases at a kill {held} {note}"
    s = assert_no_leaks(d, sessions=0)
    assert s.cached_pages > 0, note
    print(f"interop chaos: {killed} of {served} serving processes killed, up to "
          f"{held} leases held at a kill, {s.cached_pages} pages cached {note}")

    # What the killed writers left cached is sound: hits give the uncached
    # tokens.
    hit = run_cpp(worker_bin, f, "--endpoint", d.sock, decode=4)
    uncached = run_cpp(worker_bin, f, "--no-cache", decode=4)
    assert sum(r["matched_tokens"] for r in hit) > 0, note
    assert [r["generated"] for r in hit] == [r["generated"] for r in uncached], note
    assert_no_leaks(d, sessions=0)
