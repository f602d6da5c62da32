"""The cuda backend of radixkv.pool (radixkv._cuda: ctypes against libcuda).

Without a GPU: a fake libcuda, compiled here from C against the CUDA
toolkit's cuda.h (so the compiler checks each fake entry point against the
driver's own prototype; skipped without cc or cuda.h), stands in for the
driver. attach() of a fake cuda reply then runs the whole import, reserve,
map and set-access sequence through ctypes; the fake checks every argument
and struct field and that the device's retained primary context is current,
and counts what is held. A failure injected at each call must leave nothing
held and every received descriptor closed. The toolkit's stub libcuda shows
that every entry point resolves and that its refusal is reported.

With a GPU (torch with CUDA, libcuda.so.1 and a radixkvd built with CUDA;
skipped otherwise): radixkvd --pool=cuda,device=0,bytes=256MiB, pages
written through torch CUDA tensors here and read by a second Python
process, and the other way round, over one chunk and over many.
"""
import ctypes
import dataclasses
import gc
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

import radixkv
from radixkv import _cuda, pb
from radixkv.pool import CudaArray, CudaPool

from rkv_testutil import assert_no_leaks
from test_pool import FakeAttachServer, memfds_named

MIB = 1 << 20
# A fp16 layout whose pages (1.5 MiB) do not divide the 2 MiB granularity:
# 3 pages per chunk -> 6 MiB chunks, 7 pages -> chunks of 6, 6 and 2 MiB.
ODD = radixkv.NamespaceSpec(model="py-cuda", num_layers=3, num_kv_heads=4,
                            head_dim=1024, page_size=16, dtype="fp16")
ODD_CHUNKS = [6 * MIB, 6 * MIB, 2 * MIB]
FAKE_BASE = 0x7F0000000000

