// The AVX2 level of the CPU kernels. Compiled with -mavx2 -mf16c and never
// -mfma (src/cpu/CMakeLists.txt); only called after DetectedSimdLevel()
// reported AVX2 (every AVX2 CPU also has F16C, which the fp16 conversions use:
// vcvtph2ps/vcvtps2ph, round to nearest even). bf16 is integer arithmetic.
#include <immintrin.h>

#include <xsimd/xsimd.hpp>

#include "cpu/kernels.h"

namespace zinf::cpu {
namespace {

struct Avx2Io {
  using Arch = xsimd::avx2;
  using F = xsimd::batch<float, Arch>;
  using D = xsimd::batch<double, Arch>;
  static constexpr size_t kWidth = F::size;  // 8

  // Eight 32-bit lanes holding sign-extended 16-bit values -> eight uint16.
  static __m128i Narrow(__m256i v) {
    return _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  }
  static __m128i Bf16Vector(const F& x);
  static __m128i Fp16Vector(const F& x) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT); }

  static F LoadBf16(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static F LoadFp16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void StoreBf16(uint16_t* p, const F& x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), Bf16Vector(x)); }
  static void StoreFp16(uint16_t* p, const F& x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), Fp16Vector(x)); }
  static void StreamBf16(uint16_t* p, const F& x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), Bf16Vector(x)); }
  static void StreamFp16(uint16_t* p, const F& x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), Fp16Vector(x)); }
  static void StreamF32(float* p, const F& x) { _mm256_stream_ps(p, x); }
  static void WidenToDouble(const F& x, D& lo, D& hi) {
    lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  }
};

}  // namespace
}  // namespace zinf::cpu

#include "cpu/kernels_simd.h"

namespace zinf::cpu {
namespace {

__m128i Avx2Io::Bf16Vector(const F& x) { return Narrow(Bf16Bits<Arch>(x)); }

}  // namespace

const KernelTable& Avx2Kernels() {
  static const KernelTable table = MakeSimdTable<Avx2Io>(SimdLevel::kAvx2);
  return table;
}

}  // namespace zinf::cpu
