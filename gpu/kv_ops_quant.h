// File: gpu/kv_ops_quant.h
//
// Element encodings of typed pages (PageGeometry::dtype, gpu/page_layout.h)
// and the per-run scale rule, shared by the CPU kernels (kv_ops.cc,
// attention.cc) and the CUDA kernels (kv_ops.cu, attention.cu): both call
// these same functions, so a page written on either is bit-identical.
// Header-only, host and device; integer arithmetic plus one IEEE division
// (and rint for int8), no library conversions.
//
// Encodings (docs/CONTRACTS.md §2.1):
//   fp16      IEEE binary16, round to nearest even, overflow to +-inf.
//   bf16      the upper 16 bits of the fp32, round to nearest even.
//   fp8_e4m3  OCP E4M3 (bias 7, no inf, 0x7f/0xff NaN, max 448), round to
//             nearest even, saturating to +-448.
//   fp8_e5m2  OCP E5M2 (bias 15, max 57344), round to nearest even,
//             saturating to +-57344.
//   int8      two's complement, round to nearest even, clamped to
//             [-127, 127].
// Scaled dtypes (fp8, int8): for each (page, layer, K|V, head) run,
//   amax  = max |x| over the run's written slots,
//   scale = amax / QMAX (fp32 division; QMAX 448, 57344 or 127),
//   code  = encode(x / scale) (fp32 division; 0 when scale is 0),
//   x'    = decode(code) * scale.
// Inputs are finite fp32 values; NaN encodes as NaN (int8: unspecified).
//
// Thread safety: pure functions.
#ifndef RADIXKV_GPU_KV_OPS_QUANT_H_
#define RADIXKV_GPU_KV_OPS_QUANT_H_

#include <cstdint>

#include "gpu/page_layout.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#include <cstring>
#endif

