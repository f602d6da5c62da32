"""The CUDA driver calls that map a cuda pool in this process
(docs/CONTRACTS.md §3), through ctypes against libcuda.so.1.

Each chunk descriptor of a cuda pool is a CUDA VMM shareable handle of
type POSIX file descriptor. map_chunks() does what the C++ worker does
(gpu/cuda_pool.cc, MappedPool::MapCuda): cuInit, cuDeviceGet, a check
that the device supports VMM with POSIX-fd handles, the device's primary
context retained (cuDevicePrimaryCtxRetain) and made current for the
calls, then cuMemImportFromShareableHandle of each chunk, one
cuMemAddressReserve for all chunks, cuMemMap of each chunk back to back,
and cuMemSetAccess (read-write for the device) per chunk.

libcuda.so.1 is opened on the first map_chunks() (never at import), so the
package imports and maps host pools on machines without an NVIDIA driver.
Every failure is an AttachError whose message starts with "cuda pool: "
and says what is missing: the driver library, an entry point, a device,
VMM support, or which driver call failed with which CUresult.

Ownership: a Mapping owns its imported handles, its address range, its
chunk mappings and one reference to the device's primary context. They
are released, in the C++ order (mappings, handles, address range), when
the Mapping is garbage (weakref.finalize; not at interpreter exit, where
the process's end frees them) or on release(). The caller keeps the
descriptors; they may be closed once map_chunks() returns, since the
imported handles keep the memory alive.

Thread safety: the driver table is loaded once under a lock and is
immutable afterwards; map_chunks() may run on any thread and leaves that
thread's current context as it found it.
"""
import contextlib
import ctypes
import threading
import weakref
from typing import Dict, List, Sequence, Tuple

import grpc

from radixkv.errors import AttachError

__all__ = ["LIBCUDA", "Driver", "Mapping", "load_driver", "map_chunks"]

# The soname of the NVIDIA driver's CUDA library. A process that already
# loaded it (torch, CuPy) shares that copy.
LIBCUDA = "libcuda.so.1"

_c_int_p = ctypes.POINTER(ctypes.c_int)
_CUdeviceptr = ctypes.c_ulonglong
_CUmemGenericAllocationHandle = ctypes.c_ulonglong

# cuda.h values used here (fixed by the driver ABI).
_CU_MEM_ALLOCATION_TYPE_PINNED = 1
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103

_CUDA_ERROR_OUT_OF_MEMORY = 2
# Results that mean "no usable driver or device here", not a fault.
_PRECONDITION_RESULTS = {
    3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY", 35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE", 100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE", 801: "CUDA_ERROR_NOT_SUPPORTED",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
}
# Names for messages when the driver cannot name a result itself (a stub
# library answers every call, cuGetErrorName included, with an error).
_RESULT_NAMES = {
    **_PRECONDITION_RESULTS,
    1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
    304: "CUDA_ERROR_OPERATING_SYSTEM", 800: "CUDA_ERROR_NOT_PERMITTED",
    999: "CUDA_ERROR_UNKNOWN"}


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class _MemAllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int),
                ("requestedHandleTypes", ctypes.c_int),
                ("location", _MemLocation),
                ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", _AllocFlags)]


class _MemAccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _MemLocation), ("flags", ctypes.c_int)]


# Entry point -> argument types; every one returns a CUresult (int). The
# names are the exported symbols (cuda.h maps cuDevicePrimaryCtxRelease to
# its _v2 symbol).
_SIGNATURES = {
    "cuInit": (ctypes.c_uint,),
    "cuDriverGetVersion": (_c_int_p,),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    "cuGetErrorString": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    "cuDeviceGetCount": (_c_int_p,),
    "cuDeviceGet": (_c_int_p, ctypes.c_int),
    "cuDeviceGetAttribute": (_c_int_p, ctypes.c_int, ctypes.c_int),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_int),
    "cuDevicePrimaryCtxRelease_v2": (ctypes.c_int,),
    "cuCtxGetCurrent": (ctypes.POINTER(ctypes.c_void_p),),
    "cuCtxSetCurrent": (ctypes.c_void_p,),
    "cuMemGetAllocationGranularity": (ctypes.POINTER(ctypes.c_size_t),
                                      ctypes.POINTER(_MemAllocationProp),
                                      ctypes.c_int),
    "cuMemImportFromShareableHandle": (
        ctypes.POINTER(_CUmemGenericAllocationHandle), ctypes.c_void_p,
        ctypes.c_int),
    "cuMemAddressReserve": (ctypes.POINTER(_CUdeviceptr), ctypes.c_size_t,
                            ctypes.c_size_t, _CUdeviceptr, ctypes.c_ulonglong),
    "cuMemAddressFree": (_CUdeviceptr, ctypes.c_size_t),
    "cuMemMap": (_CUdeviceptr, ctypes.c_size_t, ctypes.c_size_t,
                 _CUmemGenericAllocationHandle, ctypes.c_ulonglong),
    "cuMemUnmap": (_CUdeviceptr, ctypes.c_size_t),
    "cuMemSetAccess": (_CUdeviceptr, ctypes.c_size_t,
                       ctypes.POINTER(_MemAccessDesc), ctypes.c_size_t),
    "cuMemRelease": (_CUmemGenericAllocationHandle,),
}


