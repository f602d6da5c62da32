"""Block keys of contract v1 (docs/CONTRACTS.md §1), byte for byte.

    spec = NamespaceSpec(model="m", num_layers=32, num_kv_heads=8,
                         head_dim=128, page_size=16, dtype="DTYPE_BFLOAT16")
    root = namespace_root(spec.normalized())     # == SessionInfo.namespace_id
    keys = compute_block_keys(root, spec.page_size, tokens)  # one per full block

Every key is the canonical 16-byte form (xxHash's XXH128 canonical:
high 64 bits big-endian, then low 64 bits). Hashing needs only NumPy and
python3-xxhash; nothing here imports gRPC. Token lists may be Python lists
or NumPy integer arrays; ids are unsigned 32-bit (0 .. 2**32 - 1).

The token bytes of all blocks are packed with NumPy in one step; the chain
itself is sequential (each key hashes its parent's), one xxh3_128 call per
block.

Thread safety: the functions are pure; a BlockHasher belongs to one thread.
"""
import dataclasses
import struct
from typing import Iterable, List, Sequence, Tuple, Union

import numpy as np
import xxhash

__all__ = [
    "BLOCK_KEY_VERSION", "DTYPES", "CrossLayerKv", "NamespaceSpec", "BlockHasher",
    "namespace_bytes", "namespace_root", "compute_block_keys", "chain_key",
    "dtype_value", "dtype_bytes", "as_token_array",
]

# OpenSession.block_key_version of the keys computed here.
BLOCK_KEY_VERSION = 1

# radixkv.v1.DType: name -> (value, bytes per element). The values enter the
# namespace hash and never change.
DTYPES = {
    "DTYPE_UNSPECIFIED": (0, 0),
    "DTYPE_FLOAT32": (1, 4),
    "DTYPE_FLOAT16": (2, 2),
    "DTYPE_BFLOAT16": (3, 2),
    "DTYPE_FLOAT8_E4M3": (4, 1),
    "DTYPE_FLOAT8_E5M2": (5, 1),
    "DTYPE_INT8": (6, 1),
}
_DTYPE_BYTES = {value: size for value, size in DTYPES.values()}
# The short names radixkvctl --dtype accepts.
_DTYPE_ALIASES = {
    "unspecified": 0,
    "fp32": 1, "float32": 1, "f32": 1,
    "fp16": 2, "float16": 2, "f16": 2, "half": 2,
    "bf16": 3, "bfloat16": 3,
    "fp8_e4m3": 4, "fp8e4m3": 4, "float8_e4m3": 4,
    "fp8_e5m2": 5, "fp8e5m2": 5, "float8_e5m2": 5,
    "int8": 6,
}
_U32_MAX = 0xFFFFFFFF
_U4 = np.dtype("<u4")
_NS_TAG = b"radixkv.ns.v1"
_H = xxhash.xxh3_128_digest


