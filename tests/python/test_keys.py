"""radixkv.keys: block-key contract v1 against the pinned vectors (those of
namespaces with a cross-layer KV layout too), the worked examples of
docs/CONTRACTS.md §1.3 and §1.2.1, and `radixkvctl hash` (with and without
--layout=xlayer:S:W) on the vectors and on random namespaces and prompts."""
import dataclasses
import json
import random
import subprocess

import numpy as np
import pytest

import radixkv
from radixkv import keys as K


def test_every_vector(vectors):
    assert vectors["vectors"], "no vectors"
    for v in vectors["vectors"]:
        spec = radixkv.NamespaceSpec(**v["namespace"])
        root = radixkv.namespace_root(spec)
        assert root.hex() == v["root"], v["name"]
        got = radixkv.compute_block_keys(root, spec.page_size, v["tokens"])
        assert [k.hex() for k in got] == v["block_keys"], v["name"]
        # The same keys from a NumPy array and incrementally.
        arr = np.asarray(v["tokens"], dtype=np.uint32)
        assert radixkv.compute_block_keys(root, spec.page_size, arr) == got
        h = radixkv.BlockHasher(root, spec.page_size)
        for i in range(0, len(v["tokens"]), 7):
            h.append(v["tokens"][i:i + 7])
        assert list(h.keys) == got, v["name"]
        assert h.pending_tokens == len(v["tokens"]) % spec.page_size


def test_cross_layer_vectors(vectors):
    cases = vectors["cross_layer_vectors"]
    assert len(cases) >= 5
    assert radixkv.CrossLayerKv is K.CrossLayerKv
    assert "CrossLayerKv" in radixkv.__all__
    for v in cases:
        spec = radixkv.NamespaceSpec(**v["namespace"])
        assert isinstance(spec.cross_layer, radixkv.CrossLayerKv), v["name"]
        # A CrossLayerKv and a dict of its fields give the same spec.
        x = v["namespace"]["cross_layer"]
        assert spec.cross_layer == radixkv.CrossLayerKv(
            x["shared_from_layer"], x["local_window"]), v["name"]
        root = radixkv.namespace_root(spec)
        assert root.hex() == v["root"], v["name"]
        got = radixkv.compute_block_keys(root, spec.page_size, v["tokens"])
        assert [k.hex() for k in got] == v["block_keys"], v["name"]
        plain = dataclasses.replace(spec, cross_layer=None)
        assert radixkv.namespace_root(plain).hex() == v["plain_root"], v["name"]
        assert v["plain_root"] != v["root"], v["name"]
    # No v1 vector carries a layout: they hash as before.
    assert all("cross_layer" not in v["namespace"] for v in vectors["vectors"])


def test_cross_layer_worked_example_and_page_bytes():
    spec = radixkv.NamespaceSpec(page_size=1, tp_size=0,
                                 cross_layer={"shared_from_layer": 0,
                                              "local_window": 0})
    ns = K.namespace_bytes(spec)
    assert len(ns) == 61 + 4 + 24 + 8
    assert ns[61:89] == bytes.fromhex("18000000") + b"radixkv.layout.xlayer.v1"
    assert radixkv.namespace_root(spec).hex() == "495ac5977876790973c77ad4613531c2"
    big = radixkv.NamespaceSpec(num_layers=40, num_kv_heads=8, head_dim=128,
                                page_size=16, dtype="bf16",
                                cross_layer=K.CrossLayerKv(21, 128))
    assert big.kv_groups == 22
    assert big.page_bytes == 22 * 2 * 8 * 16 * 128 * 2
    assert big.page_shape == (22, 2, 8, 16, 128)
    assert dataclasses.replace(big, cross_layer=None).page_bytes == \
        40 * 2 * 8 * 16 * 128 * 2
    assert big.to_dict()["cross_layer"] == {"shared_from_layer": 21,
                                            "local_window": 128}
    with pytest.raises(ValueError):
        K.CrossLayerKv(shared_from_layer=-1)
    with pytest.raises(TypeError):
        radixkv.NamespaceSpec(cross_layer=(21, 128))


def test_chain_with_extras(vectors):
    assert vectors["chain_with_extras"]
    for c in vectors["chain_with_extras"]:
        key = radixkv.chain_key(bytes.fromhex(c["parent"]), c["tokens"],
                                [tuple(e) for e in c["extras"]])
        assert key.hex() == c["key"], c["name"]