class Driver:
    """The entry points of one loaded libcuda (attributes named as in
    cuda.h, without the _v2 suffix)."""

    def __init__(self, path: str):
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise AttachError(
                f"cuda pool: the NVIDIA driver's CUDA library {path} cannot be "
                f"loaded ({e}): this machine has no NVIDIA driver, or its "
                "libraries are not on the loader path; a cuda pool's pages "
                "are GPU memory and only a process that can load the driver "
                "maps them (attach_pool=False still gives the cache's "
                "bookkeeping)", code=grpc.StatusCode.FAILED_PRECONDITION) from None
        self.path = path
        for symbol, argtypes in _SIGNATURES.items():
            try:
                fn = getattr(lib, symbol)
            except AttributeError:
                raise AttachError(
                    f"cuda pool: the CUDA driver library {path} has no {symbol} "
                    "(a driver older than CUDA 11.0, or not libcuda)",
                    code=grpc.StatusCode.FAILED_PRECONDITION) from None
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            name = symbol[:-3] if symbol.endswith("_v2") else symbol
            setattr(self, name, fn)

    def result_text(self, result: int) -> str:
        """"CUDA_ERROR_X (n): description", as far as the driver says."""
        name = ctypes.c_char_p()
        text = ctypes.c_char_p()
        if self.cuGetErrorName(result, ctypes.byref(name)) != 0 or not name.value:
            name.value = _RESULT_NAMES.get(result, "CUresult").encode()
        out = f"{name.value.decode(errors='replace')} ({result})"
        if self.cuGetErrorString(result, ctypes.byref(text)) == 0 and text.value:
            out += ": " + text.value.decode(errors="replace")
        return out

    def error(self, result: int, what: str) -> AttachError:
        """The AttachError of a failed call: RESOURCE_EXHAUSTED for out of
        memory, FAILED_PRECONDITION where the driver or device is not
        usable, INTERNAL otherwise."""
        message = f"cuda pool: {what}: {self.result_text(result)}"
        if result == _CUDA_ERROR_OUT_OF_MEMORY:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED
        elif result in _PRECONDITION_RESULTS:
            code = grpc.StatusCode.FAILED_PRECONDITION
        else:
            code = grpc.StatusCode.INTERNAL
        return AttachError(message, code=code)

    def check(self, result: int, what: str) -> None:
        if result != 0:
            raise self.error(result, what)


_drivers: Dict[str, Driver] = {}
_drivers_lock = threading.Lock()


def load_driver(path: str = None) -> Driver:
    """The Driver of `path` (default LIBCUDA), loaded once per process.
    AttachError (FAILED_PRECONDITION) when it cannot be loaded."""
    path = path or LIBCUDA
    with _drivers_lock:
        driver = _drivers.get(path)
        if driver is None:
            driver = _drivers[path] = Driver(path)
        return driver


@contextlib.contextmanager
def _current(d: Driver, ctx: ctypes.c_void_p):
    """Makes `ctx` current on this thread for the block, then restores the
    context that was current before."""
    prev = ctypes.c_void_p()
    d.check(d.cuCtxGetCurrent(ctypes.byref(prev)), "cuCtxGetCurrent")
    d.check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    try:
        yield
    finally:
        d.cuCtxSetCurrent(prev)


