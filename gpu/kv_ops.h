// File: gpu/kv_ops.h
//
// Page kernels: write_kv (scatter new K/V into pool pages) and copy_pages
// (batched page copy, e.g. between a device pool and a host pool), each with
// a CPU implementation (the test oracle; plain C++, multi-threaded for large
// inputs) and a CUDA implementation (compiled when the build has CUDA).
//
// Page layout (gpu/page_layout.h, docs/CONTRACTS.md §2): one contiguous
// page per block, page -> layer -> {K, V} -> kv_head -> slot -> dim.
//
// Source layout of write_kv (KvSource), per tensor K and V:
//
//   src[layer][token][kv_head][dim]      element (l, t, h, d) at
//   ((l * layer_stride_tokens + t) * num_kv_heads + h) * head_dim + d
//
// i.e. a model's per-layer K (or V) projection output for consecutive
// tokens, all layers in one buffer with `layer_stride_tokens` tokens between
// layers (a per-request cache sized for more tokens than are written passes
// its capacity here). Token t of the source goes to page pages[t / page_size]
// at slot t % page_size; the first token lands in slot 0 of pages[0].
//
// Element types (PageGeometry::dtype): with DType::kUnspecified the kernels
// move elements as opaque `elem_bytes`-sized values in the source's own
// encoding; nothing is converted. With a typed geometry the source (and
// ReadKv's destination) is fp32 whatever the page's dtype: kFloat32 copies,
// kFloat16 / kBFloat16 round each element, and the scaled dtypes
// (kFloat8E4M3, kFloat8E5M2, kInt8) compute one scale per (page, layer,
// K|V, head) run from the slots this call writes, store it in the page's
// scale area and encode x / scale (gpu/kv_ops_quant.h; docs/CONTRACTS.md
// §2.1). ReadKv decodes and multiplies by the scale. A page of a scaled
// dtype is written by one call (its scales cover that call's slots); the
// CPU and CUDA write_kv produce bit-identical pages.
//
// Addressing: the CPU functions take either resolved page addresses (one per
// page; this covers pools mapped in several chunks) or a contiguous base plus
// page ids (page p at base + p * page_bytes). The CUDA functions take a
// contiguous device base (a cuda pool maps all chunks into one VA range) plus
// page ids, which travel as kernel parameters (no device allocation).
//
// Errors: INVALID_ARGUMENT naming the field and the limit; nothing is written
// when an argument is rejected. CUDA: FAILED_PRECONDITION when the build has
// no CUDA, INTERNAL with the CUDA error text when a launch fails.
//
// Thread safety: the functions are reentrant. Concurrent calls must not
// write the same pages (the lease protocol guarantees this: a WRITING page
// belongs to one lease). CUDA functions are asynchronous on `stream`; the
// caller synchronises the stream before it commits the pages
// (docs/CONTRACTS.md §2, "Who may touch a page").
#ifndef RADIXKV_GPU_KV_OPS_H_
#define RADIXKV_GPU_KV_OPS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "gpu/page_layout.h"

namespace radixkv::gpu {

// New K/V for `n_tokens` consecutive tokens, all layers (layout above).
// Pointers are borrowed for the duration of the call (CUDA: until the stream
// has executed the launch).
struct KvSource {
  const void* k = nullptr;
  const void* v = nullptr;
  uint32_t n_tokens = 0;
  // Tokens between consecutive layers in k and v; 0 means n_tokens.
  // REQUIRES: 0 or >= n_tokens.
  uint32_t layer_stride_tokens = 0;
};

// Destination of a gather (ReadKv): same layout as KvSource.
struct KvDest {
  void* k = nullptr;
  void* v = nullptr;
  uint32_t n_tokens = 0;
  uint32_t layer_stride_tokens = 0;
};

// Number of pages `n_tokens` tokens occupy: ceil(n_tokens / page_size).
inline uint64_t PagesForTokens(const PageGeometry& geom, uint64_t n_tokens) {
  return geom.page_size == 0 ? 0
                             : (n_tokens + geom.page_size - 1) / geom.page_size;
}

// ---------------------------------------------------------------------------
// CPU implementations (the oracles).
// ---------------------------------------------------------------------------

// Scatters src's K/V for every layer into `pages` (one address per block, in
// block order). REQUIRES (else INVALID_ARGUMENT): geom.valid();
// pages.size() == PagesForTokens(geom, src.n_tokens); non-null pointers.
// Slots past n_tokens in the last page are left untouched.
absl::Status WriteKv(const PageGeometry& geom, const KvSource& src,
                     absl::Span<void* const> pages);

// As above with pages named by id in a contiguous pool of `capacity_pages`
// pages at `pool_base`; every id must be < capacity_pages.
absl::Status WriteKv(const PageGeometry& geom, const KvSource& src,
                     void* pool_base, uint64_t capacity_pages,
                     absl::Span<const uint64_t> page_ids);

// The inverse of WriteKv: gathers `dst.n_tokens` tokens' K/V from `pages`.
absl::Status ReadKv(const PageGeometry& geom, absl::Span<const void* const> pages,
                    const KvDest& dst);

// Copies page_bytes bytes from src[i] to dst[i] for every i. REQUIRES:
// src.size() == dst.size(); no null pointers; no dst page overlapping
// another dst page or a src page (checked only for equal addresses).
absl::Status CopyPages(uint64_t page_bytes, absl::Span<const void* const> src,
                       absl::Span<void* const> dst);

// Copies page src_ids[i] of the pool at src_base into page dst_ids[i] of the
// pool at dst_base (the two pools may be the same). Ids are checked against
// each pool's capacity.
absl::Status CopyPages(uint64_t page_bytes, const void* src_base,
                       uint64_t src_capacity_pages,
                       absl::Span<const uint64_t> src_ids, void* dst_base,
                       uint64_t dst_capacity_pages,
                       absl::Span<const uint64_t> dst_ids);

// ---------------------------------------------------------------------------
// CUDA implementations. Device (or device-accessible, e.g. mapped pinned
// host) pointers; `stream` is a cudaStream_t (nullptr: the legacy default
// stream). Asynchronous; same argument checks as the CPU versions.
// ---------------------------------------------------------------------------

// Number of CUDA devices usable by the kernels: 0 when the build has no CUDA,
// no driver is installed or any CUDA error occurs (never negative).
int CudaKernelDeviceCount();

absl::Status WriteKvCuda(const PageGeometry& geom, const KvSource& src,
                         void* pool_base, uint64_t capacity_pages,
                         absl::Span<const uint64_t> page_ids, void* stream);

absl::Status CopyPagesCuda(uint64_t page_bytes, const void* src_base,
                           uint64_t src_capacity_pages,
                           absl::Span<const uint64_t> src_ids, void* dst_base,
                           uint64_t dst_capacity_pages,
                           absl::Span<const uint64_t> dst_ids, void* stream);

// Blocks until `stream` has finished its work; INTERNAL on a CUDA error.
absl::Status CudaKernelStreamSync(void* stream);

}  // namespace radixkv::gpu

#endif  // RADIXKV_GPU_KV_OPS_H_