def dtype_value(dtype: Union[int, str]) -> int:
    """The radixkv.v1.DType number of `dtype`: an int (any u32 is hashed as
    given), an enum name ("DTYPE_FLOAT16") or a radixkvctl name ("fp16",
    "bf16", ...). ValueError for an unknown name."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        value = int(dtype)
        if not 0 <= value <= _U32_MAX:
            raise ValueError(f"dtype {value} is not an unsigned 32-bit value")
        return value
    if isinstance(dtype, str):
        if dtype in DTYPES:
            return DTYPES[dtype][0]
        name = dtype.lower()
        if name.startswith("dtype_") and name.upper() in DTYPES:
            return DTYPES[name.upper()][0]
        if name in _DTYPE_ALIASES:
            return _DTYPE_ALIASES[name]
    raise ValueError(
        f"dtype {dtype!r}: want a radixkv.v1.DType number or name "
        "(DTYPE_FLOAT16, fp16, bf16, fp32, fp8_e4m3, fp8_e5m2, int8)")


def dtype_bytes(dtype: Union[int, str]) -> int:
    """Bytes per element of `dtype`; 0 for DTYPE_UNSPECIFIED or unknown."""
    return _DTYPE_BYTES.get(dtype_value(dtype), 0)


@dataclasses.dataclass(frozen=True)
class CrossLayerKv:
    """A cross-layer KV layout (radixkv.v1.CrossLayerKv, docs/CONTRACTS.md
    §1.2 and §2.2): layers [0, shared_from_layer) keep their own K/V, the
    layers from shared_from_layer on read one shared bank, each with its own
    local window of local_window tokens outside pages. Integers are u32."""
    shared_from_layer: int = 0
    local_window: int = 0

    def __post_init__(self):
        for name in ("shared_from_layer", "local_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"cross_layer.{name} must be an int")
            if not 0 <= int(value) <= _U32_MAX:
                raise ValueError(
                    f"cross_layer.{name}: {int(value)} is not an unsigned 32-bit value")
            object.__setattr__(self, name, int(value))

    def groups(self, num_layers: int) -> int:
        """KV groups of a page: shared_from_layer per-layer groups plus the
        bank; 0 unless 1 <= shared_from_layer < num_layers."""
        s = self.shared_from_layer
        return 0 if s == 0 or s >= num_layers else s + 1


@dataclasses.dataclass(frozen=True)
class NamespaceSpec:
    """The eleven fields of radixkv.v1.Namespace. `dtype` may be given as a
    number or a name and is stored as its number. Integers are u32.

    tp_size defaults to 1. radixkvd reads tp_size 0 as 1 before hashing
    (docs/CONTRACTS.md §1.6); normalized() applies that, and the Client
    hashes the normalized spec so its root equals SessionInfo.namespace_id.
    namespace_root() itself hashes every field as given."""
    model: str = ""
    model_revision: str = ""
    lora: str = ""
    cache_salt: str = ""
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    page_size: int = 0
    dtype: Union[int, str] = 0
    tp_rank: int = 0
    tp_size: int = 1
    # None: per-layer KV. A CrossLayerKv, or a dict of its two fields.
    cross_layer: Union[None, CrossLayerKv, dict] = None

    _STRINGS = ("model", "model_revision", "lora", "cache_salt")
    _INTS = ("num_layers", "num_kv_heads", "head_dim", "page_size", "dtype",
             "tp_rank", "tp_size")

    def __post_init__(self):
        object.__setattr__(self, "dtype", dtype_value(self.dtype))
        if isinstance(self.cross_layer, dict):
            object.__setattr__(self, "cross_layer", CrossLayerKv(**self.cross_layer))
        elif not isinstance(self.cross_layer, (CrossLayerKv, type(None))):
            raise TypeError("namespace.cross_layer must be a CrossLayerKv, a dict or None")
        for name in self._STRINGS:
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"namespace.{name} must be a str")
        for name in self._INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"namespace.{name} must be an int")
            if not 0 <= int(value) <= _U32_MAX:
                raise ValueError(
                    f"namespace.{name}: {int(value)} is not an unsigned 32-bit value")
            object.__setattr__(self, name, int(value))

    def normalized(self) -> "NamespaceSpec":
        """This spec as radixkvd hashes it: tp_size 0 read as 1."""
        if self.tp_size != 0:
            return self
        return dataclasses.replace(self, tp_size=1)

    @property
    def elem_bytes(self) -> int:
        return _DTYPE_BYTES.get(self.dtype, 0)

    @property
    def kv_groups(self) -> int:
        """KV groups per page: num_layers, or with a cross-layer layout
        shared_from_layer + 1 (0 when that layout is not serveable)."""
        if self.cross_layer is None:
            return self.num_layers
        return self.cross_layer.groups(self.num_layers)

    @property
    def page_bytes(self) -> int:
        """kv_groups * 2 * num_kv_heads * page_size * head_dim * elem_bytes
        (docs/CONTRACTS.md §2; kv_groups is num_layers without a cross-layer
        layout), without the scale area of fp8/int8 pages; 0 when the layout
        is incomplete."""
        return (self.kv_groups * 2 * self.num_kv_heads * self.page_size *
                self.head_dim * self.elem_bytes)

    @property
    def page_shape(self) -> Tuple[int, int, int, int, int]:
        """(kv_groups, 2, num_kv_heads, page_size, head_dim): one page,
        K before V, slot = a token's position inside its block."""
        return (self.kv_groups, 2, self.num_kv_heads, self.page_size,
                self.head_dim)

    def to_dict(self) -> dict:
        """The eleven fields, plus "cross_layer" (a dict) when set."""
        d = {name: getattr(self, name) for name in self._STRINGS + self._INTS}
        if self.cross_layer is not None:
            d["cross_layer"] = dataclasses.asdict(self.cross_layer)
        return d

    def to_proto(self):
        """The radixkv.v1.Namespace message (needs the generated stubs)."""
        from radixkv import pb  # pylint: disable=import-outside-toplevel
        d = self.to_dict()
        layout = d.pop("cross_layer", None)
        message = pb.Namespace(**d)
        if layout is not None:
            message.cross_layer.CopyFrom(pb.CrossLayerKv(**layout))
        return message

    @classmethod
    def from_proto(cls, message) -> "NamespaceSpec":
        fields = {name: getattr(message, name)
                  for name in cls._STRINGS + cls._INTS}
        if message.HasField("cross_layer"):
            fields["cross_layer"] = CrossLayerKv(
                message.cross_layer.shared_from_layer,
                message.cross_layer.local_window)
        return cls(**fields)