FAKE_LIBCUDA = r"""
#include <cuda.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define GRAN ((size_t)2 << 20)
#define BASE 0x7f0000000000ull
#define DEV(ordinal) (100 + (ordinal))
#define CTX(dev) ((CUcontext)(uintptr_t)(0x1000 + (dev)))

static char g_log[1 << 16];
static size_t g_len;
static int g_devices, g_vmm, g_posix;
static char g_fail[64];
static int g_fail_nth, g_fail_result;
static CUcontext g_current;
static int g_ctx_refs, g_handles, g_mapped, g_bad;
static size_t g_reserved;

static void note(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(g_log + g_len, sizeof(g_log) - g_len, fmt, ap);
  va_end(ap);
  if (n > 0 && g_len + n + 1 < sizeof(g_log)) {
    g_len += n;
    g_log[g_len++] = '\n';
    g_log[g_len] = 0;
  }
}

static CUresult enter(const char* name) {
  if (strcmp(name, g_fail) == 0 && --g_fail_nth == 0) {
    g_fail[0] = 0;
    note("%s failed %d", name, g_fail_result);
    return (CUresult)g_fail_result;
  }
  return CUDA_SUCCESS;
}

#define ENTER(name) do { CUresult r_ = enter(name); if (r_) return r_; } while (0)
#define CHECK(c) do { if (!(c)) { g_bad++; note("bad: %s", #c); \
    return CUDA_ERROR_INVALID_VALUE; } } while (0)
#define IN_CTX() CHECK(g_current == CTX(DEV(0)))

void fake_reset(int devices, int vmm, int posix) {
  g_len = 0; g_log[0] = 0; g_devices = devices; g_vmm = vmm; g_posix = posix;
  g_fail[0] = 0; g_current = 0; g_ctx_refs = g_handles = g_mapped = g_bad = 0;
  g_reserved = 0;
}
void fake_fail(const char* name, int nth, int result) {
  snprintf(g_fail, sizeof(g_fail), "%s", name);
  g_fail_nth = nth; g_fail_result = result;
}
void fake_set_current(uintptr_t ctx) { g_current = (CUcontext)ctx; }
const char* fake_log(void) { return g_log; }
long fake_count(const char* what) {
  if (!strcmp(what, "ctx_refs")) return g_ctx_refs;
  if (!strcmp(what, "handles")) return g_handles;
  if (!strcmp(what, "mapped")) return g_mapped;
  if (!strcmp(what, "reserved")) return (long)g_reserved;
  if (!strcmp(what, "bad")) return g_bad;
  if (!strcmp(what, "current")) return (long)(uintptr_t)g_current;
  return -1;
}

#include <stddef.h>
long fake_layout(const char* what) {
  if (!strcmp(what, "prop")) return sizeof(CUmemAllocationProp);
  if (!strcmp(what, "prop.location")) return offsetof(CUmemAllocationProp, location);
  if (!strcmp(what, "prop.win32HandleMetaData"))
    return offsetof(CUmemAllocationProp, win32HandleMetaData);
  if (!strcmp(what, "prop.allocFlags")) return offsetof(CUmemAllocationProp, allocFlags);
  if (!strcmp(what, "access")) return sizeof(CUmemAccessDesc);
  if (!strcmp(what, "access.flags")) return offsetof(CUmemAccessDesc, flags);
  return -1;
}

CUresult cuInit(unsigned int flags) {
  note("cuInit %u", flags); ENTER("cuInit"); CHECK(flags == 0); return 0;
}
CUresult cuDriverGetVersion(int* v) { *v = 13000; return 0; }
CUresult cuGetErrorName(CUresult r, const char** s) {
  *s = r == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
     : r == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE"
     : r == CUDA_ERROR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : NULL;
  return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGetErrorString(CUresult r, const char** s) {
  *s = r == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : NULL;
  return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuDeviceGetCount(int* n) {
  note("cuDeviceGetCount"); ENTER("cuDeviceGetCount"); *n = g_devices; return 0;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  note("cuDeviceGet %d", ordinal); ENTER("cuDeviceGet");
  CHECK(ordinal >= 0 && ordinal < g_devices); *d = DEV(ordinal); return 0;
}
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  note("cuDeviceGetAttribute %d %d", (int)a, d); CHECK(d == DEV(0));
  *v = a == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ? g_vmm
     : a == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
         ? g_posix : -1;
  return 0;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  note("cuDevicePrimaryCtxRetain %d", d); ENTER("cuDevicePrimaryCtxRetain");
  CHECK(d == DEV(0)); *c = CTX(d); g_ctx_refs++; return 0;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
  note("cuDevicePrimaryCtxRelease %d", d); CHECK(d == DEV(0));
  CHECK(g_ctx_refs > 0); g_ctx_refs--; return 0;
}
CUresult cuCtxGetCurrent(CUcontext* c) {
  note("cuCtxGetCurrent"); *c = g_current; return 0;
}
CUresult cuCtxSetCurrent(CUcontext c) {
  note("cuCtxSetCurrent 0x%lx", (unsigned long)(uintptr_t)c); g_current = c;
  return 0;
}
CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* p,
                                       CUmemAllocationGranularity_flags f) {
  note("cuMemGetAllocationGranularity"); ENTER("cuMemGetAllocationGranularity");
  IN_CTX();
  CHECK(p->type == CU_MEM_ALLOCATION_TYPE_PINNED);
  CHECK(p->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CHECK(p->location.type == CU_MEM_LOCATION_TYPE_DEVICE && p->location.id == 0);
  CHECK(p->win32HandleMetaData == NULL);
  CHECK(f == CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  *g = GRAN;
  return 0;
}
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* h,
                                        void* os, CUmemAllocationHandleType t) {
  int fd = (int)(intptr_t)os;
  struct stat st;
  CHECK(fstat(fd, &st) == 0);
  note("cuMemImportFromShareableHandle size=%ld", (long)st.st_size);
  ENTER("cuMemImportFromShareableHandle");
  IN_CTX();
  CHECK(t == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  *h = 0x5000 + (g_handles++);
  return 0;
}
CUresult cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t align,
                             CUdeviceptr addr, unsigned long long flags) {
  note("cuMemAddressReserve %zu %zu", size, align);
  ENTER("cuMemAddressReserve"); IN_CTX();
  CHECK(align == GRAN && size % GRAN == 0 && addr == 0 && flags == 0);
  CHECK(g_reserved == 0);
  g_reserved = size; *p = BASE;
  return 0;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
  note("cuMemAddressFree 0x%llx %zu", (unsigned long long)p, size);
  CHECK(p == BASE && size == g_reserved && g_mapped == 0);
  g_reserved = 0;
  return 0;
}
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset,
                  CUmemGenericAllocationHandle h, unsigned long long flags) {
  note("cuMemMap 0x%llx %zu 0x%llx", (unsigned long long)p, size,
       (unsigned long long)h);
  ENTER("cuMemMap"); IN_CTX();
  CHECK(p >= BASE && p + size <= BASE + g_reserved && offset == 0 && flags == 0);
  CHECK(h >= 0x5000 && h < 0x5000 + (unsigned)g_handles);
  g_mapped++;
  return 0;
}
CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc* d,
                        size_t count) {
  note("cuMemSetAccess 0x%llx %zu", (unsigned long long)p, size);
  ENTER("cuMemSetAccess"); IN_CTX();
  CHECK(count == 1 && d->location.type == CU_MEM_LOCATION_TYPE_DEVICE);
  CHECK(d->location.id == 0 && d->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  return 0;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
  note("cuMemUnmap 0x%llx %zu", (unsigned long long)p, size);
  IN_CTX(); CHECK(g_mapped > 0); g_mapped--;
  return 0;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  note("cuMemRelease 0x%llx", (unsigned long long)h);
  IN_CTX(); CHECK(g_handles > 0); g_handles--;
  return 0;
}
"""


