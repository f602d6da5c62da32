// File: proto/radixkv/namespace_spec.h
//
// The one conversion between the wire's radixkv.v1.Namespace and the index's
// NamespaceSpec (radix/block_key.h), shared by radixkvd and the client
// library so both hash exactly the same fields.
//
// Thread safety: pure functions.
#ifndef RADIXKV_PROTO_RADIXKV_NAMESPACE_SPEC_H_
#define RADIXKV_PROTO_RADIXKV_NAMESPACE_SPEC_H_

#include <cstdint>

#include "gpu/page_layout.h"
#include "radix/block_key.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv {

// Copies every field; validation (non-zero layout, known dtype, tp_rank <
// tp_size, string limits) is the caller's.
void NamespaceToProto(const NamespaceSpec& spec, v1::Namespace* out);
v1::Namespace NamespaceToProto(const NamespaceSpec& spec);

// Copies every field; the wire's tp_size 0 reads as 1.
NamespaceSpec NamespaceFromProto(const v1::Namespace& ns);

// Page sizes (docs/CONTRACTS.md §2). The page geometry of `spec`'s layout:
// dtype and elem_bytes from spec.dtype (KvDType has DType's values). Not
// valid() when the layout is incomplete.
PageGeometry NamespaceGeometry(const NamespaceSpec& spec);

// Bytes of one page of `spec`'s layout, scale area included:
//   num_layers x 2 x num_kv_heads x page_size x head_dim x dtype bytes
// for fp32, fp16 and bf16, and for fp8_e4m3, fp8_e5m2 and int8 that rounded
// up to a multiple of 16 plus num_layers x 2 x num_kv_heads x 4 (one fp32
// scale per layer, K|V and KV head). 0 when the layout is incomplete. This
// is the size a pool holding the namespace's pages must use.
uint64_t NamespacePageBytes(const NamespaceSpec& spec);

// Bytes of a page's scale area (alignment padding included): 0 for
// unscaled dtypes and incomplete layouts.
uint64_t NamespaceScaleBytes(const NamespaceSpec& spec);

}  // namespace radixkv

#endif  // RADIXKV_PROTO_RADIXKV_NAMESPACE_SPEC_H_
