"""radixkv-worker's reference model in PyTorch, loaded from its exported weights.

    radixkv-worker export-weights --model small --out small.safetensors

    model = ReferenceModel.load("small.safetensors")
    ctx = model.new_context(capacity=len(prompt) + 16)
    logits = model.forward(ctx, prompt)          # full prefill: positions 0 ..
    logits = model.forward(ctx, [next_token])    # one decode step

The architecture is worker/model.h's, step for step: pre-norm
decoder layers (RMSNorm; fused QKV projection; GQA; RoPE rotating the pairs
(i, i + head_dim/2) with angles computed in double precision; causal
softmax attention with scale 1/sqrt(head_dim); output projection; SwiGLU
MLP), a final RMSNorm and the output head, all in float32. K is stored
after RoPE, as in the pages.

A Context holds one request's K/V as two float32 tensors of shape
(num_layers, num_kv_heads, capacity, head_dim): per layer, per head, token
after token. That is the inner order of a radixkv page (docs/CONTRACTS.md
§2: layer -> {K, V} -> kv_head -> slot -> dim), so block b of the context is
`ctx.k[:, :, b*P:(b+1)*P]` and maps onto `page[:, 0]` (K) and `page[:, 1]`
(V) of a page viewed as (num_layers, 2, num_kv_heads, page_size, head_dim).

The weights file is safetensors (format: worker/README.md); it is
read with NumPy alone. The file's probe tensors (a fixed prompt and the C++
model's logits for it) let `check_probe()` confirm that this forward pass
computes what radixkv-worker computes.

Thread safety: a ReferenceModel is read-only after load; a Context belongs
to one request.
"""
import json
import math
import struct
from typing import Dict, Sequence, Tuple

import numpy as np
import torch

__all__ = ["ReferenceModel", "Context", "read_safetensors"]

FORMAT = "radixkv-reference-weights"
_DTYPES = {"F32": np.dtype("<f4"), "U32": np.dtype("<u4")}