def _cuda_include():
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    roots += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for root in roots:
        if root and os.path.exists(os.path.join(root, "include", "cuda.h")):
            return os.path.join(root, "include")
    return None


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    """The fake driver's path and a ctypes handle on its controls."""
    cc = shutil.which("cc")
    include = _cuda_include()
    if not cc or not include:
        pytest.skip("needs cc and the CUDA toolkit's cuda.h to build the fake driver")
    out = tmp_path_factory.mktemp("fakecuda")
    # No soname, and not named libcuda.so.1: the loader never hands it to
    # a later dlopen("libcuda.so.1") (torch's, in the GPU tests).
    src, lib = out / "fake_libcuda.c", out / "libfakecuda.so"
    src.write_text(FAKE_LIBCUDA)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-I", include,
                    "-o", str(lib), str(src)], check=True, capture_output=True)
    ctl = ctypes.CDLL(str(lib))
    ctl.fake_log.restype = ctypes.c_char_p
    ctl.fake_count.restype = ctypes.c_long
    ctl.fake_count.argtypes = [ctypes.c_char_p]
    ctl.fake_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    ctl.fake_set_current.argtypes = [ctypes.c_size_t]
    ctl.fake_layout.restype = ctypes.c_long
    ctl.fake_layout.argtypes = [ctypes.c_char_p]
    return str(lib), ctl


@pytest.fixture
def fake(fake_libcuda, monkeypatch):
    path, ctl = fake_libcuda
    monkeypatch.setattr(_cuda, "LIBCUDA", path)
    ctl.fake_reset(1, 1, 1)
    return ctl


def held(ctl):
    return {k: ctl.fake_count(k.encode())
            for k in ("ctx_refs", "handles", "mapped", "reserved", "bad")}


NOTHING_HELD = {"ctx_refs": 0, "handles": 0, "mapped": 0, "reserved": 0, "bad": 0}


CHUNK_MEMFD = "rkpy-fake-cuda-chunk"


def memfds(sizes):
    fds = []
    for size in sizes:
        fd = os.memfd_create(CHUNK_MEMFD)
        os.ftruncate(fd, size)
        fds.append(fd)
    return fds


