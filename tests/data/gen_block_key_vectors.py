#!/usr/bin/python3
"""Generates tests/data/block_key_vectors.json: test vectors for the radixkv
block-key contract v1 (docs/CONTRACTS.md section 1).

This is an independent implementation of the contract in Python, written
from the specification only; tests/radix/block_key_test.cc checks the C++
implementation against its output.

  H(b)     = XXH3-128(b, seed 0), canonical 16 bytes (big-endian hi, lo)
  u32(x)   = 4 bytes little-endian;  str(s) = u32(len(utf8(s))) || utf8(s)
  root     = H(str("radixkv.ns.v1") || str(model) || str(model_revision)
               || str(lora) || str(cache_salt) || u32(num_layers)
               || u32(num_kv_heads) || u32(head_dim) || u32(page_size)
               || u32(dtype) || u32(tp_rank) || u32(tp_size)
               || layout)
  layout   = empty for a namespace without a cross-layer layout (every v1
             vector), else str("radixkv.layout.xlayer.v1")
             || u32(shared_from_layer) || u32(local_window)
  key[i]   = H(parent || u32(n) || u32(t) * n || extras_i),
             parent = root for i = 0, key[i-1] after; extras_i = u32(0) for v1
             workers, or u32(count) || (str(tag) || str(value)) * count.

Run with Debian's interpreter (it has python3-xxhash):
  /usr/bin/python3 tests/data/gen_block_key_vectors.py > tests/data/block_key_vectors.json
"""

import json
import struct
import sys

import xxhash


def u32(x):
    return struct.pack("<I", x)


def s(text):
    raw = text.encode("utf-8")
    return u32(len(raw)) + raw


def h(data):
    return xxhash.xxh3_128_digest(data, seed=0)


def root_of(ns):
    b = s("radixkv.ns.v1") + s(ns["model"]) + s(ns["model_revision"])
    b += s(ns["lora"]) + s(ns["cache_salt"])
    for field in ("num_layers", "num_kv_heads", "head_dim", "page_size",
                  "dtype", "tp_rank", "tp_size"):
        b += u32(ns[field])
    layout = ns.get("cross_layer")
    if layout is not None:
        b += s("radixkv.layout.xlayer.v1") + u32(layout["shared_from_layer"])
        b += u32(layout["local_window"])
    return h(b)


def chain(parent, block, extras=()):
    b = parent + u32(len(block)) + b"".join(u32(t) for t in block)
    b += u32(len(extras))
    for tag, value in extras:
        b += s(tag) + s(value)
    return h(b)


