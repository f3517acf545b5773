// SumSquaresBlocks: every SIMD level gives the scalar twin's partials bit for
// bit, they match an extended-precision sum, shards split at block multiples
// reproduce the whole buffer's partials, thread count does not matter, and
// the non-finite check flags exactly the blocks holding inf or NaN.
#include "cpu/norm.h"

#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/kernels.h"
#include "cpu_test_util.h"
#include "test_util.h"

namespace zinf::cpu {
namespace {

using math::kNormBlockElems;
using test::AlignedBuffer;

// n values of dtype (raw bytes), finite, with subnormals and large values.
AlignedBuffer<unsigned char> RandomData(size_t n, DType dtype, uint32_t seed) {
  AlignedBuffer<unsigned char> data((n + 1) * 4);
  test::RandomFloats r(seed);
  for (size_t i = 0; i < n + 1; ++i) {
    float x = r.Next(false);
    if (dtype == DType::kFloat16 && std::fabs(x) > 6e4f) x = 1.5f;
    if (dtype == DType::kFloat32) {
      std::memcpy(data.data() + 4 * i, &x, 4);
    } else {
      const uint16_t h = dtype == DType::kBFloat16 ? FloatToBf16Bits(x) : FloatToHalfBits(x);
      std::memcpy(data.data() + 2 * i, &h, 2);
    }
  }
  return data;
}

std::vector<double> Partials(tbb::task_arena& arena, const void* data, DType dtype, size_t n, SimdLevel level,
                             size_t* non_finite = nullptr) {
  std::vector<double> partials(NumNormBlocks(n));
  auto r = SumSquaresBlocks(arena, data, dtype, n, partials, level);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (non_finite) *non_finite = r.value_or(999);
  return partials;
}

class NormLevelTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override { ZINF_SKIP_IF_LEVEL_UNSUPPORTED(GetParam()); }
  tbb::task_arena arena_{2};
};

TEST_P(NormLevelTest, PartialsMatchScalarTwinBitForBit) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{15}, size_t{17}, size_t{1000}, kNormBlockElems, 2 * kNormBlockElems + 777}) {
      for (size_t offset : {0, 1}) {
        SCOPED_TRACE(testing::Message() << DTypeName(dtype) << " n " << n << " offset " << offset);
        const auto data = RandomData(n + 1, dtype, static_cast<uint32_t>(n + 3 * offset));
        const unsigned char* start = data.data() + offset * DTypeSizeBytes(dtype);
        const auto twin = Partials(arena_, start, dtype, n, SimdLevel::kScalar);
        const auto fast = Partials(arena_, start, dtype, n, GetParam());
        ASSERT_EQ(fast.size(), twin.size());
        if (n > 0) {  // memcmp of empty vectors' null data() is undefined
          ASSERT_EQ(std::memcmp(fast.data(), twin.data(), fast.size() * sizeof(double)), 0);
          ASSERT_GT(fast[0], 0.0);
        }
      }
    }
  }
}

// Against a long double sum per block: the double sum of <= 4096 exact
// squares per lane, then 15 lane additions, has relative error at most
// about (4096 + 4) * 2^-53 ~ 4.6e-13 (all terms are non-negative, so there
// is no cancellation); 1e-12 leaves room.
TEST_P(NormLevelTest, MatchesExtendedPrecisionSum) {
  constexpr size_t n = 3 * kNormBlockElems + 5;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const auto data = RandomData(n, dtype, 99);
    const auto partials = Partials(arena_, data.data(), dtype, n, GetParam());
    for (size_t b = 0; b < partials.size(); ++b) {
      long double ref = 0;
      for (size_t i = b * kNormBlockElems; i < std::min(n, (b + 1) * kNormBlockElems); ++i) {
        const long double x = test::LoadAsFloat(data.data(), dtype, i);
        ref += x * x;
      }
      EXPECT_LE(std::fabs(static_cast<long double>(partials[b]) - ref), 1e-12L * ref) << DTypeName(dtype) << " " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLevels, NormLevelTest, ::testing::ValuesIn(test::AllSimdLevels()),
                         test::SimdLevelParamName);

TEST(NormTest, ShardsAtBlockBoundariesGiveTheSameNorm) {
  tbb::task_arena arena(2);
  constexpr size_t n = 5 * kNormBlockElems + 12345;
  const auto data = RandomData(n, DType::kFloat32, 5);
  const auto* values = reinterpret_cast<const float*>(data.data());
  const auto whole = Partials(arena, values, DType::kFloat32, n, ActiveSimdLevel());
  // Three shards (as three ranks would hold them): 2 blocks, 1 block, the rest.
  std::vector<double> concatenated;
  const size_t cuts[] = {0, 2 * kNormBlockElems, 3 * kNormBlockElems, n};
  for (int s = 0; s < 3; ++s) {
    const auto part = Partials(arena, values + cuts[s], DType::kFloat32, cuts[s + 1] - cuts[s], ActiveSimdLevel());
    concatenated.insert(concatenated.end(), part.begin(), part.end());
  }
  ASSERT_EQ(concatenated.size(), whole.size());
  EXPECT_EQ(std::memcmp(concatenated.data(), whole.data(), whole.size() * sizeof(double)), 0);
  const double a = CombineBlockPartials(whole), b = CombineBlockPartials(concatenated);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(double)), 0);
  EXPECT_GT(a, 0.0);
}