def cuda_reply(spec=ODD, chunks=ODD_CHUNKS, capacity=7, per_chunk=3, device=0):
    return pb.AttachResponse(
        backend="cuda", page_bytes=spec.page_bytes, pages_per_chunk=per_chunk,
        capacity_pages=capacity, device=device,
        chunks=[pb.AttachChunk(bytes=b) for b in chunks]).SerializeToString()


def fake_attach(tmp_path, reply=None, chunks=ODD_CHUNKS):
    """attach() against a fake attach server that sends memfds of `chunks`
    sizes; returns the pool, or raises what attach raised. Either way it
    checks that attach closed every descriptor it received."""
    fds = memfds(chunks)
    server = FakeAttachServer(str(tmp_path / "cuda.attach.sock"),
                              reply or cuda_reply(chunks=chunks), fds)
    try:
        return radixkv.attach(server.path, "s", timeout=5)
    finally:
        server.close()
        assert memfds_named(CHUNK_MEMFD) == len(fds)  # only ours are left
        for fd in fds:
            os.close(fd)


def test_fake_driver_maps_the_chunks_back_to_back(fake, tmp_path):
    fake.fake_set_current(0xABC)  # someone else's context is current
    pool = fake_attach(tmp_path)  # which checks that the descriptors were closed
    assert isinstance(pool, CudaPool) and pool.backend == "cuda"
    assert (pool.device, pool.page_bytes, pool.capacity_pages) == (0, ODD.page_bytes, 7)
    assert tuple(pool.chunk_bytes) == tuple(ODD_CHUNKS)
    assert fake.fake_count(b"current") == 0xABC  # restored
    assert held(fake) == {"ctx_refs": 1, "handles": 3, "mapped": 3,
                          "reserved": sum(ODD_CHUNKS), "bad": 0}
    log = fake.fake_log().decode().splitlines()
    calls = [line.split()[0] for line in log]
    assert calls == (["cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute",
                      "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent",
                      "cuCtxSetCurrent", "cuMemGetAllocationGranularity"] +
                     ["cuMemImportFromShareableHandle"] * 3 + ["cuMemAddressReserve"] +
                     ["cuMemMap", "cuMemSetAccess"] * 3 + ["cuCtxSetCurrent"]), log
    # The fake saw each memfd, in order, through the fd passed as void*.
    assert [line.split()[1] for line in log if line.startswith("cuMemImport")] == \
        [f"size={b}" for b in ODD_CHUNKS]
    bases = [FAKE_BASE, FAKE_BASE + 6 * MIB, FAKE_BASE + 12 * MIB]
    assert [line.split()[1:3] for line in log if line.startswith("cuMemMap")] == \
        [[hex(b), str(n)] for b, n in zip(bases, ODD_CHUNKS)]
    assert log[-1] == "cuCtxSetCurrent 0xabc"

    for p in range(7):
        c, i = divmod(p, 3)
        assert pool.page_address(p) == bases[c] + i * ODD.page_bytes
    with pytest.raises(IndexError):
        pool.page_address(7)
    a = pool.page_array(4, ODD)
    assert isinstance(a, CudaArray) and a.nbytes == ODD.page_bytes
    assert a.__cuda_array_interface__ == {
        "shape": ODD.page_shape, "typestr": "<f2", "data": (bases[1] + ODD.page_bytes, False),
        "strides": None, "version": 3}
    bf16 = pool.page_array(6, dataclasses.replace(ODD, dtype="bf16"))
    assert bf16.__cuda_array_interface__["typestr"] == "<u2"  # bf16 bits, as on the host
    raw = pool.page(0).__cuda_array_interface__
    assert (raw["shape"], raw["typestr"], raw["data"]) == \
        ((ODD.page_bytes,), "|u1", (bases[0], False))
    with pytest.raises(ValueError):
        pool.page_array(0, radixkv.NamespaceSpec(model="x", num_layers=1, num_kv_heads=1,
                                                 head_dim=8, page_size=4, dtype="fp16"))

    # close() leaves the mapping to the views still alive; the last one unmaps.
    fake.fake_set_current(0)
    pool.close()
    with pytest.raises(ValueError):
        pool.page_address(0)
    assert held(fake)["mapped"] == 3
    del a, bf16
    gc.collect()
    assert held(fake) == NOTHING_HELD
    assert fake.fake_count(b"current") == 0
    tail = fake.fake_log().decode().splitlines()[-11:]
    assert [line.split()[0] for line in tail] == (
        ["cuCtxGetCurrent", "cuCtxSetCurrent"] + ["cuMemUnmap"] * 3 + ["cuMemRelease"] * 3 +
        ["cuMemAddressFree", "cuCtxSetCurrent", "cuDevicePrimaryCtxRelease"]), tail
    assert tail[1] == "cuCtxSetCurrent 0x1064" and tail[-2] == "cuCtxSetCurrent 0x0"


