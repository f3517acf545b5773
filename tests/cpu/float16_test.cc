// The scalar conversions against independent oracles: GCC's _Float16 (x86
// soft/hard float, round to nearest even) for fp16, a nearest-neighbour search
// in double for bf16, and exact decoding with ldexp for widening.
#include "common/float16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace zinf::cpu {
namespace {

// The nearest bf16 (ties to even) by comparing the two neighbours in double.
uint16_t ReferenceBf16(float f) {
  const uint32_t u = FloatToBits(f);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  const double d = std::fabs(static_cast<double>(f));
  const double dlo = std::fabs(static_cast<double>(BitsToFloat(lo)));
  const double dhi = (hi & 0x7fffffffu) == 0x7f800000u ? std::ldexp(1.0, 128) : std::fabs(double(BitsToFloat(hi)));
  const double below = d - dlo, above = dhi - d;
  if (below < above) return static_cast<uint16_t>(lo >> 16);
  if (above < below) return static_cast<uint16_t>(hi >> 16);
  return static_cast<uint16_t>(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

double DecodeHalf(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -mag : mag;
}

// Every high half with low halves at and around the rounding points of both
// formats (bit 13 for fp16, bit 16 for bf16): ties, just below, just above.
std::vector<uint32_t> InterestingFloatBits() {
  static constexpr uint32_t kLow[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000,
                                      0x3000, 0x7fff, 0x8000, 0x8001, 0xa000, 0xe000, 0xffff};
  std::vector<uint32_t> bits;
  for (uint32_t high = 0; high < 0x10000; ++high)
    for (uint32_t low : kLow) bits.push_back(high << 16 | low);
  return bits;
}

TEST(Float16Test, HalfToFloatIsExactForEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(FloatToBits(f), ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13)) << std::hex << h;
    } else if ((h & 0x7c00) == 0x7c00) {
      EXPECT_TRUE(std::isinf(f)) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0);
    } else {
      EXPECT_EQ(static_cast<double>(f), DecodeHalf(static_cast<uint16_t>(h))) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
    }
  }
}

TEST(Float16Test, FloatToHalfRoundsToNearestEven) {
#if defined(__FLT16_MAX__)
  for (uint32_t u : InterestingFloatBits()) {
    const float f = BitsToFloat(u);
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(FloatToHalfBits(f), ref_bits) << std::hex << u;
  }
#else
  GTEST_SKIP() << "compiler has no _Float16 to compare with";
#endif
}

TEST(Float16Test, FloatToHalfKnownValues) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);               // max
  EXPECT_EQ(FloatToHalfBits(65519.99f), 0x7bff);              // below the midpoint to 2^16
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00);               // the midpoint rounds to even: inf
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: 0
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.5f, -24)), 0x0002);  // tie to even: 2
  EXPECT_EQ(FloatToHalfBits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalfBits(1e-30f), 0x0000);
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalfBits(BitsToFloat(0x7f800001u)), 0x7e00);  // signalling NaN -> quiet
  EXPECT_EQ(FloatToHalfBits(BitsToFloat(0xffc02000u)), 0xfe01);  // sign and top payload kept
}

TEST(Float16Test, FloatToBf16MatchesNearestNeighbour) {
  for (uint32_t u : InterestingFloatBits()) {
    const float f = BitsToFloat(u);
    if (std::isnan(f)) {
      const uint16_t h = FloatToBf16Bits(f);
      EXPECT_TRUE((h & 0x7fff) > 0x7f80) << std::hex << u;  // still NaN
      EXPECT_EQ(h, static_cast<uint16_t>((u >> 16) | 0x40)) << std::hex << u;
      continue;
    }
    ASSERT_EQ(FloatToBf16Bits(f), ReferenceBf16(f)) << std::hex << u;
  }
}

TEST(Float16Test, Bf16KnownValues) {
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16Bits(BitsToFloat(0x3f808000u)), 0x3f80);           // tie, even stays
  EXPECT_EQ(FloatToBf16Bits(BitsToFloat(0x3f818000u)), 0x3f82);           // tie, odd rounds up
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(FloatToBf16Bits(BitsToFloat(0x7f800001u)), 0x7fc0);           // NaN with low payload stays NaN
  EXPECT_EQ(FloatToBits(Bf16BitsToFloat(0x8001)), 0x80010000u);           // widening is a shift
}

TEST(Float16Test, RoundTripIsIdentityForEvery16BitValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<uint16_t>(h);
    if ((h & 0x7fff) <= 0x7f80) {
      EXPECT_EQ(FloatToBf16Bits(Bf16BitsToFloat(b)), b) << std::hex << h;
    }
    if ((h & 0x7fff) <= 0x7c00) {
      EXPECT_EQ(FloatToHalfBits(HalfBitsToFloat(b)), b) << std::hex << h;
    }
  }
}

}  // namespace
}  // namespace zinf::cpu