def _str_bytes(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<I", len(b)) + b


# The tag that starts a cross-layer layout's bytes in ns_bytes.
_XLAYER_TAG = "radixkv.layout.xlayer.v1"


def namespace_bytes(spec: NamespaceSpec) -> bytes:
    """ns_bytes of docs/CONTRACTS.md §1.2, every field as given; a
    cross-layer layout appends str(tag) || u32(shared_from_layer) ||
    u32(local_window)."""
    head = b"".join(_str_bytes(s) for s in (
        "radixkv.ns.v1", spec.model, spec.model_revision, spec.lora,
        spec.cache_salt))
    out = head + struct.pack(
        "<7I", spec.num_layers, spec.num_kv_heads, spec.head_dim,
        spec.page_size, spec.dtype, spec.tp_rank, spec.tp_size)
    if spec.cross_layer is not None:
        out += _str_bytes(_XLAYER_TAG) + struct.pack(
            "<2I", spec.cross_layer.shared_from_layer,
            spec.cross_layer.local_window)
    return out


def namespace_root(spec: NamespaceSpec) -> bytes:
    """root = H(ns_bytes): the namespace id, 16 bytes. Hashes every field as
    given; pass spec.normalized() to get the daemon's namespace_id."""
    return _H(namespace_bytes(spec))


def as_token_array(tokens) -> np.ndarray:
    """`tokens` (a sequence of ints or a NumPy integer array) as a
    C-contiguous little-endian uint32 array, without a copy when it already
    is one. ValueError for an id outside 0 .. 2**32 - 1, TypeError for
    anything but integer ids."""
    arr = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
    if arr.dtype == _U4:
        return np.ascontiguousarray(arr.reshape(-1))
    if arr.size == 0:
        return np.empty(0, _U4)
    if arr.dtype.kind == "O" and all(
            isinstance(t, (int, np.integer)) and not isinstance(t, bool)
            for t in arr.flat):
        raise ValueError("tokens: ids must be in 0 .. 2**32 - 1")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"tokens: integer ids wanted, got {arr.dtype} values")
    if arr.dtype.kind == "i" or arr.dtype.itemsize > 4:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > _U32_MAX:
            raise ValueError(
                f"tokens: ids must be in 0 .. 2**32 - 1 (got {lo} .. {hi})")
    return np.ascontiguousarray(arr.reshape(-1), dtype=_U4)