def test_struct_layouts_match_cuda_h(fake):
    prop, access = _cuda._MemAllocationProp, _cuda._MemAccessDesc
    assert {k: fake.fake_layout(k.encode()) for k in (
        "prop", "prop.location", "prop.win32HandleMetaData", "prop.allocFlags",
        "access", "access.flags")} == {
        "prop": ctypes.sizeof(prop), "prop.location": prop.location.offset,
        "prop.win32HandleMetaData": prop.win32HandleMetaData.offset,
        "prop.allocFlags": prop.allocFlags.offset, "access": ctypes.sizeof(access),
        "access.flags": access.flags.offset}


@pytest.mark.parametrize("call, nth, result, code", [
    ("cuInit", 1, 100, "FAILED_PRECONDITION"),
    ("cuDeviceGetCount", 1, 3, "FAILED_PRECONDITION"),
    ("cuDeviceGet", 1, 101, "FAILED_PRECONDITION"),
    ("cuDevicePrimaryCtxRetain", 1, 46, "FAILED_PRECONDITION"),
    ("cuMemGetAllocationGranularity", 1, 1, "INTERNAL"),
    ("cuMemImportFromShareableHandle", 2, 1, "INTERNAL"),
    ("cuMemAddressReserve", 1, 2, "RESOURCE_EXHAUSTED"),
    ("cuMemMap", 2, 2, "RESOURCE_EXHAUSTED"),
    ("cuMemSetAccess", 3, 999, "INTERNAL"),
])
def test_fake_driver_failure_releases_everything(fake, tmp_path, call, nth, result, code):
    fake.fake_fail(call.encode(), nth, result)
    with pytest.raises(radixkv.AttachError) as e:
        fake_attach(tmp_path)
    assert e.value.code.name == code, e.value
    assert e.value.message.startswith("cuda pool: ") and call in e.value.message, e.value
    assert f"({result})" in e.value.message
    if result == 2:
        assert "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory" in e.value.message
    assert held(fake) == NOTHING_HELD, fake.fake_log().decode()
    assert fake.fake_count(b"current") == 0


def test_fake_driver_device_checks(fake, tmp_path):
    fake.fake_reset(0, 1, 1)
    with pytest.raises(radixkv.AttachError) as e:
        fake_attach(tmp_path)
    assert "pool is on device 0 but this process sees 0 CUDA device(s)" in e.value.message
    fake.fake_reset(1, 0, 1)
    with pytest.raises(radixkv.AttachError) as e:
        fake_attach(tmp_path)
    assert "does not support virtual memory management" in e.value.message
    assert e.value.code.name == "FAILED_PRECONDITION"
    assert held(fake) == NOTHING_HELD
    # A chunk that is no multiple of the granularity: refused before import.
    fake.fake_reset(1, 1, 1)
    spec = radixkv.NamespaceSpec(model="m", num_layers=2, num_kv_heads=2, head_dim=8,
                                 page_size=4, dtype="fp16")
    with pytest.raises(radixkv.AttachError) as e:
        fake_attach(tmp_path, cuda_reply(spec, [4096], 8, 8), [4096])
    assert e.value.code.name == "INVALID_ARGUMENT"
    assert "chunks[0].bytes=4096 is not a multiple of the allocation granularity" in e.value.message
    assert "cuMemImport" not in fake.fake_log().decode()
    assert held(fake) == NOTHING_HELD
    # A reply that names no device is no mappable cuda pool.
    with pytest.raises(radixkv.AttachError) as e:
        fake_attach(tmp_path, cuda_reply(device=-1))
    assert e.value.code.name == "INVALID_ARGUMENT"


