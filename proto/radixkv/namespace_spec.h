// File: proto/radixkv/namespace_spec.h
//
// The one conversion between the wire's radixkv.v1.Namespace and the index's
// NamespaceSpec (radix/block_key.h), shared by radixkvd and the client
// library so both hash exactly the same fields. What a namespace's pages
// look like (page bytes, scale area, serveable cross-layer layouts) is
// gpu/namespace_geometry.h's.
//
// Thread safety: pure functions.
#ifndef RADIXKV_PROTO_RADIXKV_NAMESPACE_SPEC_H_
#define RADIXKV_PROTO_RADIXKV_NAMESPACE_SPEC_H_

#include "radix/block_key.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv {

// Copies every field; validation (non-zero layout, known dtype, tp_rank <
// tp_size, string limits) is the caller's.
void NamespaceToProto(const NamespaceSpec& spec, v1::Namespace* out);
v1::Namespace NamespaceToProto(const NamespaceSpec& spec);

// Copies every field; the wire's tp_size 0 reads as 1. cross_layer is set
// exactly when the message has one.
NamespaceSpec NamespaceFromProto(const v1::Namespace& ns);

}  // namespace radixkv

#endif  // RADIXKV_PROTO_RADIXKV_NAMESPACE_SPEC_H_