namespace radixkv::gpu::quant {

RADIXKV_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

RADIXKV_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

RADIXKV_HD float RoundToEven(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::rint(x);  // the default rounding mode: to nearest even
#endif
}

// Rounds a finite, non-negative fp32 (its bits `a`) to a binary format with
// kMan mantissa bits and exponent bias kBias, to nearest even. Returns the
// magnitude code (biased exponent << kMan | mantissa), which may exceed the
// format's largest finite code; the caller saturates or overflows.
template <int kMan, int kBias>
RADIXKV_HD uint32_t RoundMagnitude(uint32_t a) {
  const int e = static_cast<int>(a >> 23) - 127;
  if (e >= 1 - kBias) {  // normal in the target format
    constexpr uint32_t kShift = 23 - kMan;
    uint32_t t = (static_cast<uint32_t>(e + kBias) << kMan) |
                 ((a & 0x7fffffu) >> kShift);
    const uint32_t rem = a & ((1u << kShift) - 1);
    constexpr uint32_t kHalf = 1u << (kShift - 1);
    if (rem > kHalf || (rem == kHalf && (t & 1u))) ++t;  // may carry: fine
    return t;
  }
  // Subnormal in the target: units of 2^(1 - kBias - kMan).
  if ((a >> 23) == 0) return 0;  // fp32 subnormals are far below any unit
  const uint32_t full = (a & 0x7fffffu) | 0x800000u;
  const int r = 24 - kBias - kMan - e;  // >= 24 - kMan
  if (r >= 25) return 0;                // below half a unit
  uint32_t q = full >> r;
  const uint32_t rem = full & ((1u << r) - 1);
  const uint32_t half = 1u << (r - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return q;  // 1 << kMan: the smallest normal, encoded correctly
}

// Inverse of RoundMagnitude for a finite magnitude code.
template <int kMan, int kBias>
RADIXKV_HD float DecodeMagnitude(uint32_t t) {
  const uint32_t exp = t >> kMan;
  const uint32_t man = t & ((1u << kMan) - 1);
  if (exp == 0) {
    // man * 2^(1 - kBias - kMan): exact.
    return static_cast<float>(man) *
           BitsFloat(static_cast<uint32_t>(127 + 1 - kBias - kMan) << 23);
  }
  return BitsFloat((static_cast<uint32_t>(static_cast<int>(exp) - kBias + 127)
                    << 23) |
                   (man << (23 - kMan)));
}

// ---- fp16 ------------------------------------------------------------------
RADIXKV_HD uint16_t EncodeF16(float x) {
  const uint32_t u = FloatBits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  uint32_t t = RoundMagnitude<10, 15>(a);
  if (t > 0x7bffu) t = 0x7c00u;  // overflow: inf
  return static_cast<uint16_t>(sign | t);
}
RADIXKV_HD float DecodeF16(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t t = h & 0x7fffu;
  if (t >= 0x7c00u) {
    return BitsFloat(sign | 0x7f800000u | (uint32_t{t & 0x3ffu} << 13));
  }
  return BitsFloat(sign | FloatBits(DecodeMagnitude<10, 15>(t)));
}

// ---- bf16 ------------------------------------------------------------------
RADIXKV_HD uint16_t EncodeBF16(float x) {
  const uint32_t u = FloatBits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  }
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
RADIXKV_HD float DecodeBF16(uint16_t b) { return BitsFloat(uint32_t{b} << 16); }

// ---- fp8 E4M3 --------------------------------------------------------------
RADIXKV_HD uint8_t EncodeE4M3(float x) {
  const uint32_t u = FloatBits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  uint32_t t = RoundMagnitude<3, 7>(a);
  if (t > 0x7eu) t = 0x7eu;  // saturate at 448
  return static_cast<uint8_t>(sign | t);
}
RADIXKV_HD float DecodeE4M3(uint8_t c) {
  const uint32_t sign = uint32_t{c & 0x80u} << 24;
  const uint32_t t = c & 0x7fu;
  if (t == 0x7fu) return BitsFloat(0x7fc00000u | sign);
  return BitsFloat(sign | FloatBits(DecodeMagnitude<3, 7>(t)));
}

// ---- fp8 E5M2 --------------------------------------------------------------
RADIXKV_HD uint8_t EncodeE5M2(float x) {
  const uint32_t u = FloatBits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  uint32_t t = RoundMagnitude<2, 15>(a);
  if (t > 0x7bu) t = 0x7bu;  // saturate at 57344
  return static_cast<uint8_t>(sign | t);
}
RADIXKV_HD float DecodeE5M2(uint8_t c) {
  const uint32_t sign = uint32_t{c & 0x80u} << 24;
  const uint32_t t = c & 0x7fu;
  if (t >= 0x7cu) {
    return BitsFloat(sign | 0x7f800000u | (t == 0x7cu ? 0u : 0x400000u));
  }
  return BitsFloat(sign | FloatBits(DecodeMagnitude<2, 15>(t)));
}

// ---- int8 ------------------------------------------------------------------
RADIXKV_HD int8_t EncodeI8(float x) {
  float r = RoundToEven(x);
  r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
  return static_cast<int8_t>(r);
}
RADIXKV_HD float DecodeI8(int8_t c) { return static_cast<float>(c); }

// ---- by dtype ----------------------------------------------------------------

// QMAX of a scaled dtype (the value amax maps to); 1 for unscaled dtypes.
RADIXKV_HD float QuantMax(DType t) {
  return t == DType::kFloat8E4M3   ? 448.0f
         : t == DType::kFloat8E5M2 ? 57344.0f
         : t == DType::kInt8       ? 127.0f
                                   : 1.0f;
}

// The scale of a run whose largest magnitude is `amax`.
RADIXKV_HD float ScaleForAmax(DType t, float amax) {
  return amax / QuantMax(t);
}

// Stores x (already divided by the run's scale for scaled dtypes) at element
// `i` of `dst` (elements of DTypeBytes(t) bytes). REQUIRES: t != kUnspecified.
RADIXKV_HD void EncodeElem(DType t, float x, void* dst, uint64_t i) {
  switch (t) {
    case DType::kFloat32:
      static_cast<float*>(dst)[i] = x;
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(dst)[i] = EncodeF16(x);
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(dst)[i] = EncodeBF16(x);
      break;
    case DType::kFloat8E4M3:
      static_cast<uint8_t*>(dst)[i] = EncodeE4M3(x);
      break;
    case DType::kFloat8E5M2:
      static_cast<uint8_t*>(dst)[i] = EncodeE5M2(x);
      break;
    case DType::kInt8:
      static_cast<int8_t*>(dst)[i] = EncodeI8(x);
      break;
    default:
      break;
  }
}

// Element `i` of `src` decoded (not yet multiplied by a scale).
RADIXKV_HD float DecodeElem(DType t, const void* src, uint64_t i) {
  switch (t) {
    case DType::kFloat32:
      return static_cast<const float*>(src)[i];
    case DType::kFloat16:
      return DecodeF16(static_cast<const uint16_t*>(src)[i]);
    case DType::kBFloat16:
      return DecodeBF16(static_cast<const uint16_t*>(src)[i]);
    case DType::kFloat8E4M3:
      return DecodeE4M3(static_cast<const uint8_t*>(src)[i]);
    case DType::kFloat8E5M2:
      return DecodeE5M2(static_cast<const uint8_t*>(src)[i]);
    case DType::kInt8:
      return DecodeI8(static_cast<const int8_t*>(src)[i]);
    default:
      return 0.0f;
  }
}

// A one-byte code of fp8 E4M3, fp8 E5M2 or int8 decoded; 0 for other dtypes.
RADIXKV_HD float DecodeByteCode(DType t, uint8_t c) {
  switch (t) {
    case DType::kFloat8E4M3:
      return DecodeE4M3(c);
    case DType::kFloat8E5M2:
      return DecodeE5M2(c);
    case DType::kInt8:
      return DecodeI8(static_cast<int8_t>(c));
    default:
      return 0.0f;
  }
}

// The value stored for x in a run with `scale` (scaled dtypes) or as is.
RADIXKV_HD float Scaled(DType t, float x, float scale) {
  if (!DTypeScaled(t)) return x;
  return scale > 0.0f ? x / scale : 0.0f;
}

// The fp32 value element `i` of a run with `scale` stands for.
RADIXKV_HD float Dequant(DType t, const void* src, uint64_t i, float scale) {
  const float v = DecodeElem(t, src, i);
  return DTypeScaled(t) ? v * scale : v;
}

// Scale of run `run` of a page (1 for unscaled dtypes).
RADIXKV_HD float PageScale(const PageGeometry& g, const void* page,
                           uint64_t run) {
  if (!g.scaled()) return 1.0f;
  return reinterpret_cast<const float*>(static_cast<const uint8_t*>(page) +
                                        g.scale_offset_bytes())[run];
}

}  // namespace radixkv::gpu::quant

#endif  // RADIXKV_GPU_KV_OPS_QUANT_H_
