"""radixkv.integrations.transformers against transformers' own
LlamaForCausalLM (random weights, GQA, RoPE) and radixkvd child processes
with a host pool.

What is checked:
  * two separate processes share one daemon: the second loads the first's
    blocks, its next-token logits equal a full prefill within 1e-4 (fp32),
    and its greedy generations equal model.generate's without radixkv;
  * the last-token rule (at most n - 1 tokens, whole blocks) and what is
    saved (the suffix's full blocks);
  * a page_size / dtype different from the cached one is a miss, a client
    of another namespace a typed error naming the field, a pool of other
    page_bytes the daemon's typed refusal; never wrong K/V;
  * a daemon that is down (never started, or killed) gives a full prefill
    with identical output and no error;
  * afterwards the daemon holds 0 leases and 0 writing pages.

Run: PYTHONPATH=build/default/python RADIXKVD=build/default/daemon/radixkvd
  .venv/bin/python -m pytest -q tests/integrations/test_transformers.py
"""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("transformers", reason="transformers is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _hf_util  # noqa: E402
from _hf_util import full_prefill_logits, greedy  # noqa: E402

radixkv = pytest.importorskip(
    "radixkv", reason="the radixkv package is not importable (PYTHONPATH=<build>/python)")
try:
    from radixkv.integrations.transformers import (  # noqa: E402
        PrefixCache, namespace_from_model)
except ImportError as e:  # pragma: no cover - reported as a skip
    pytest.skip(f"radixkv.integrations.transformers cannot be imported: {e}",
                allow_module_level=True)
from rkv_testutil import Daemon, assert_no_leaks  # noqa: E402

TOL = 1e-4
NEW_TOKENS = 8
P = 16


@pytest.fixture(scope="module")
def radixkvd_path():
    path = os.environ.get("RADIXKVD", "")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("$RADIXKVD does not name an executable radixkvd "
                    "(set RADIXKVD=build/default/daemon/radixkvd or run through ctest)")
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _hf_util.build_model(str(tmp_path_factory.mktemp("llama") / "tiny-llama"))


@pytest.fixture(scope="module")
def model(model_dir):
    torch.set_num_threads(1)
    return _hf_util.load_model(model_dir)


@pytest.fixture
def daemon_factory(radixkvd_path):
    started = []

    def make(pool="host,bytes=16MiB", *flags):
        d = Daemon(radixkvd_path, list(flags), pool)
        started.append(d)
        return d.start()

    yield make
    for d in started:
        d.cleanup()


def prompt(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, _hf_util.TINY["vocab_size"], (n,), generator=g)


def run_worker(tmp_path, name, model_dir, endpoint, prompts, page_size=P,
               device="cpu"):
    """_hf_util.py's worker in a separate python process; its records."""
    src, out = tmp_path / f"{name}.in.pt", tmp_path / f"{name}.out.pt"
    torch.save(prompts, src)
    cmd = [sys.executable, os.path.join(HERE, "_hf_util.py"), "--model", model_dir,
           "--endpoint", endpoint, "--prompts", str(src), "--out", str(out),
           "--new_tokens", str(NEW_TOKENS), "--page_size", str(page_size),
           "--device", device]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(out)


def assert_same_as_full_prefill(rec):
    diff = (rec["logits"] - rec["ref_logits"]).abs().max().item()
    assert diff <= TOL, f"logits differ from a full prefill by {diff}"
    assert torch.equal(rec["gen"], rec["ref_gen"]), (rec["gen"], rec["ref_gen"])


def test_second_process_hits_and_matches_full_prefill(tmp_path, model_dir, daemon_factory):
    d = daemon_factory()
    a = prompt(1, 100)                      # 6 full blocks + 4 tokens
    b = torch.cat([a[:90], prompt(2, 50)])  # shares blocks 0..4 (80 tokens) with a

    first = run_worker(tmp_path, "first", model_dir, d.sock, [a])
    assert (first[0]["cached"], first[0]["saved"]) == (0, 6)
    assert_same_as_full_prefill(first[0])
    # generate() after prefill() in the same process: a hit too.
    assert first[0]["gen_cached"] == 96

    second = run_worker(tmp_path, "second", model_dir, d.sock, [a, a[:96], b])
    hit_a, hit_96, hit_b = second
    # a: all 6 blocks (96 <= 99 tokens) from the first process; nothing new.
    assert (hit_a["cached"], hit_a["saved"]) == (96, 0)
    # 96 tokens: at most 95 usable, rounded down to 5 blocks.
    assert (hit_96["cached"], hit_96["saved"]) == (80, 0)
    # b: 5 shared blocks; its blocks 5..7 (up to token 128 of 140) are new.
    assert (hit_b["cached"], hit_b["saved"]) == (80, 3)
    for rec in second:
        assert_same_as_full_prefill(rec)
    # Across processes: the hit's logits equal the first process's full prefill.
    diff = (hit_a["logits"] - first[0]["ref_logits"]).abs().max().item()
    assert diff <= TOL, diff
    assert torch.equal(hit_a["gen"], first[0]["gen"])
    assert hit_b["gen_cached"] == 128

    s = assert_no_leaks(d)
    assert s.inserted_blocks == 6 + 3, s
    assert s.hit_tokens >= 96 + 80 + 80, s


def test_hit_in_process_equals_full_prefill_with_generate_kwargs(model, model_dir,
                                                                 daemon_factory):
    d = daemon_factory()
    a = prompt(3, 67)
    with PrefixCache(model, endpoint=d.sock) as pc:
        miss = pc.prefill(a)
        assert (miss.cached_tokens, miss.saved_blocks) == (0, 4)
        # model.generate with the prepared cache, by hand.
        with pc.prepare(a) as hit:
            assert hit.cached_tokens == 64 and hit.suffix_ids.shape[1] == 3
            out = model.generate(hit.input_ids, past_key_values=hit.cache,
                                 max_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=0)
        assert torch.equal(out[0, 67:], greedy(model, a, NEW_TOKENS))
        # The cache holds exactly the cached K/V: equal to a full prefill's.
        with pc.prepare(a) as hit:
            with torch.inference_mode():
                ref = model(input_ids=a.view(1, -1), use_cache=True).past_key_values
            for layer, ref_layer in zip(hit.cache.layers, ref.layers):
                assert layer.keys.shape == (1, 2, 64, 16)
                assert (layer.keys - ref_layer.keys[:, :, :64]).abs().max() <= TOL
                assert (layer.values - ref_layer.values[:, :, :64]).abs().max() <= TOL

        # generate() saves right after the prompt's forward pass: a logits
        # processor of the caller's (run before the one that saves) sees the
        # lease at the first step and none from the second on.
        from transformers import LogitsProcessor

        leases = []

        class Probe(LogitsProcessor):
            def __call__(self, input_ids, scores):
                leases.append(d.stats().leases)
                return scores

        b = torch.cat([a[:40], prompt(7, 40)])     # 2 cached blocks, 3 new
        out = pc.generate(b, max_new_tokens=4, do_sample=False, pad_token_id=0,
                          logits_processor=[Probe()])
        assert leases == [1, 0, 0, 0], leases
        assert (pc.last.cached_tokens, pc.last.saved_blocks) == (32, 3)
        assert torch.equal(out[0, 80:], greedy(model, b, 4))
    assert_no_leaks(d, sessions=0)


def test_other_page_size_or_dtype_is_refused_or_a_miss(tmp_path, model_dir,
                                                      daemon_factory):
    d = daemon_factory()
    a = prompt(4, 100)
    first = run_worker(tmp_path, "fp32", model_dir, d.sock, [a])
    assert first[0]["saved"] == 6

    # The daemon's pool and token storage were sized by the first namespace
    # (fp32, page_size 16): another page_size, or other page_bytes, is
    # refused when the client opens its session: a typed error naming it.
    fp32 = _hf_util.load_model(model_dir)
    bf16 = _hf_util.load_model(model_dir, dtype=torch.bfloat16)
    for m, page_size in ((fp32, 8), (bf16, 16), (bf16, 32)):
        with pytest.raises(radixkv.FailedPrecondition) as err:
            PrefixCache(m, endpoint=d.sock, page_size=page_size)
        assert err.value.field == "namespace", err.value

    # A client of another namespace handed to a PrefixCache: refused before
    # any page is read, naming the field that differs.
    for kwargs, field in (({"page_size": 32}, "namespace.page_size"),
                          ({"revision": "other-weights"}, "namespace.model_revision")):
        other = namespace_from_model(fp32, **kwargs)
        with radixkv.Client(endpoint=d.sock, namespace=other, attach_pool=True,
                            initial_wait=0) as client:
            with pytest.raises(radixkv.InvalidArgument) as err:
                PrefixCache(fp32, client)
            assert err.value.field == field, err.value
    # Other weights (another revision) share nothing with the cached blocks.
    with PrefixCache(fp32, endpoint=d.sock, revision="other-weights") as pc:
        res = pc.prefill(a)
        assert (res.cached_tokens, res.saved_blocks) == (0, 6)
    # The first namespace still hits and is still right.
    with PrefixCache(fp32, endpoint=d.sock) as pc:
        res = pc.prefill(a)
        assert res.cached_tokens == 96
        assert (res.logits[0] - full_prefill_logits(fp32, a)).abs().max().item() <= TOL
    assert_no_leaks(d, sessions=0)

    # bf16 and fp16 pages have the same size: one daemon serves both, and
    # blocks cached in bf16 are a miss for the fp16 model (another namespace).
    d2 = daemon_factory()
    with PrefixCache(bf16, endpoint=d2.sock) as pc:
        assert pc.spec.dtype == radixkv.keys.dtype_value("bf16")
        assert pc.prefill(a).saved_blocks == 6
        assert pc.prefill(a).cached_tokens == 96
    fp16 = _hf_util.load_model(model_dir, dtype=torch.float16)
    with PrefixCache(fp16, endpoint=d2.sock) as pc:
        assert pc.spec.dtype == radixkv.keys.dtype_value("fp16")
        ref = full_prefill_logits(fp16, a)
        res = pc.prefill(a)
        assert (res.cached_tokens, res.saved_blocks) == (0, 6)
        assert (res.logits[0].float() - ref).abs().max().item() <= 1e-2  # fp16
        again = pc.prefill(a)
        assert again.cached_tokens == 96
        assert (again.logits[0].float() - ref).abs().max().item() <= 1e-2
    assert_no_leaks(d2, sessions=0)


def test_daemon_down_is_a_full_prefill(tmp_path, model, model_dir, daemon_factory):
    a = prompt(5, 70)
    ref_logits = full_prefill_logits(model, a)
    ref_gen = greedy(model, a, NEW_TOKENS)

    # Never started: the constructor returns, every prompt is a miss.
    missing = str(tmp_path / "nobody.sock")
    with PrefixCache(model, endpoint=missing, initial_wait=0.2) as pc:
        res = pc.prefill(a)
        assert (res.cached_tokens, res.saved_blocks) == (0, 0)
        assert (res.logits[0] - ref_logits).abs().max().item() <= TOL
        assert torch.equal(pc.generate(a, max_new_tokens=NEW_TOKENS, do_sample=False,
                                       pad_token_id=0)[0, 70:], ref_gen)

    # Killed after it cached the prompt: still a correct full prefill.
    d = daemon_factory()
    with PrefixCache(model, endpoint=d.sock, call_timeout=1.0) as pc:
        assert pc.prefill(a).saved_blocks == 4
        assert pc.prefill(a).cached_tokens == 64
        d.stop()
        res = pc.prefill(a)
        assert (res.cached_tokens, res.saved_blocks) == (0, 0)
        assert (res.logits[0] - ref_logits).abs().max().item() <= TOL
        gen = pc.generate(a, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        assert torch.equal(gen[0, 70:], ref_gen)
        assert pc.last.cached_tokens == 0


def test_bad_input_names_the_field(model, daemon_factory):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig
    d = daemon_factory()
    with PrefixCache(model, endpoint=d.sock) as pc:
        cases = [
            (torch.zeros(2, 20, dtype=torch.long), "input_ids"),     # two prompts
            (torch.zeros(1, 0, dtype=torch.long), "input_ids"),      # empty
            (torch.zeros(1, 20), "input_ids"),                       # float ids
            (torch.full((1, 20), -1), "input_ids"),                  # negative ids
        ]
        for ids, field in cases:
            with pytest.raises(radixkv.InvalidArgument) as err:
                pc.prefill(ids)
            assert err.value.field == field, (ids.shape, err.value)
        for kwargs, field in (({"num_beams": 2}, "num_beams"),
                              ({"num_return_sequences": 2}, "num_return_sequences")):
            with pytest.raises(radixkv.InvalidArgument) as err:
                pc.generate(prompt(6, 20), max_new_tokens=2, **kwargs)
            assert err.value.field == field, err.value

    with pytest.raises(radixkv.InvalidArgument) as err:
        namespace_from_model(model, page_size=0)
    assert err.value.field == "page_size"
    # Built in memory: no name, no revision.
    torch.manual_seed(0)
    unnamed = LlamaForCausalLM(LlamaConfig(**_hf_util.TINY)).eval()
    with pytest.raises(radixkv.InvalidArgument) as err:
        namespace_from_model(unnamed)
    assert err.value.field == "model_id"
    with pytest.raises(radixkv.InvalidArgument) as err:
        namespace_from_model(unnamed, model_id="not/a/local/dir")
    assert err.value.field == "revision"
    spec = namespace_from_model(unnamed, model_id="tiny", revision="seed0")
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.page_size) == (4, 2, 16, 16)
    # Sliding-window layers keep only a window: no whole-prompt pages.
    mistral = MistralConfig(**{k: v for k, v in _hf_util.TINY.items() if k != "rope_theta"},
                            sliding_window=32)
    with pytest.raises(radixkv.InvalidArgument) as err:
        namespace_from_model(mistral, model_id="m", revision="r", dtype=torch.float32)
    assert err.value.field == "config.layer_types"
    assert_no_leaks(d, sessions=0)