TEST(NormTest, ThreadCountDoesNotChangePartials) {
  constexpr size_t n = 7 * kNormBlockElems + 3;
  const auto data = RandomData(n, DType::kBFloat16, 8);
  std::vector<std::vector<double>> results;
  for (int threads : {1, 2, 4}) {
    tbb::task_arena arena(threads);
    results.push_back(Partials(arena, data.data(), DType::kBFloat16, n, ActiveSimdLevel()));
  }
  for (const auto& r : results) EXPECT_EQ(r, results[0]);
}

TEST(NormTest, NonFiniteBlocksAreCounted) {
  tbb::task_arena arena(2);
  constexpr size_t n = 4 * kNormBlockElems;
  std::vector<float> values(n, 1.0f);
  size_t non_finite = 0;
  auto partials = Partials(arena, values.data(), DType::kFloat32, n, ActiveSimdLevel(), &non_finite);
  EXPECT_EQ(non_finite, 0u);
  EXPECT_EQ(partials[0], double(kNormBlockElems));  // exact: integers
  values[kNormBlockElems + 17] = -std::numeric_limits<float>::infinity();
  values[3 * kNormBlockElems + 5] = std::numeric_limits<float>::quiet_NaN();
  partials = Partials(arena, values.data(), DType::kFloat32, n, ActiveSimdLevel(), &non_finite);
  EXPECT_EQ(non_finite, 2u);
  EXPECT_TRUE(std::isinf(partials[1]));
  EXPECT_TRUE(std::isnan(partials[3]));
  EXPECT_TRUE(std::isfinite(partials[0]) && std::isfinite(partials[2]));
}

TEST(NormTest, LargestFiniteValuesDoNotLookNonFinite) {
  tbb::task_arena arena(1);
  std::vector<float> values(kNormBlockElems, -FLT_MAX);
  size_t non_finite = 99;
  const auto partials = Partials(arena, values.data(), DType::kFloat32, values.size(), ActiveSimdLevel(), &non_finite);
  EXPECT_EQ(non_finite, 0u);
  EXPECT_TRUE(std::isfinite(partials[0]));
}

TEST(NormTest, WrongPartialCountIsInvalidArgument) {
  tbb::task_arena arena(1);
  std::vector<float> values(kNormBlockElems + 1, 1.0f);
  std::vector<double> partials(1);
  auto r = SumSquaresBlocks(arena, values.data(), DType::kFloat32, values.size(), partials);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NumNormBlocks(0), 0u);
  EXPECT_EQ(NumNormBlocks(1), 1u);
  EXPECT_EQ(NumNormBlocks(kNormBlockElems), 1u);
  EXPECT_EQ(NumNormBlocks(kNormBlockElems + 1), 2u);
}

TEST(NormTest, CombineBlockPartialsAddsInBlockOrder) {
  const std::vector<double> partials = {1e16, 1.0, -1e16, 1.0};
  // Left to right: ((1e16 + 1) - 1e16) + 1 = 0 + 1 = 1 (1e16 + 1 rounds to 1e16).
  EXPECT_EQ(CombineBlockPartials(partials), 1.0);
}

}  // namespace
}  // namespace zinf::cpu
