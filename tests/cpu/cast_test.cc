// Cast: every SIMD level gives the scalar twin's bits for all six
// conversions over every 16-bit pattern and ~900 K fp32 patterns around the
// rounding points (float16_test.cc checks the twin against independent
// oracles), at any length and alignment, with and without non-temporal stores.
#include "cpu/cast.h"

#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>

#include <cstring>
#include <vector>

#include "common/float16.h"
#include "cpu/kernels.h"
#include "cpu_test_util.h"

namespace zinf::cpu {
namespace {

using test::AlignedBuffer;

// Raw source values: every 16-bit pattern, or fp32 patterns at and around the
// rounding points of both 16-bit formats (NaNs and infinities included).
AlignedBuffer<unsigned char> Sources(DType dtype, size_t* n) {
  if (dtype != DType::kFloat32) {
    *n = 0x10000;
    AlignedBuffer<unsigned char> out(*n * 2 + 8);
    for (uint32_t h = 0; h < 0x10000; ++h) {
      const auto v = static_cast<uint16_t>(h);
      std::memcpy(out.data() + 2 * h, &v, 2);
    }
    return out;
  }
  static constexpr uint32_t kLow[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x2000, 0x7fff,
                                      0x8000, 0x8001, 0xa000, 0xe000, 0xf000, 0xffff};
  *n = 0x10000 * std::size(kLow);
  AlignedBuffer<unsigned char> out(*n * 4 + 16);
  size_t i = 0;
  for (uint32_t high = 0; high < 0x10000; ++high) {
    for (uint32_t low : kLow) {
      const uint32_t bits = high << 16 | low;
      std::memcpy(out.data() + 4 * i++, &bits, 4);
    }
  }
  return out;
}

bool SameOrBothNan(const unsigned char* a, const unsigned char* b, DType dtype, size_t i) {
  if (dtype == DType::kFloat32) {
    float x, y;
    std::memcpy(&x, a + 4 * i, 4);
    std::memcpy(&y, b + 4 * i, 4);
    return test::SameBitsOrBothNan(x, y);
  }
  uint16_t x, y;
  std::memcpy(&x, a + 2 * i, 2);
  std::memcpy(&y, b + 2 * i, 2);
  return test::SameBits16OrBothNan(x, y, dtype);
}

class CastLevelTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override { ZINF_SKIP_IF_LEVEL_UNSUPPORTED(GetParam()); }
  tbb::task_arena arena_{2};
};

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

TEST_P(CastLevelTest, EveryConversionMatchesScalarTwin) {
  for (DType src : kDTypes) {
    size_t n = 0;
    const auto in = Sources(src, &n);
    for (DType dst : kDTypes) {
      if (src == dst) continue;
      SCOPED_TRACE(testing::Message() << DTypeName(src) << " -> " << DTypeName(dst));
      AlignedBuffer<unsigned char> twin(n * 4 + 64), fast(n * 4 + 64);
      ASSERT_TRUE(Cast(arena_, in.data(), src, twin.data(), dst, n, SimdLevel::kScalar).ok());
      ASSERT_TRUE(Cast(arena_, in.data(), src, fast.data(), dst, n, GetParam()).ok());
      size_t mismatches = 0;
      for (size_t i = 0; i < n; ++i) {
        if (!SameOrBothNan(fast.data(), twin.data(), dst, i) && mismatches++ < 5) {
          ADD_FAILURE() << "element " << i << " differs";
        }
      }
      EXPECT_EQ(mismatches, 0u);
      // NaN payloads are part of the contract for casts: compare exact bits too.
      EXPECT_EQ(std::memcmp(fast.data(), twin.data(), n * DTypeSizeBytes(dst)), 0);
    }
  }
}

TEST_P(CastLevelTest, AnyLengthAndAlignment) {
  for (DType src : kDTypes) {
    for (DType dst : kDTypes) {
      if (src == dst) continue;
      for (size_t n : {0, 1, 2, 3, 5, 8, 15, 16, 17, 31, 33, 64, 100, 1037}) {
        for (size_t src_offset : {0, 1}) {
          for (size_t dst_offset : {0, 1, 3}) {  // 0: non-temporal stores; others: unaligned
            SCOPED_TRACE(testing::Message() << DTypeName(src) << "->" << DTypeName(dst) << " n " << n << " offsets "
                                            << src_offset << "," << dst_offset);
            AlignedBuffer<unsigned char> in((n + 4) * 4);
            test::RandomFloats r(static_cast<uint32_t>(n * 31 + src_offset));
            for (size_t i = 0; i < (n + 4) * 4; ++i) in[i] = static_cast<unsigned char>(r.Bits());
            AlignedBuffer<unsigned char> twin((n + 4) * 4), fast((n + 4) * 4);
            std::memset(twin.data(), 0xab, twin.size());
            std::memset(fast.data(), 0xab, fast.size());
            const unsigned char* s = in.data() + src_offset * DTypeSizeBytes(src);
            ASSERT_TRUE(
                Cast(arena_, s, src, twin.data() + dst_offset * DTypeSizeBytes(dst), dst, n, SimdLevel::kScalar).ok());
            ASSERT_TRUE(Cast(arena_, s, src, fast.data() + dst_offset * DTypeSizeBytes(dst), dst, n, GetParam()).ok());
            // Same bits, and nothing written outside [dst, dst + n).
            ASSERT_EQ(std::memcmp(twin.data(), fast.data(), twin.size()), 0);
            for (size_t i = 0; i < dst_offset * DTypeSizeBytes(dst); ++i) ASSERT_EQ(fast[i], 0xab);
            for (size_t i = (dst_offset + n) * DTypeSizeBytes(dst); i < fast.size(); ++i) ASSERT_EQ(fast[i], 0xab);
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, CastLevelTest, ::testing::ValuesIn(test::AllSimdLevels()),
                         test::SimdLevelParamName);

TEST(CastTest, MultiBlockWithThreadsMatchesElementwise) {
  tbb::task_arena arena(3);
  constexpr size_t n = 3 * math::kNormBlockElems + 71;
  std::vector<float> in(n);
  test::RandomFloats r(3);
  for (auto& x : in) x = r.Next(true);
  std::vector<uint16_t> bf16(n), fp16(n);
  ASSERT_TRUE(Cast(arena, in.data(), DType::kFloat32, bf16.data(), DType::kBFloat16, n).ok());
  ASSERT_TRUE(Cast(arena, in.data(), DType::kFloat32, fp16.data(), DType::kFloat16, n).ok());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(bf16[i], FloatToBf16Bits(in[i])) << i;
    ASSERT_EQ(fp16[i], FloatToHalfBits(in[i])) << i;
  }
  std::vector<float> back(n);
  ASSERT_TRUE(Cast(arena, fp16.data(), DType::kFloat16, back.data(), DType::kFloat32, n).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(FloatToBits(back[i]), FloatToBits(HalfBitsToFloat(fp16[i]))) << i;
}

TEST(CastTest, SameDTypeCopies) {
  tbb::task_arena arena(1);
  std::vector<uint16_t> in = {1, 2, 3, 0x7fc1}, out(4);
  ASSERT_TRUE(Cast(arena, in.data(), DType::kBFloat16, out.data(), DType::kBFloat16, 4).ok());
  EXPECT_EQ(in, out);
}

TEST(CastTest, BadArgumentsAreInvalidArgument) {
  tbb::task_arena arena(1);
  std::vector<float> buf(100);
  EXPECT_EQ(Cast(arena, buf.data(), DType::kFloat32, buf.data() + 10, DType::kBFloat16, 50).code(),
            StatusCode::kInvalidArgument);  // overlap
  EXPECT_EQ(Cast(arena, nullptr, DType::kFloat32, buf.data(), DType::kBFloat16, 5).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(Cast(arena, nullptr, DType::kFloat32, nullptr, DType::kBFloat16, 0).ok());
  EXPECT_EQ(Cast(arena, buf.data(), static_cast<DType>(7), buf.data() + 50, DType::kFloat32, 5).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf::cpu