def test_worked_example():
    spec = radixkv.NamespaceSpec(page_size=1, tp_size=0)
    ns = K.namespace_bytes(spec)
    assert len(ns) == 61
    assert ns[:17] == bytes.fromhex("0d000000") + b"radixkv.ns.v1"
    root = radixkv.namespace_root(spec)
    assert root.hex() == "daf19994fffe4bb44f5388196db83209"
    assert radixkv.compute_block_keys(root, 1, [0])[0].hex() == \
        "2d9793c309bd00a90a97e7b2375672a9"
    # Block 0's input: root || u32(1) || token 0 || u32(0) extras.
    assert radixkv.chain_key(root, [0]).hex() == "2d9793c309bd00a90a97e7b2375672a9"


def test_normalized_and_fields():
    spec = radixkv.NamespaceSpec(model="m", num_layers=32, num_kv_heads=8,
                                 head_dim=128, page_size=16, dtype="bf16", tp_size=0)
    assert spec.dtype == 3 and spec.tp_size == 0
    assert spec.normalized().tp_size == 1
    assert spec.normalized() == radixkv.NamespaceSpec(
        model="m", num_layers=32, num_kv_heads=8, head_dim=128, page_size=16,
        dtype="DTYPE_BFLOAT16")
    assert radixkv.namespace_root(spec) != radixkv.namespace_root(spec.normalized())
    assert spec.page_bytes == 32 * 2 * 8 * 16 * 128 * 2
    assert spec.page_shape == (32, 2, 8, 16, 128)
    for name, value in [("fp32", 1), ("float16", 2), ("DTYPE_FLOAT8_E4M3", 4),
                        ("fp8_e5m2", 5), ("int8", 6), (6, 6)]:
        assert K.dtype_value(name) == value
    with pytest.raises(ValueError):
        radixkv.NamespaceSpec(dtype="fp64")
    with pytest.raises(ValueError):
        radixkv.NamespaceSpec(num_layers=2**32)
    with pytest.raises(TypeError):
        radixkv.NamespaceSpec(model=b"bytes")


def test_token_forms_agree():
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 2**32, size=1000, dtype=np.uint64)
    root = bytes(range(16))
    want = radixkv.compute_block_keys(root, 16, tokens.astype(np.uint32))
    assert len(want) == 62
    assert radixkv.compute_block_keys(root, 16, tokens) == want
    assert radixkv.compute_block_keys(root, 16, tokens.tolist()) == want
    assert radixkv.compute_block_keys(root, 16, tokens.astype(np.int64)) == want
    big_endian = tokens.astype(">u4")
    assert radixkv.compute_block_keys(root, 16, big_endian) == want
    strided = np.repeat(tokens.astype(np.uint32), 2)[::2]
    assert radixkv.compute_block_keys(root, 16, strided) == want
    h = radixkv.BlockHasher(root, 16)
    for t in tokens.tolist():
        h.append(t)
    assert list(h.keys) == want and h.last_key == want[-1]


def test_bad_tokens():
    root = bytes(16)
    for bad in ([-1], [2**32], [2**64], [1.5], ["a"], [True]):
        with pytest.raises((ValueError, TypeError)):
            radixkv.compute_block_keys(root, 1, bad)
    with pytest.raises(ValueError):
        radixkv.compute_block_keys(b"short", 1, [1])
    with pytest.raises(ValueError):
        radixkv.compute_block_keys(root, 0, [1])
    assert radixkv.compute_block_keys(root, 4, []) == []
    assert radixkv.compute_block_keys(root, 4, [1, 2, 3]) == []


def _random_case(rng):
    words = ["", "llama", "Llama-3.1-8B", "mistral/7b", "ünïcødé", "日本語", "a" * 40]
    spec = dict(
        model=rng.choice(words), model_revision=rng.choice(words),
        lora=rng.choice(words), cache_salt=rng.choice(words),
        num_layers=rng.choice([0, 1, 32, 2**32 - 1]),
        num_kv_heads=rng.choice([0, 1, 8]), head_dim=rng.choice([0, 64, 128]),
        page_size=rng.choice([1, 3, 16, 32]), dtype=rng.randint(0, 6),
        tp_rank=rng.choice([0, 1, 3]), tp_size=rng.choice([0, 1, 2, 4]))
    n = rng.choice([0, 1, 15, 16, 17, 100, 513])
    tokens = [rng.choice([rng.randrange(2**32), rng.randrange(50000), 2**32 - 1, 0])
              for _ in range(n)]
    return spec, tokens