def _open_device(d: Driver, device: int) -> Tuple[int, ctypes.c_void_p]:
    """cuInit, the device's checks, its primary context retained; returns
    (CUdevice, context)."""
    result = d.cuInit(0)
    if result != 0:
        raise d.error(result, f"no usable CUDA driver/device ({d.path}): cuInit")
    count = ctypes.c_int(0)
    d.check(d.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    if not 0 <= device < count.value:
        raise AttachError(
            f"cuda pool: the pool is on device {device} but this process sees "
            f"{count.value} CUDA device(s) (CUDA_VISIBLE_DEVICES must show the "
            "daemon's device under the same ordinal)",
            code=grpc.StatusCode.FAILED_PRECONDITION)
    dev = ctypes.c_int(0)
    d.check(d.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    vmm, posix_fd = ctypes.c_int(0), ctypes.c_int(0)
    d.cuDeviceGetAttribute(ctypes.byref(vmm),
                           _CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev)
    d.cuDeviceGetAttribute(
        ctypes.byref(posix_fd),
        _CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev)
    if not vmm.value or not posix_fd.value:
        raise AttachError(
            f"cuda pool: device {device} does not support virtual memory "
            f"management with POSIX fd handles (vmm={vmm.value}, "
            f"posix_fd={posix_fd.value})", code=grpc.StatusCode.FAILED_PRECONDITION)
    ctx = ctypes.c_void_p()
    d.check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
            f"cuDevicePrimaryCtxRetain of device {device}")
    return dev.value, ctx


def _granularity(d: Driver, device: int) -> int:
    prop = _MemAllocationProp()
    prop.type = _CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.location.type = _CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    gran = ctypes.c_size_t(0)
    d.check(d.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop),
                                            _CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity")
    if gran.value == 0:
        raise AttachError("cuda pool: granularity is 0",
                          code=grpc.StatusCode.INTERNAL)
    return gran.value


def _release(d: Driver, dev: int, ctx: ctypes.c_void_p, base: List[int],
             total: int, mapped: List[Tuple[int, int]], handles: List[int]) -> None:
    """Undoes map_chunks (what it got done); errors are ignored, as in the
    C++ destructors."""
    with contextlib.suppress(AttachError), _current(d, ctx):
        for ptr, size in reversed(mapped):
            d.cuMemUnmap(ptr, size)
        for handle in handles:
            d.cuMemRelease(handle)
        if base[0]:
            d.cuMemAddressFree(base[0], total)
    mapped.clear()
    handles.clear()
    base[0] = 0
    d.cuDevicePrimaryCtxRelease(dev)


class Mapping:
    """The chunks of one cuda pool mapped back to back from `base`; chunk c
    starts at chunk_bases[c]. Device pointers are valid while the Mapping
    lives (or until release())."""

    def __init__(self, device: int, base: int, chunk_bases: Sequence[int],
                 finalizer):
        self.device = device
        self.base = base
        self.chunk_bases = tuple(chunk_bases)
        self._finalizer = finalizer

    def release(self) -> None:
        """Unmaps now; pointers into the pool are invalid afterwards."""
        self._finalizer()


def map_chunks(device: int, chunk_bytes: Sequence[int], fds: Sequence[int],
               library: str = None) -> Mapping:
    """Imports the chunk descriptors `fds` (one per chunk, in order, of
    sizes `chunk_bytes`) on CUDA device `device` and maps them. The caller
    still owns and closes `fds`. AttachError ("cuda pool: ...") on any
    failure, with everything acquired so far released."""
    d = load_driver(library)
    dev, ctx = _open_device(d, device)
    base, mapped, handles = [0], [], []
    total = sum(chunk_bytes)
    try:
        with _current(d, ctx):
            gran = _granularity(d, device)
            for c, size in enumerate(chunk_bytes):
                if size % gran:
                    raise AttachError(
                        f"cuda pool: chunks[{c}].bytes={size} is not a multiple "
                        f"of the allocation granularity {gran}",
                        code=grpc.StatusCode.INVALID_ARGUMENT)
            for c, fd in enumerate(fds):
                handle = _CUmemGenericAllocationHandle(0)
                d.check(d.cuMemImportFromShareableHandle(
                    ctypes.byref(handle), ctypes.c_void_p(fd),
                    _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                    f"cuMemImportFromShareableHandle of chunk {c}")
                handles.append(handle.value)
            ptr = _CUdeviceptr(0)
            d.check(d.cuMemAddressReserve(ctypes.byref(ptr), total, gran, 0, 0),
                    f"cuMemAddressReserve of {total} bytes")
            base[0] = ptr.value
            access = _MemAccessDesc()
            access.location.type = _CU_MEM_LOCATION_TYPE_DEVICE
            access.location.id = device
            access.flags = _CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            chunk_bases, offset = [], 0
            for c, size in enumerate(chunk_bytes):
                at = base[0] + offset
                d.check(d.cuMemMap(at, size, 0, handles[c], 0),
                        f"cuMemMap of chunk {c}")
                mapped.append((at, size))
                # Access is granted per mapped chunk (the range as a whole
                # is not one allocation).
                d.check(d.cuMemSetAccess(at, size, ctypes.byref(access), 1),
                        f"cuMemSetAccess of chunk {c}")
                chunk_bases.append(at)
                offset += size
    except BaseException:
        _release(d, dev, ctx, base, total, mapped, handles)
        raise
    holder = Mapping(device, base[0], chunk_bases, None)
    finalizer = weakref.finalize(holder, _release, d, dev, ctx, base, total,
                                 mapped, handles)
    finalizer.atexit = False
    holder._finalizer = finalizer  # pylint: disable=protected-access
    return holder