def block_keys(root, page_size, tokens):
    keys, parent = [], root
    for i in range(len(tokens) // page_size):
        parent = chain(parent, tokens[i * page_size:(i + 1) * page_size])
        keys.append(parent)
    return keys


def lcg_tokens(seed, count, modulus=1 << 32):
    """Deterministic pseudo-random tokens (64-bit LCG, high bits)."""
    out, x = [], seed
    for _ in range(count):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((x >> 32) % modulus)
    return out


def namespace(**overrides):
    ns = {"model": "llama-3-8b", "model_revision": "main", "lora": "",
          "cache_salt": "", "num_layers": 32, "num_kv_heads": 8,
          "head_dim": 128, "page_size": 16, "dtype": 3, "tp_rank": 0,
          "tp_size": 1}
    ns.update(overrides)
    return ns


EMPTY = dict(model="", model_revision="", lora="", cache_salt="",
             num_layers=0, num_kv_heads=0, head_dim=0, dtype=0, tp_size=0)

CASES = [
    ("empty_strings_no_tokens", namespace(**EMPTY), []),
    ("empty_strings_page1_one_token", namespace(**EMPTY, page_size=1), [0]),
    ("empty_strings_two_blocks", namespace(**EMPTY), list(range(32))),
    ("llama_one_block", namespace(), list(range(1, 17))),
    ("llama_three_blocks_tail", namespace(), lcg_tokens(1, 53, 128256)),
    ("partial_tail_only", namespace(), list(range(10))),
    ("cache_salt", namespace(cache_salt="tenant-42"), list(range(1, 33))),
    ("lora", namespace(lora="sql-adapter-v2"), list(range(1, 33))),
    ("salt_and_lora", namespace(lora="sql-adapter-v2", cache_salt="tenant-42"),
     list(range(1, 33))),
    ("revision", namespace(model_revision="0123abcd"), list(range(1, 33))),
    ("tp_rank_1_of_2", namespace(tp_rank=1, tp_size=2), list(range(1, 33))),
    ("dtype_f32", namespace(dtype=1), list(range(1, 17))),
    ("dtype_f16", namespace(dtype=2), list(range(1, 17))),
    ("dtype_fp8_e4m3", namespace(dtype=4), list(range(1, 17))),
    ("dtype_int8", namespace(dtype=6), list(range(1, 17))),
    ("utf8_model_name", namespace(model="модель-ü-模型"), list(range(1, 17))),
    ("tokens_high_bit", namespace(),
     [0x80000000, 0xffffffff, 0x7fffffff, 0xfffffffe] * 4 + [0xdeadbeef] * 16),
    ("tokens_all_zero", namespace(), [0] * 48),
    ("tokens_random_u32", namespace(), lcg_tokens(7, 80)),
    ("page1_five_tokens", namespace(page_size=1), [5, 4, 3, 2, 0xffffffff]),
    ("page1_large_vocab", namespace(page_size=1), lcg_tokens(3, 12)),
    ("page512_two_blocks", namespace(page_size=512), lcg_tokens(11, 1024, 152064)),
    ("page512_one_block_tail", namespace(page_size=512, lora="x", cache_salt="y"),
     lcg_tokens(12, 512 + 100)),
    ("page16_eight_blocks", namespace(num_layers=80, head_dim=64),
     lcg_tokens(13, 128, 32000)),
    ("page32_mixed", namespace(page_size=32, num_kv_heads=1), lcg_tokens(14, 70)),
]


def xlayer(shared_from_layer, local_window):
    return {"shared_from_layer": shared_from_layer, "local_window": local_window}


# Namespaces with a cross-layer KV layout. They are kept apart from CASES
# (the eleven-field namespaces every v1 tool reproduces) in
# "cross_layer_vectors"; each has the same fields as a CASES entry plus
# "cross_layer", and "plain_root", the root of the same namespace without
# the layout, which must differ from "root".
CROSS_LAYER_CASES = [
    ("xlayer_empty_strings_page1", dict(namespace(**EMPTY, page_size=1),
                                        cross_layer=xlayer(0, 0)), [0]),
    ("xlayer_40_layers_from_21_window_128",
     namespace(num_layers=40, cross_layer=xlayer(21, 128)), list(range(1, 33))),
    ("xlayer_40_layers_from_21_no_window",
     namespace(num_layers=40, cross_layer=xlayer(21, 0)), list(range(1, 33))),
    ("xlayer_from_1_page1", namespace(page_size=1, cross_layer=xlayer(1, 4)),
     [5, 4, 3, 2, 0xffffffff]),
    ("xlayer_high_values_fp8",
     namespace(dtype=4, cross_layer=xlayer(0xffffffff, 0x80000000)),
     lcg_tokens(21, 40)),
    ("xlayer_salt_lora_tail",
     namespace(lora="sql-adapter-v2", cache_salt="tenant-42",
               cross_layer=xlayer(31, 64)), lcg_tokens(22, 53, 128256)),
]

# ChainBlockKey with extras (multimodal tags): parent, tokens, extras -> key.
EXTRAS_CASES = [
    ("no_extras", list(range(16)), []),
    ("one_extra", list(range(16)), [("mm", "image:sha256:00ff")]),
    ("two_extras", [0xffffffff] * 4, [("mm", "a"), ("", "")]),
    ("utf8_extra", [1, 2, 3, 4], [("ключ", "值")]),
]


def main():
    vectors = []
    for name, ns, tokens in CASES:
        root = root_of(ns)
        keys = block_keys(root, ns["page_size"], tokens)
        vectors.append({"name": name, "namespace": ns, "tokens": tokens,
                        "root": root.hex(), "block_keys": [k.hex() for k in keys]})
    cross_layer = []
    for name, ns, tokens in CROSS_LAYER_CASES:
        root = root_of(ns)
        plain = {k: v for k, v in ns.items() if k != "cross_layer"}
        keys = block_keys(root, ns["page_size"], tokens)
        cross_layer.append({"name": name, "namespace": ns, "tokens": tokens,
                            "root": root.hex(), "plain_root": root_of(plain).hex(),
                            "block_keys": [k.hex() for k in keys]})
    parent = root_of(namespace())
    extras = []
    for name, tokens, ex in EXTRAS_CASES:
        extras.append({"name": name, "parent": parent.hex(), "tokens": tokens,
                       "extras": [list(e) for e in ex],
                       "key": chain(parent, tokens, ex).hex()})
    doc = {"contract": "radixkv block keys v1", "generator":
           "tests/data/gen_block_key_vectors.py", "vectors": vectors,
           "chain_with_extras": extras, "cross_layer_vectors": cross_layer}
    json.dump(doc, sys.stdout, ensure_ascii=False, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