STUB_CHILD = r"""
import json, os, sys
import radixkv
from radixkv import _cuda
fd = os.memfd_create("rkpy-stub-chunk")
os.ftruncate(fd, 2 << 20)
before = len(os.listdir("/proc/self/fd"))
try:
    _cuda.map_chunks(0, [2 << 20], [fd], library=sys.argv[1])
    out = {"code": None}
except radixkv.AttachError as e:
    out = {"code": e.code.name, "message": e.message}
out["leaked"] = len(os.listdir("/proc/self/fd")) - before
print(json.dumps(out))
"""


def test_stub_libcuda_is_refused_clearly():
    # The toolkit's stub answers every call with CUDA_ERROR_STUB_LIBRARY. Its
    # soname is libcuda.so.1, so it is loaded in a child process: loaded
    # here, it would be what a later dlopen("libcuda.so.1") gets.
    include = _cuda_include()
    stub = include and os.path.join(os.path.dirname(include), "lib64", "stubs", "libcuda.so")
    if not stub or not os.path.exists(stub):
        pytest.skip("no CUDA toolkit stub libcuda.so here")
    p = subprocess.run([sys.executable, "-c", STUB_CHILD, stub], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["code"] == "FAILED_PRECONDITION" and out["leaked"] == 0, out
    assert out["message"].startswith(f"cuda pool: no usable CUDA driver/device ({stub}): cuInit: ")
    assert "CUDA_ERROR_STUB_LIBRARY (34)" in out["message"]


# -- with a GPU --------------------------------------------------------------

# A realistic small fp16 layout: 4 layers x 2 x 4 KV heads x 16 x 64 = 64 KiB.
GPU_SPEC = radixkv.NamespaceSpec(model="py-cuda-gpu", num_layers=4, num_kv_heads=4,
                                 head_dim=64, page_size=16, dtype="fp16")

# The second process: its own Client on the same prompt; prints the SHA-256
# of each cached page it reads through torch, and with `write` fills each of
# its new pages with 100 + j and commits them.
PEER = r"""
import hashlib, json, sys
import torch
import radixkv
sock, tokens, write = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
spec = radixkv.NamespaceSpec(**json.loads(sys.argv[4]))
with radixkv.Client(sock, namespace=spec, attach_pool=True, initial_wait=30) as c:
    pool = c.pool
    assert pool is not None and pool.backend == "cuda", c.state()
    with c.acquire(tokens) as lease:
        ts = [lease.page_tensor(i) for i in range(lease.matched_blocks)]
        out = {"matched": lease.matched_blocks, "pages": lease.pages,
               "zero_copy": all(t.data_ptr() == pool.page_address(p)
                                for t, p in zip(ts, lease.pages)),
               "sha": [hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest() for t in ts]}
        if write:
            for j in range(lease.new_blocks):
                lease.page_tensor(lease.matched_blocks + j).fill_(100 + j)
            torch.cuda.synchronize()
            lease.commit()
print(json.dumps(out))
"""


def run_peer(d, tokens, write=False, spec=GPU_SPEC):
    p = subprocess.run(
        [sys.executable, "-c", PEER, d.sock, json.dumps(tokens), "1" if write else "0",
         json.dumps(spec.to_dict())],
        capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def sha(t):
    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()


@pytest.fixture
def torch_cuda():
    """torch with a usable CUDA device and libcuda.so.1, or a skip."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no usable CUDA device")
    try:
        ctypes.CDLL(_cuda.LIBCUDA)
    except OSError as e:
        pytest.skip(f"{_cuda.LIBCUDA} cannot be loaded: {e}")
    return torch


NO_CUDA_BUILD = "built without CUDA"


def cuda_daemon(daemon_factory, pool):
    """A radixkvd serving `pool`, or a skip where this radixkvd was built
    without CUDA (it then refuses the pool at start or at the first
    namespace)."""
    try:
        return daemon_factory(pool=pool)
    except RuntimeError as e:
        if NO_CUDA_BUILD in str(e):
            pytest.skip(f"radixkvd was {NO_CUDA_BUILD}")
        raise


def cuda_client(d):
    try:
        return radixkv.Client(d.sock, namespace=GPU_SPEC, attach_pool=True, initial_wait=30)
    except radixkv.FailedPrecondition as e:
        if NO_CUDA_BUILD in e.message:
            pytest.skip(f"radixkvd: {e.message}")
        raise


def test_gpu_pages_are_shared_with_a_second_process(torch_cuda, daemon_factory):
    torch = torch_cuda
    d = cuda_daemon(daemon_factory, "cuda,device=0,bytes=256MiB")
    tokens = list(range(1, 16 * 6 + 1))
    with cuda_client(d) as c:
        pool = c.pool
        assert isinstance(pool, CudaPool) and pool.device == 0, c.state()
        assert pool.page_bytes == GPU_SPEC.page_bytes == 64 * 1024
        want = []
        with c.acquire(tokens, max_new_blocks=4) as lease:
            assert lease.new_blocks == 4
            for j in range(4):
                t = lease.page_tensor(j)
                assert t.is_cuda and t.dtype == torch.float16
                assert tuple(t.shape) == GPU_SPEC.page_shape
                assert t.data_ptr() == pool.page_address(lease.pages[j])  # no copy
                via_cai = torch.as_tensor(lease.page_array(j), device="cuda")
                assert via_cai.data_ptr() == t.data_ptr()
                ref = (torch.arange(t.numel(), dtype=torch.float32) * 0.25 + j) % 1000
                t.copy_(ref.view(t.shape).to(torch.float16))
                want.append(sha(ref.to(torch.float16)))
            torch.cuda.synchronize()
            lease.commit()
        peer = run_peer(d, tokens, write=True)
        assert peer["matched"] == 4 and peer["pages"][:4] == lease.pages
        assert peer["zero_copy"] and peer["sha"] == want
        with c.acquire(tokens) as hit:
            assert hit.matched_blocks == 6
            for j in (4, 5):
                assert bool((hit.page_tensor(j) == 100 + (j - 4)).all())
    assert_no_leaks(d, sessions=0)


def test_gpu_pool_of_many_chunks(torch_cuda, daemon_factory):
    torch = torch_cuda
    d = cuda_daemon(daemon_factory, "cuda,device=0,bytes=256MiB,chunk_bytes=2MiB")
    with cuda_client(d) as c:
        pool = c.pool
        assert pool.pages_per_chunk == 32 and len(pool.chunk_bytes) == 128
        tokens = list(range(1, 16 * 100 + 1))
        with c.acquire(tokens) as lease:
            assert lease.new_blocks == 100
            for j in range(100):
                lease.page_tensor(j).fill_(j)
            torch.cuda.synchronize()
            lease.commit()
        assert len({p // pool.pages_per_chunk for p in lease.pages}) >= 3
        peer = run_peer(d, tokens)
        assert peer["matched"] == 100 and peer["zero_copy"]
        assert peer["sha"] == [sha(torch.full(GPU_SPEC.page_shape, j, dtype=torch.float16))
                               for j in range(100)]
    assert_no_leaks(d, sessions=0)


def test_gpu_driver_refuses_a_host_descriptor(torch_cuda, tmp_path):
    # A cuda reply whose descriptor is a memfd: the real driver's import
    # fails, attach raises, and the received descriptor is closed (which
    # fake_attach checks).
    with pytest.raises(radixkv.AttachError) as e:
        fake_attach(tmp_path, cuda_reply(chunks=[2 * MIB], capacity=1, per_chunk=1), [2 * MIB])
    assert e.value.message.startswith("cuda pool: "), e.value
