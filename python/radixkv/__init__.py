"""radixkv: the Python client of radixkvd, the prefix-caching KV store.

    import radixkv
    spec = radixkv.NamespaceSpec(model="m", num_layers=32, num_kv_heads=8,
                                 head_dim=128, page_size=16, dtype="bf16")
    with radixkv.Client(namespace=spec, attach_pool=True) as client:
        with client.acquire(tokens) as lease:
            ...

Modules: radixkv.keys (block keys, contract v1), radixkv.errors (typed
errors), radixkv.client (Client, Lease), radixkv.pool (attach protocol,
page views). docs/PYTHON.md is the guide.

Generated stubs. protoc writes radixkv_pb2.py and radixkv_pb2_grpc.py to
radixkv/_pb/radixkv/v1/ (at build or install time; never committed). They
import each other as "radixkv.v1.radixkv_pb2", so this package lists
_pb/radixkv in its __path__: radixkv.v1 is that directory. Use them as
radixkv.pb and radixkv.pb_grpc (the same module objects as
radixkv.v1.radixkv_pb2 and radixkv.v1.radixkv_pb2_grpc).

radixkv.keys and radixkv.errors import without the stubs; the other names
load them on first use.
"""
import importlib
import os

__path__.append(os.path.join(os.path.dirname(__file__), "_pb", "radixkv"))  # noqa: F821

from radixkv.errors import (  # noqa: E402
    AttachError, DeadlineExceeded, Error, FailedPrecondition, InvalidArgument,
    LeaseLost, NotFound, ResourceExhausted, Unavailable, from_rpc_error)
from radixkv.keys import (  # noqa: E402
    BLOCK_KEY_VERSION, BlockHasher, CrossLayerKv, NamespaceSpec, chain_key,
    compute_block_keys, namespace_root)

__version__ = "0.1.0"

_LAZY = {
    "pb": ("radixkv.v1.radixkv_pb2", None),
    "pb_grpc": ("radixkv.v1.radixkv_pb2_grpc", None),
    "Client": ("radixkv.client", "Client"),
    "Lease": ("radixkv.client", "Lease"),
    "ClientState": ("radixkv.client", "ClientState"),
    "Pool": ("radixkv.pool", "Pool"),
    "attach": ("radixkv.pool", "attach"),
}

__all__ = [
    "AttachError", "BLOCK_KEY_VERSION", "BlockHasher", "Client", "ClientState",
    "CrossLayerKv", "DeadlineExceeded", "Error", "FailedPrecondition", "InvalidArgument", "Lease",
    "LeaseLost", "NamespaceSpec", "NotFound", "Pool", "ResourceExhausted",
    "Unavailable", "attach", "chain_key", "compute_block_keys", "from_rpc_error",
    "namespace_root", "pb", "pb_grpc",
]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'radixkv' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if not e.name or not e.name.startswith("radixkv.v1"):
            raise
        raise ImportError(
            "radixkv: the generated stubs are missing from "
            f"{os.path.join(os.path.dirname(__file__), '_pb')}: use the package "
            "from a build tree (<build>/python, target radixkv_python) or pip "
            "install python (docs/PYTHON.md)") from e
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value
