// Typed pages (docs/CONTRACTS.md §2.1) on the CPU: the element encodings
// (exhaustively where the code space is small), the page layout with its
// scale area, write_kv / read_kv round trips within each dtype's bound, and
// attention over typed pages equal to attention over the dequantised fp32
// pages.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "gpu/attention.h"
#include "gpu/kv_ops.h"
#include "gpu/kv_ops_quant.h"
#include "gpu/page_layout.h"
#include "gtest/gtest.h"
#include "tests/gpu/kernels_test_util.h"

namespace radixkv::gpu {
namespace {

using testing::HostPool;
using testing::RandomFloats;
using testing::ShuffledIds;

constexpr DType kTyped[] = {DType::kFloat32,    DType::kFloat16,
                            DType::kBFloat16,   DType::kFloat8E4M3,
                            DType::kFloat8E5M2, DType::kInt8};

TEST(KvQuantCodecTest, KnownCodes) {
  EXPECT_EQ(quant::EncodeF16(1.0f), 0x3c00);
  EXPECT_EQ(quant::EncodeF16(-2.0f), 0xc000);
  EXPECT_EQ(quant::EncodeF16(65504.0f), 0x7bff);
  EXPECT_EQ(quant::EncodeF16(65520.0f), 0x7c00);  // rounds up: inf
  EXPECT_EQ(quant::EncodeF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(quant::EncodeF16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even
  EXPECT_EQ(quant::EncodeBF16(1.0f), 0x3f80);
  EXPECT_EQ(quant::EncodeBF16(quant::BitsFloat(0x3f808000u)), 0x3f80);  // tie
  EXPECT_EQ(quant::EncodeBF16(quant::BitsFloat(0x3f818000u)), 0x3f82);  // tie
  EXPECT_EQ(quant::EncodeE4M3(1.0f), 0x38);
  EXPECT_EQ(quant::EncodeE4M3(448.0f), 0x7e);
  EXPECT_EQ(quant::EncodeE4M3(1000.0f), 0x7e);    // saturates
  EXPECT_EQ(quant::EncodeE4M3(-1000.0f), 0xfe);
  EXPECT_EQ(quant::EncodeE4M3(std::ldexp(1.0f, -9)), 0x01);  // min subnormal
  EXPECT_EQ(quant::EncodeE4M3(1.0625f), 0x38);    // tie to even (1.0)
  EXPECT_EQ(quant::EncodeE4M3(1.1875f), 0x3a);    // tie to even (1.25)
  EXPECT_EQ(quant::EncodeE5M2(1.0f), 0x3c);
  EXPECT_EQ(quant::EncodeE5M2(57344.0f), 0x7b);
  EXPECT_EQ(quant::EncodeE5M2(1e9f), 0x7b);       // saturates
  EXPECT_EQ(quant::EncodeE5M2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(quant::EncodeI8(126.5f), 126);        // tie to even
  EXPECT_EQ(quant::EncodeI8(-127.6f), -127);      // clamped
  EXPECT_TRUE(std::isnan(quant::DecodeE4M3(0x7f)));
  EXPECT_TRUE(std::isinf(quant::DecodeE5M2(0x7c)));
  EXPECT_TRUE(std::isinf(quant::DecodeF16(0x7c00)));
}

// Every finite code decodes to a value that encodes back to the same code
// (and -0 / +0 both decode to zero).
TEST(KvQuantCodecTest, EveryFiniteCodeRoundTrips) {
  for (uint32_t c = 0; c < 256; ++c) {
    const uint8_t b = static_cast<uint8_t>(c);
    if ((c & 0x7f) != 0x7f) {
      EXPECT_EQ(quant::EncodeE4M3(quant::DecodeE4M3(b)), b) << c;
    }
    if ((c & 0x7f) < 0x7c) {
      EXPECT_EQ(quant::EncodeE5M2(quant::DecodeE5M2(b)), b) << c;
    }
    const int8_t i = static_cast<int8_t>(c);
    if (i != -128) {
      EXPECT_EQ(quant::EncodeI8(quant::DecodeI8(i)), i) << c;
    }
  }
  for (uint32_t c = 0; c < 65536; ++c) {
    const uint16_t h = static_cast<uint16_t>(c);
    if ((c & 0x7c00) != 0x7c00) {
      ASSERT_EQ(quant::EncodeF16(quant::DecodeF16(h)), h) << c;
    }
    if ((c & 0x7f80) != 0x7f80) {
      ASSERT_EQ(quant::EncodeBF16(quant::DecodeBF16(h)), h) << c;
    }
  }
}

// Rounding is to the nearest representable value: for values between two
// neighbouring codes the encoder picks the closer one (even on a tie).
TEST(KvQuantCodecTest, EncodersRoundToNearest) {
  std::vector<float> xs = RandomFloats(20000, 7, -500.0f, 500.0f);
  const std::vector<float> small = RandomFloats(20000, 8, -0.02f, 0.02f);
  xs.insert(xs.end(), small.begin(), small.end());
  for (float x : xs) {
    // fp8 E4M3: compare against every finite code.
    float best = INFINITY;
    for (uint32_t c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;
      best = std::min(best, std::fabs(quant::DecodeE4M3(uint8_t(c)) - x));
    }
    const float got = quant::DecodeE4M3(quant::EncodeE4M3(x));
    if (std::fabs(x) <= 448.0f) {
      ASSERT_EQ(std::fabs(got - x), best) << x;
    } else {
      ASSERT_EQ(std::fabs(got), 448.0f) << x;
    }
    const float f16 = quant::DecodeF16(quant::EncodeF16(x));
    // Half an ulp; fp16 subnormals (below 2^-14) have a fixed unit of 2^-24.
    ASSERT_LE(std::fabs(f16 - x),
              std::max(std::ldexp(std::fabs(x), -11), std::ldexp(1.0f, -25)))
        << x;
    const float b16 = quant::DecodeBF16(quant::EncodeBF16(x));
    ASSERT_LE(std::fabs(b16 - x), std::ldexp(std::fabs(x), -8)) << x;
  }
}

TEST(KvQuantLayoutTest, PageBytesAndScaleArea) {
  for (DType t : kTyped) {
    const PageGeometry g = MakePageGeometry(3, 2, 5, 6, t);
    ASSERT_TRUE(g.valid());
    const uint64_t elems = 3ull * 2 * 2 * 5 * 6;
    EXPECT_EQ(g.elems_bytes(), elems * DTypeBytes(t));
    if (DTypeScaled(t)) {
      // 360 element bytes round up to 368; 12 fp32 scales follow.
      EXPECT_EQ(g.scale_offset_bytes(), 368u);
      EXPECT_EQ(g.num_scales(), 12u);
      EXPECT_EQ(g.page_bytes(), 368u + 48u);
    } else {
      EXPECT_EQ(g.num_scales(), 0u);
      EXPECT_EQ(g.page_bytes(), elems * DTypeBytes(t));
    }
  }
  // The v1 fp32 layout is unchanged (CONTRACTS.md §2 vectors).
  const PageGeometry v1{32, 8, 16, 128, 4};
  EXPECT_EQ(v1.page_bytes(), 32ull * 2 * 8 * 16 * 128 * 4);
  EXPECT_EQ(MakePageGeometry(32, 8, 16, 128, DType::kFloat32).page_bytes(),
            v1.page_bytes());
  EXPECT_EQ(v1.offset(1, 1, 2, 3, 4),
            (((1ull * 2 + 1) * 8 + 2) * 16 + 3) * 128 + 4);
  PageGeometry bad = MakePageGeometry(1, 1, 1, 2, DType::kInt8);
  bad.elem_bytes = 2;
  EXPECT_FALSE(bad.valid());
  const float k = 1.0f;
  EXPECT_FALSE(WriteKv(bad, KvSource{&k, &k, 0}, absl::Span<void* const>()).ok());
}

// The test vector of docs/CONTRACTS.md §2.1, byte for byte.
TEST(KvQuantLayoutTest, ContractsTestVector) {
  const float k[4] = {0.5f, -1.0f, 0.25f, 2.0f};
  const float v[4] = {-3.0f, 0.75f, 1.5f, 0.0f};
  const std::vector<std::pair<DType, std::vector<uint8_t>>> want = {
      {DType::kInt8,
       {0x20, 0xc0, 0x10, 0x7f, 0x81, 0x20, 0x40, 0x00, 0, 0, 0, 0, 0, 0, 0, 0,
        0x04, 0x02, 0x81, 0x3c, 0x06, 0x83, 0xc1, 0x3c}},
      {DType::kFloat8E4M3,
       {0x6e, 0xf6, 0x66, 0x7e, 0xfe, 0x6e, 0x76, 0x00, 0, 0, 0, 0, 0, 0, 0, 0,
        0x25, 0x49, 0x92, 0x3b, 0xb7, 0x6d, 0xdb, 0x3b}},
      {DType::kFloat16,
       {0x00, 0x38, 0x00, 0xbc, 0x00, 0x34, 0x00, 0x40, 0x00, 0xc2, 0x00, 0x3a,
        0x00, 0x3e, 0x00, 0x00}},
  };
  for (const auto& [t, bytes] : want) {
    const PageGeometry g = MakePageGeometry(1, 1, 2, 2, t);
    ASSERT_EQ(g.page_bytes(), bytes.size());
    std::vector<uint8_t> page(g.page_bytes(), 0);
    void* p = page.data();
    ASSERT_TRUE(WriteKv(g, KvSource{k, v, 2}, absl::MakeConstSpan(&p, 1)).ok());
    EXPECT_EQ(page, bytes) << "dtype " << int(t);
  }
}

// The largest round-trip error allowed for an element x of a run with
// largest magnitude amax.
double Bound(DType t, float x, float amax) {
  const double ax = std::fabs(x);
  const double s = amax / quant::QuantMax(t);
  const double eps = 1e-6 * amax;  // the decode * scale product's rounding
  switch (t) {
    case DType::kFloat32:
      return 0;
    case DType::kFloat16:  // subnormal unit 2^-24
      return std::max(std::ldexp(ax, -11), std::ldexp(1.0, -25));
    case DType::kBFloat16:
      return std::ldexp(ax, -8);
    case DType::kFloat8E4M3:  // 3 mantissa bits; subnormal unit 2^-9
      return std::max(std::ldexp(ax, -4), s * std::ldexp(1.0, -10)) + eps;
    case DType::kFloat8E5M2:  // 2 mantissa bits; subnormal unit 2^-16
      return std::max(std::ldexp(ax, -3), s * std::ldexp(1.0, -17)) + eps;
    case DType::kInt8:
      return s / 2 + eps;
    default:
      return 0;
  }
}

TEST(KvQuantWriteKvTest, RoundTripWithinTheDtypeBound) {
  const uint32_t L = 2, H = 3, P = 8, D = 16, n = 8 * 4 + 5, stride = n + 3;
  std::vector<float> k = RandomFloats(size_t{L} * stride * H * D, 11, -3.0f, 3.0f);
  std::vector<float> v = RandomFloats(k.size(), 12, -0.5f, 0.5f);
  // One head carries an outlier, one is all zero: scales are per run.
  for (uint32_t t = 0; t < n; ++t) {
    k[((size_t{0} * stride + t) * H + 1) * D + 3] = t == 9 ? 40.0f : 0.01f;
    for (uint32_t d = 0; d < D; ++d) v[((size_t{1} * stride + t) * H + 2) * D + d] = 0;
  }
  for (DType t : kTyped) {
    const PageGeometry g = MakePageGeometry(L, H, P, D, t);
    const auto ids = ShuffledIds(PagesForTokens(g, n), 20, 3);
    HostPool pool(g, 20, 0x00);
    ASSERT_TRUE(WriteKv(g, KvSource{k.data(), v.data(), n, stride},
                        pool.data_base(), 20, ids).ok());
    std::vector<float> k2(k.size(), 0), v2(v.size(), 0);
    ASSERT_TRUE(ReadKv(g, pool.ConstAddresses(ids),
                       KvDest{k2.data(), v2.data(), n, stride}).ok());
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const std::vector<float>& x = kv == 0 ? k : v;
      const std::vector<float>& y = kv == 0 ? k2 : v2;
      for (uint32_t l = 0; l < L; ++l) {
        for (uint32_t h = 0; h < H; ++h) {
          for (uint32_t p = 0; p * P < n; ++p) {
            float amax = 0;
            const uint32_t end = std::min(n, (p + 1) * P);
            auto at = [&](uint32_t tok, uint32_t d) {
              return ((size_t{l} * stride + tok) * H + h) * D + d;
            };
            for (uint32_t tok = p * P; tok < end; ++tok)
              for (uint32_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[at(tok, d)]));
            if (g.scaled()) {
              float scale;
              std::memcpy(&scale, pool.page(ids[p]) + g.scale_offset_bytes() +
                                      4 * g.run(l, kv, h), 4);
              ASSERT_EQ(scale, amax / quant::QuantMax(t));
            }
            for (uint32_t tok = p * P; tok < end; ++tok) {
              for (uint32_t d = 0; d < D; ++d) {
                const size_t i = at(tok, d);
                ASSERT_LE(std::fabs(double(y[i]) - x[i]), Bound(t, x[i], amax))
                    << "dtype " << int(t) << " kv " << kv << " layer " << l
                    << " head " << h << " token " << tok << " dim " << d;
              }
            }
          }
        }
      }
    }
    // Slots past n in the last page keep their bytes.
    const uint32_t last_slot = n % P;
    EXPECT_EQ(pool.page(ids.back())[g.offset(0, 0, 0, last_slot, 0) * g.elem_bytes],
              0x00);
  }
}

// Attention over typed pages equals attention over fp32 pages holding
// ReadKv's dequantised values, bit for bit.
TEST(KvQuantAttentionTest, TypedPagesEqualTheirDequantisedFp32Pages) {
  const uint32_t L = 2, Hkv = 2, Hq = 4, P = 16, D = 32, prefix = 16 * 3 + 5;
  const uint32_t S = 7, T = 9;
  std::vector<float> k = RandomFloats(size_t{L} * prefix * Hkv * D, 21);
  std::vector<float> v = RandomFloats(k.size(), 22);
  const std::vector<float> q = RandomFloats(size_t{S} * Hq * D, 23);
  const std::vector<float> lk = RandomFloats(size_t{T} * Hkv * D, 24);
  const std::vector<float> lv = RandomFloats(lk.size(), 25);
  const AttentionShape shape{Hq, Hkv, D, 0};
  for (DType t : kTyped) {
    const PageGeometry g = MakePageGeometry(L, Hkv, P, D, t);
    const uint64_t np = PagesForTokens(g, prefix);
    const auto ids = ShuffledIds(np, 10, 5);
    HostPool pool(g, 10, 0);
    ASSERT_TRUE(WriteKv(g, KvSource{k.data(), v.data(), prefix}, pool.data_base(),
                        10, ids).ok());
    std::vector<float> dk(k.size()), dv(v.size());
    ASSERT_TRUE(ReadKv(g, pool.ConstAddresses(ids),
                       KvDest{dk.data(), dv.data(), prefix}).ok());
    const PageGeometry g32 = MakePageGeometry(L, Hkv, P, D, DType::kFloat32);
    HostPool pool32(g32, 10, 0);
    ASSERT_TRUE(WriteKv(g32, KvSource{dk.data(), dv.data(), prefix},
                        pool32.data_base(), 10, ids).ok());
    for (uint32_t layer = 0; layer < L; ++layer) {
      std::vector<float> got(q.size()), want(q.size());
      ASSERT_TRUE(AttentionPrefixSuffix(
                      shape, PrefixPages{g, layer, prefix}, pool.ConstAddresses(ids),
                      AttentionIo{q.data(), S, lk.data(), lv.data(), T, got.data()})
                      .ok());
      ASSERT_TRUE(AttentionPrefixSuffix(
                      shape, PrefixPages{g32, layer, prefix},
                      pool32.ConstAddresses(ids),
                      AttentionIo{q.data(), S, lk.data(), lv.data(), T, want.data()})
                      .ok());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
          << "dtype " << int(t) << " layer " << layer;
    }
  }
}

}  // namespace
}  // namespace radixkv::gpu
