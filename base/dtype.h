// File: base/dtype.h
//
// DType: the one element type of cached K/V. The index hashes it into a
// namespace (radix/block_key.h), the page layout and the kernels encode
// pages with it (gpu/page_layout.h), and the wire carries it as
// radixkv.v1.DType; the numeric values are the wire's and never change,
// since they enter the namespace hash.
//
// kUnspecified (0) names no encoding: a namespace with it has no page size,
// and a page geometry with it is opaque (its elements are elem_bytes-sized
// values the kernels move without looking at them). Every other value is an
// encoding that the kernels convert from and to fp32.
//
// Header-only and dependency-free; every function is constexpr and usable
// from host and CUDA device code (RADIXKV_HD).
//
// Thread safety: pure functions.
#ifndef RADIXKV_BASE_DTYPE_H_
#define RADIXKV_BASE_DTYPE_H_

#include <cstdint>

// Marks a function callable from host and device code under nvcc and plain
// inline otherwise. Defined once for every radixkv header that needs it.
#ifndef RADIXKV_HD
#if defined(__CUDACC__)
#define RADIXKV_HD __host__ __device__ __forceinline__
#else
#define RADIXKV_HD inline
#endif
#endif

namespace radixkv {

// The values of radixkv.v1.DType.
enum class DType : uint32_t {
  kUnspecified = 0,
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kFloat8E4M3 = 4,
  kFloat8E5M2 = 5,
  kInt8 = 6,
};

// Bytes per element of `d`; 0 for kUnspecified or a value outside the enum.
RADIXKV_HD constexpr uint32_t DTypeBytes(DType d) {
  switch (d) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kInt8:
      return 1;
    case DType::kUnspecified:
      break;
  }
  return 0;
}

// True for the encodings whose pages carry one fp32 scale per (layer, K|V,
// kv_head) run: fp8 E4M3, fp8 E5M2 and int8.
RADIXKV_HD constexpr bool DTypeScaled(DType d) {
  return d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2 ||
         d == DType::kInt8;
}

// The short name radixkv's command lines and reports use: "fp32", "fp16",
// "bf16", "fp8_e4m3", "fp8_e5m2", "int8"; "unspecified" for kUnspecified and
// nullptr for a value outside the enum.
RADIXKV_HD constexpr const char* DTypeName(DType d) {
  switch (d) {
    case DType::kUnspecified:
      return "unspecified";
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat8E4M3:
      return "fp8_e4m3";
    case DType::kFloat8E5M2:
      return "fp8_e5m2";
    case DType::kInt8:
      return "int8";
  }
  return nullptr;
}

}  // namespace radixkv

#endif  // RADIXKV_BASE_DTYPE_H_