def _pack_blocks(page_size: int, tokens: np.ndarray) -> Tuple[bytes, int]:
    """Every full block's hash input after its parent key, concatenated:
    u32(P) || tokens || u32(0) (no extras), 8 + 4P bytes per block."""
    n = tokens.size // page_size
    rows = np.zeros((n, page_size + 2), dtype="<u4")
    rows[:, 0] = page_size
    rows[:, 1:page_size + 1] = tokens[:n * page_size].reshape(n, page_size)
    return rows.tobytes(), n


def _chain(parent: bytes, packed: bytes, n: int, stride: int) -> List[bytes]:
    keys = []
    append = keys.append
    key = parent
    for off in range(0, n * stride, stride):
        key = _H(key + packed[off:off + stride])
        append(key)
    return keys


def compute_block_keys(root: bytes, page_size: int, tokens) -> List[bytes]:
    """Keys of every full block of `tokens` (docs/CONTRACTS.md §1.3, no
    extras), in block order; a partial tail has none. `root` is the
    namespace root (or any parent key to continue a chain)."""
    if len(root) != 16:
        raise ValueError(f"root: {len(root)} bytes; a block key is 16 bytes")
    if not 0 < page_size <= _U32_MAX:
        raise ValueError(f"page_size must be in 1 .. 2**32 - 1, got {page_size}")
    arr = as_token_array(tokens)
    packed, n = _pack_blocks(page_size, arr)
    return _chain(bytes(root), packed, n, 8 + 4 * page_size)


def chain_key(parent: bytes, tokens, extras: Iterable[Tuple[str, str]] = ()) -> bytes:
    """One step of §1.3 with extras: H(parent || u32(len(tokens)) || tokens
    || u32(m) || str(tag_1) || str(value_1) ...). The length word is the
    number of tokens given."""
    if len(parent) != 16:
        raise ValueError(f"parent: {len(parent)} bytes; a block key is 16 bytes")
    arr = as_token_array(tokens)
    pairs = list(extras)
    tail = struct.pack("<I", len(pairs)) + b"".join(
        _str_bytes(tag) + _str_bytes(value) for tag, value in pairs)
    return _H(bytes(parent) + struct.pack("<I", arr.size) + arr.tobytes() + tail)


class BlockHasher:
    """Incremental block keys: append tokens as they come (a streaming
    prompt, decode output); keys lists every full block so far.

        h = BlockHasher(root, page_size)
        h.append(prompt); h.append([next_token])
        h.keys   # == compute_block_keys(root, page_size, all tokens so far)
    """

    def __init__(self, root: bytes, page_size: int):
        if len(root) != 16:
            raise ValueError(f"root: {len(root)} bytes; a block key is 16 bytes")
        if not 0 < page_size <= _U32_MAX:
            raise ValueError(f"page_size must be in 1 .. 2**32 - 1, got {page_size}")
        self._root = bytes(root)
        self._page_size = page_size
        self._pending = np.empty(0, "<u4")
        self._keys: List[bytes] = []

    def append(self, tokens) -> List[bytes]:
        """Adds tokens; returns the keys of the blocks they completed."""
        arr = as_token_array([tokens] if isinstance(tokens, (int, np.integer))
                             else tokens)
        if self._pending.size:
            arr = np.concatenate([self._pending, arr])
        packed, n = _pack_blocks(self._page_size, arr)
        new = _chain(self.last_key, packed, n, 8 + 4 * self._page_size)
        self._keys.extend(new)
        self._pending = arr[n * self._page_size:].copy()
        return new

    @property
    def keys(self) -> Sequence[bytes]:
        """Keys of the full blocks seen so far, in block order."""
        return tuple(self._keys)

    @property
    def pending_tokens(self) -> int:
        """Tokens appended that do not yet fill a block."""
        return int(self._pending.size)

    @property
    def last_key(self) -> bytes:
        """The key the next block chains from (the root before any block)."""
        return self._keys[-1] if self._keys else self._root