def _ctl_hash(radixkvctl, spec, tokens, tokens_file, layout=None):
    """`radixkvctl hash -o json` for a dict of the eleven fields."""
    tokens_file.write_text(" ".join(map(str, tokens)))
    argv = [radixkvctl, "hash", "--model=" + spec["model"],
            "--model-revision=" + spec["model_revision"],
            "--lora=" + spec["lora"], "--salt=" + spec["cache_salt"],
            f"--layers={spec['num_layers']}", f"--kv-heads={spec['num_kv_heads']}",
            f"--head-dim={spec['head_dim']}", f"--page-size={spec['page_size']}",
            f"--dtype={spec['dtype']}", f"--tp-rank={spec['tp_rank']}",
            f"--tp-size={spec['tp_size']}", f"--file={tokens_file}", "-o", "json"]
    if layout is not None:
        argv.append("--layout=" + layout)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, (argv, p.stderr)
    return json.loads(p.stdout)


def test_cross_layer_keys_match_radixkvctl(radixkvctl, vectors, tmp_path):
    # The C++ keys (radixkvctl hash --layout) of the pinned vectors...
    for v in vectors["cross_layer_vectors"]:
        fields = {k: v["namespace"][k] for k in v["namespace"] if k != "cross_layer"}
        x = radixkv.CrossLayerKv(**v["namespace"]["cross_layer"])
        out = _ctl_hash(radixkvctl, fields, v["tokens"], tmp_path / "v.txt",
                        f"xlayer:{x.shared_from_layer}:{x.local_window}")
        assert out["namespace_id"] == v["root"], v["name"]
        assert out["block_keys"] == v["block_keys"], v["name"]
        spec = radixkv.NamespaceSpec(**fields, cross_layer=x)
        got = radixkv.compute_block_keys(radixkv.namespace_root(spec),
                                         spec.page_size, v["tokens"])
        assert [k.hex() for k in got] == out["block_keys"], v["name"]
    # ...and of random namespaces and layouts, against the Python keys.
    rng = random.Random(20250117)
    for case in range(16):
        fields, tokens = _random_case(rng)
        x = radixkv.CrossLayerKv(rng.choice([0, 1, 21, 2**32 - 1]),
                                 rng.choice([0, 4, 128, 65536, 2**32 - 1]))
        out = _ctl_hash(radixkvctl, fields, tokens, tmp_path / f"r{case}.txt",
                        f"xlayer:{x.shared_from_layer}:{x.local_window}")
        spec = radixkv.NamespaceSpec(**fields, cross_layer=x)
        root = radixkv.namespace_root(spec)
        assert out["namespace_id"] == root.hex(), (fields, x)
        plain = radixkv.namespace_root(dataclasses.replace(spec, cross_layer=None))
        assert root != plain
        got = radixkv.compute_block_keys(root, spec.page_size,
                                         np.asarray(tokens, np.uint64))
        assert out["block_keys"] == [k.hex() for k in got], (fields, x)


def test_against_radixkvctl_hash(radixkvctl, tmp_path):
    rng = random.Random(20240611)
    for case in range(24):
        spec, tokens = _random_case(rng)
        tokens_file = tmp_path / f"tokens{case}.txt"
        tokens_file.write_text(" ".join(map(str, tokens)))
        argv = [radixkvctl, "hash", "--model=" + spec["model"],
                "--model-revision=" + spec["model_revision"],
                "--lora=" + spec["lora"], "--salt=" + spec["cache_salt"],
                f"--layers={spec['num_layers']}", f"--kv-heads={spec['num_kv_heads']}",
                f"--head-dim={spec['head_dim']}", f"--page-size={spec['page_size']}",
                f"--dtype={spec['dtype']}", f"--tp-rank={spec['tp_rank']}",
                f"--tp-size={spec['tp_size']}", f"--file={tokens_file}", "-o", "json"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, (argv, p.stderr)
        out = json.loads(p.stdout)
        ns = radixkv.NamespaceSpec(**spec)
        root = radixkv.namespace_root(ns)
        assert out["namespace_id"] == root.hex(), (spec, out)
        got = radixkv.compute_block_keys(root, ns.page_size, np.asarray(tokens, np.uint64))
        assert out["block_keys"] == [k.hex() for k in got], spec
        assert out["tokens"] == len(tokens)
