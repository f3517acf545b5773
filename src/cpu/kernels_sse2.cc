// The SSE2 level of the CPU kernels (the x86-64 baseline: compiled with the
// default flags). Without F16C, fp16 conversions are the integer method of
// float16.h applied lane-wise; bf16 is integer arithmetic as on every level.
#include <emmintrin.h>

#include <xsimd/xsimd.hpp>

#include "cpu/kernels.h"

namespace zinf::cpu {
namespace {

struct Sse2Io {
  using Arch = xsimd::sse2;
  using F = xsimd::batch<float, Arch>;
  using D = xsimd::batch<double, Arch>;
  using I = xsimd::batch<int32_t, Arch>;
  static constexpr size_t kWidth = F::size;  // 4

  // Four 32-bit lanes whose low 16 bits are wanted -> four uint16 in the low
  // 64 bits (sign-extend first so the signed-saturating pack keeps the bits).
  static __m128i Narrow(__m128i v) {
    const __m128i sign_extended = _mm_srai_epi32(_mm_slli_epi32(v, 16), 16);
    return _mm_packs_epi32(sign_extended, sign_extended);
  }
  static __m128i Bf16Vector(const F& x);
  static __m128i Fp16Vector(const F& x);

  static F LoadBf16(const uint16_t* p) {
    const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));  // each value into the high half
  }
  static F LoadFp16(const uint16_t* p);
  static void StoreBf16(uint16_t* p, const F& x) { _mm_storel_epi64(reinterpret_cast<__m128i*>(p), Bf16Vector(x)); }
  static void StoreFp16(uint16_t* p, const F& x) { _mm_storel_epi64(reinterpret_cast<__m128i*>(p), Fp16Vector(x)); }
  static void StreamBf16(uint16_t* p, const F& x) {
    _mm_stream_si64(reinterpret_cast<long long*>(p), _mm_cvtsi128_si64(Bf16Vector(x)));
  }
  static void StreamFp16(uint16_t* p, const F& x) {
    _mm_stream_si64(reinterpret_cast<long long*>(p), _mm_cvtsi128_si64(Fp16Vector(x)));
  }
  static void StreamF32(float* p, const F& x) { _mm_stream_ps(p, x); }
  static void WidenToDouble(const F& x, D& lo, D& hi) {
    lo = _mm_cvtps_pd(x);
    hi = _mm_cvtps_pd(_mm_movehl_ps(x, x));
  }
};

}  // namespace
}  // namespace zinf::cpu

#include "cpu/kernels_simd.h"

namespace zinf::cpu {
namespace {

__m128i Sse2Io::Bf16Vector(const F& x) { return Narrow(Bf16Bits<Arch>(x)); }
__m128i Sse2Io::Fp16Vector(const F& x) { return Narrow(HalfBitsNoF16c<Arch>(x)); }
Sse2Io::F Sse2Io::LoadFp16(const uint16_t* p) {
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return HalfToFloatNoF16c<Arch>(I(_mm_unpacklo_epi16(h, _mm_setzero_si128())));  // zero-extend
}

}  // namespace

const KernelTable& Sse2Kernels() {
  static const KernelTable table = MakeSimdTable<Sse2Io>(SimdLevel::kSse2);
  return table;
}

}  // namespace zinf::cpu
