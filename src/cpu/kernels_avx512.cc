// The AVX-512 (F+CD+DQ+BW) level of the CPU kernels. Compiled with
// -mavx512f -mavx512cd -mavx512dq -mavx512bw -mavx2 -mf16c and never -mfma
// (src/cpu/CMakeLists.txt); only called after DetectedSimdLevel() reported
// AVX-512. fp16 conversions use the AVX-512F forms of F16C's instructions
// (vcvtph2ps/vcvtps2ph, round to nearest even); bf16 is integer arithmetic,
// since this level does not assume AVX512_BF16.
#include <immintrin.h>

#include <xsimd/xsimd.hpp>

#include "cpu/kernels.h"

namespace zinf::cpu {
namespace {

struct Avx512Io {
  using Arch = xsimd::avx512bw;
  using F = xsimd::batch<float, Arch>;
  using D = xsimd::batch<double, Arch>;
  static constexpr size_t kWidth = F::size;  // 16

  static __m256i Bf16Vector(const F& x);
  static __m256i Fp16Vector(const F& x) { return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

  static F LoadBf16(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static F LoadFp16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void StoreBf16(uint16_t* p, const F& x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), Bf16Vector(x)); }
  static void StoreFp16(uint16_t* p, const F& x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), Fp16Vector(x)); }
  static void StreamBf16(uint16_t* p, const F& x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), Bf16Vector(x)); }
  static void StreamFp16(uint16_t* p, const F& x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), Fp16Vector(x)); }
  static void StreamF32(float* p, const F& x) { _mm512_stream_ps(p, x); }
  static void WidenToDouble(const F& x, D& lo, D& hi) {
    lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  }
};

}  // namespace
}  // namespace zinf::cpu

#include "cpu/kernels_simd.h"

namespace zinf::cpu {
namespace {

__m256i Avx512Io::Bf16Vector(const F& x) { return _mm512_cvtepi32_epi16(Bf16Bits<Arch>(x)); }

}  // namespace

const KernelTable& Avx512Kernels() {
  static const KernelTable table = MakeSimdTable<Avx512Io>(SimdLevel::kAvx512);
  return table;
}

}  // namespace zinf::cpu
