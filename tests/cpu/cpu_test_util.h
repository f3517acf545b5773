// Helpers for the CPU kernel tests: the SIMD levels as a test parameter
// (levels above what this CPU supports are skipped, not passed), bit-level
// comparison of floats, and random inputs with the awkward values mixed in.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/float16.h"
#include "cpu/simd_level.h"
#include "zinf/dtype.h"

namespace zinf::test {

// A 64-byte aligned, zero-initialized array (so tests control the alignment
// the kernels see: data() is aligned, data() + 1 is not).
template <class T>
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t n) : size_(n), data_(Allocate(n)) {}
  AlignedBuffer(const AlignedBuffer& other) : size_(other.size_), data_(Allocate(other.size_)) {
    if (size_) std::memcpy(data_, other.data_, size_ * sizeof(T));
  }
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  static T* Allocate(size_t n) {
    const size_t bytes = ((n * sizeof(T) + 63) / 64 + 1) * 64;
    void* p = std::aligned_alloc(64, bytes);
    std::memset(p, 0, bytes);
    return static_cast<T*>(p);
  }
  size_t size_;
  T* data_;
};

inline const std::vector<cpu::SimdLevel>& AllSimdLevels() {
  static const std::vector<cpu::SimdLevel> levels = {cpu::SimdLevel::kScalar, cpu::SimdLevel::kSse2,
                                                     cpu::SimdLevel::kAvx2, cpu::SimdLevel::kAvx512};
  return levels;
}

inline std::string SimdLevelParamName(const ::testing::TestParamInfo<cpu::SimdLevel>& info) {
  return std::string(cpu::SimdLevelName(info.param));
}

// In SetUp of a test parameterized by level.
#define ZINF_SKIP_IF_LEVEL_UNSUPPORTED(level)                                            \
  do {                                                                                   \
    if (static_cast<int>(level) > static_cast<int>(::zinf::cpu::DetectedSimdLevel()))    \
      GTEST_SKIP() << "this CPU does not support " << ::zinf::cpu::SimdLevelName(level); \
  } while (0)

// Equal bits, or both NaN (NaN sign and payload may differ between levels).
inline bool SameBitsOrBothNan(float a, float b) {
  return FloatToBits(a) == FloatToBits(b) || (std::isnan(a) && std::isnan(b));
}
inline bool IsNan16(uint16_t h, DType dtype) {
  return dtype == DType::kBFloat16 ? (h & 0x7fff) > 0x7f80 : (h & 0x7fff) > 0x7c00;
}
inline bool SameBits16OrBothNan(uint16_t a, uint16_t b, DType dtype) {
  return a == b || (IsNan16(a, dtype) && IsNan16(b, dtype));
}

inline float RoundTo(DType dtype, float x) {
  if (dtype == DType::kBFloat16) return Bf16BitsToFloat(FloatToBf16Bits(x));
  if (dtype == DType::kFloat16) return HalfBitsToFloat(FloatToHalfBits(x));
  return x;
}

// Random floats: mostly "realistic" magnitudes, with zeros of both signs,
// fp32 subnormals, huge values, and (if specials) ±inf and NaN mixed in.
class RandomFloats {
 public:
  explicit RandomFloats(uint32_t seed) : rng_(seed) {}

  float Next(bool specials, float scale = 1.0f) {
    const uint32_t pick = rng_() % 100;
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    if (pick < 70) return uni(rng_) * scale;
    if (pick < 76) return uni(rng_) * 1e-40f;  // fp32 subnormal
    if (pick < 80) return uni(rng_) * 1e-20f;
    if (pick < 84) return uni(rng_) * 1e20f;
    if (pick < 87) return (rng_() & 1) ? 0.0f : -0.0f;
    if (pick < 92) return uni(rng_) * 3e4f;  // near fp16's max
    if (!specials) return uni(rng_) * scale;
    if (pick < 95)
      return (rng_() & 1) ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
    if (pick < 97) return std::numeric_limits<float>::quiet_NaN();
    return BitsToFloat(rng_());  // any bit pattern, NaN payloads included
  }
  float NextNonNegative(float scale) { return std::fabs(Next(false, scale)); }
  uint32_t Bits() { return rng_(); }
  std::mt19937& rng() { return rng_; }

 private:
  std::mt19937 rng_;
};

}  // namespace zinf::test