def read_safetensors(path: str) -> Tuple[Dict[str, str], Dict[str, np.ndarray]]:
    """(metadata, name -> array) of a safetensors file holding F32/U32 tensors.
    The arrays share one writable buffer with the file's contents."""
    with open(path, "rb") as f:
        blob = bytearray(f.read())
    if len(blob) < 8:
        raise ValueError(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack_from("<Q", blob, 0)
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(bytes(blob[8:8 + n]).decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name}: dtype {info['dtype']} not supported")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - begin != count * dtype.itemsize or base + end > len(blob):
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {begin}..{end}")
        tensors[name] = np.frombuffer(blob, dtype=dtype, count=count,
                                      offset=base + begin).reshape(shape)
    return meta, tensors


class Context:
    """One request's K/V: tokens 0 .. size-1 of its sequence (cached prefix
    and computed tokens alike), in tensors of shape (num_layers, num_kv_heads,
    capacity, head_dim)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int,
                 capacity: int):
        shape = (num_layers, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=torch.float32)
        self.v = torch.zeros(shape, dtype=torch.float32)
        self.size = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]


class ReferenceModel:
    """The exported model; see the module docstring."""

    def __init__(self, config: dict, namespace: dict,
                 tensors: Dict[str, np.ndarray]):
        self.config = config
        self.namespace = namespace
        c = config
        self.num_layers = int(c["num_layers"])
        self.d_model = int(c["d_model"])
        self.num_q_heads = int(c["num_q_heads"])
        self.num_kv_heads = int(c["num_kv_heads"])
        self.head_dim = int(c["head_dim"])
        self.ffn_dim = int(c["ffn_dim"])
        self.vocab = int(c["vocab"])
        self.page_size = int(c["page_size"])
        # Config floats are float32 values (the C++ fields are float).
        self.norm_eps = float(np.float32(c["norm_eps"]))
        self.scale = 1.0 / math.sqrt(self.head_dim)
        t = {name: torch.from_numpy(a) for name, a in tensors.items()
             if a.dtype == np.float32}
        self.embedding = t["embedding"]
        self.layers = [
            {key: t[f"layers.{l}.{key}"] for key in
             ("attn_norm", "wqkv", "wo", "mlp_norm", "wgateup", "wdown")}
            for l in range(self.num_layers)]
        self.final_norm = t["final_norm"]
        self.head = t["head"]
        self.inv_freq = t["rope_inv_freq"].double()
        self.probe_tokens = tensors.get("probe.tokens")
        self.probe_logits = t.get("probe.logits")

    @classmethod
    def load(cls, path: str) -> "ReferenceModel":
        meta, tensors = read_safetensors(path)
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: format {meta.get('format')!r}, want {FORMAT!r}")
        if meta.get("format_version") != "1":
            raise ValueError(f"{path}: format_version {meta.get('format_version')!r}, want '1'")
        return cls(json.loads(meta["config"]), json.loads(meta["namespace"]), tensors)

    def new_context(self, capacity: int) -> Context:
        return Context(self.num_layers, self.num_kv_heads, self.head_dim, capacity)

    def _rms_norm(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        ms = (x * x).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(ms + self.norm_eps) * gain

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: (m, heads, D); cos/sin: (m, 1, D/2).
        half = self.head_dim // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    @torch.no_grad()
    def forward(self, ctx: Context, tokens: Sequence[int]) -> torch.Tensor:
        """Runs `tokens` at positions ctx.size, ctx.size + 1, ... after the
        context's tokens, appends their K/V to `ctx` and returns the last
        token's logits (float32, shape (vocab,))."""
        ids = torch.as_tensor(np.asarray(tokens, dtype=np.int64))
        m = int(ids.numel())
        start = ctx.size
        if m == 0:
            raise ValueError("tokens: at least one needed")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
            raise ValueError(f"tokens must be in 0 .. {self.vocab - 1}")
        if start + m > ctx.capacity:
            raise ValueError(f"context: {m} new tokens do not fit "
                             f"(size {start}, capacity {ctx.capacity})")
        hq, hkv, dh = self.num_q_heads, self.num_kv_heads, self.head_dim
        group, qd, kvd, f = hq // hkv, hq * dh, hkv * dh, self.ffn_dim
        end = start + m
        pos = torch.arange(start, end, dtype=torch.float64)
        angles = pos[:, None] * self.inv_freq[None, :]
        cos = torch.cos(angles).float()[:, None, :]
        sin = torch.sin(angles).float()[:, None, :]
        # Query i (position start + i) sees keys 0 .. start + i.
        visible = (torch.arange(end)[None, :] <= pos.long()[:, None])
        mask = torch.zeros(m, end).masked_fill_(~visible, float("-inf"))

        x = self.embedding[ids].clone()
        for l, w in enumerate(self.layers):
            h = self._rms_norm(x, w["attn_norm"])
            qkv = h @ w["wqkv"]
            q = self._rope(qkv[:, :qd].view(m, hq, dh), cos, sin)
            k = self._rope(qkv[:, qd:qd + kvd].view(m, hkv, dh), cos, sin)
            v = qkv[:, qd + kvd:].view(m, hkv, dh)
            ctx.k[l, :, start:end] = k.transpose(0, 1)
            ctx.v[l, :, start:end] = v.transpose(0, 1)
            keys, values = ctx.k[l, :, :end], ctx.v[l, :, :end]  # (hkv, end, D)
            # GQA: query head h reads kv head h // group.
            qg = (q * self.scale).view(m, hkv, group, dh).permute(1, 2, 0, 3)
            scores = qg.reshape(hkv, group * m, dh) @ keys.transpose(1, 2)
            scores = scores.view(hkv, group, m, end) + mask
            probs = torch.softmax(scores, dim=-1).view(hkv, group * m, end)
            out = (probs @ values).view(hkv, group, m, dh).permute(2, 0, 1, 3)
            x = x + out.reshape(m, qd) @ w["wo"]
            h = self._rms_norm(x, w["mlp_norm"])
            gu = h @ w["wgateup"]
            x = x + (torch.nn.functional.silu(gu[:, :f]) * gu[:, f:]) @ w["wdown"]
        ctx.size = end
        last = self._rms_norm(x[m - 1:], self.final_norm)
        return (last @ self.head)[0]

    def prefill(self, tokens: Sequence[int]) -> torch.Tensor:
        """The last token's logits of a full prefill (no cache)."""
        ctx = self.new_context(len(tokens))
        return self.forward(ctx, tokens)

    def check_probe(self) -> float:
        """Largest |logit difference| between this forward pass and the C++
        model's on the file's probe prompt."""
        if self.probe_tokens is None or self.probe_logits is None:
            raise ValueError("the weights file has no probe tensors")
        logits = self.prefill(self.probe_tokens.astype(np.int64))
        return float((logits - self.probe_logits).abs().max())
