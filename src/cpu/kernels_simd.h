// The SIMD kernels, written once over an architecture policy `Io` and
// instantiated by each per-level translation unit (kernels_sse2.cc,
// kernels_avx2.cc, kernels_avx512.cc), which is compiled with that level's
// flags and defines, before including this header, a struct with:
//
//   using Arch = xsimd::<arch>;  using F = xsimd::batch<float, Arch>;
//   static constexpr size_t kWidth = F::size;
//   static F LoadBf16(const uint16_t*), LoadFp16(const uint16_t*);      // kWidth values, unaligned
//   static void StoreBf16(uint16_t*, F), StoreFp16(uint16_t*, F);       // unaligned
//   static void StreamBf16(uint16_t*, F), StreamFp16(uint16_t*, F);     // non-temporal, aligned to 2*kWidth bytes
//   static void StreamF32(float*, F);                                   // non-temporal, aligned to 4*kWidth bytes
//   static void WidenToDouble(F x, D& lo, D& hi);                        // D = batch<double, Arch>
//
// Include only from those files: everything here has internal linkage, so no
// function compiled for one instruction set can be merged by the linker into
// code that runs on another. Tails shorter than a vector are processed as a
// zero-padded vector through a stack buffer (never by scalar code), so the
// tail gives the same bits as the body. Thread-safety: pure functions.
#pragma once

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "math/adam_math.h"
#include "cpu/kernels.h"

namespace zinf::cpu {
namespace {

template <class A>
using FloatBatch = xsimd::batch<float, A>;
template <class A>
using IntBatch = xsimd::batch<int32_t, A>;

// fp32 -> bf16 bits, round to nearest even, NaN quieted with its top payload
// kept (float16.h: FloatToBf16Bits). The result is sign-extended from bit 15,
// so a signed-saturating pack or a truncating narrow both keep the 16 bits.
template <class A>
IntBatch<A> Bf16Bits(const FloatBatch<A>& x) {
  using I = IntBatch<A>;
  const I u = xsimd::bitwise_cast<I>(x);
  const auto is_nan = (u & I(0x7fffffff)) > I(0x7f800000);
  const I rounded = (u + I(0x7fff) + ((u >> 16) & I(1))) >> 16;  // arithmetic shift: sign-extends bit 15
  const I quiet_nan = (u >> 16) | I(0x0040);
  return xsimd::select(is_nan, quiet_nan, rounded);
}

// fp32 -> fp16 bits without F16C (SSE2): float16.h's FloatToHalfBits, lane-wise.
// Zero-extended 16-bit results.
template <class A>
IntBatch<A> HalfBitsNoF16c(const FloatBatch<A>& x) {
  using I = IntBatch<A>;
  using F = FloatBatch<A>;
  const I u = xsimd::bitwise_cast<I>(x);
  const I sign = (u >> 16) & I(0x8000);
  const I a = u & I(0x7fffffff);
  const I inf_nan = xsimd::select(a > I(0x7f800000), I(0x7e00) | ((a >> 13) & I(0x3ff)), I(0x7c00));
  const I subnormal = xsimd::bitwise_cast<I>(xsimd::bitwise_cast<F>(a) + F(0.5f)) - I(0x3f000000);
  const I normal = (a + I(static_cast<int32_t>(0xc8000fffu)) + ((a >> 13) & I(1))) >> 13;
  const I h = xsimd::select(a >= I(0x47800000), inf_nan, xsimd::select(a < I(0x38800000), subnormal, normal));
  return h | sign;
}

// fp16 bits (zero-extended in 32-bit lanes) -> fp32 without F16C:
// float16.h's HalfBitsToFloat, lane-wise.
template <class A>
FloatBatch<A> HalfToFloatNoF16c(const IntBatch<A>& h) {
  using I = IntBatch<A>;
  using F = FloatBatch<A>;
  const I sign = (h & I(0x8000)) << 16;
  const I exponent = h & I(0x7c00);
  const I mantissa = h & I(0x3ff);
  const I normal = ((h & I(0x7fff)) << 13) + I(112 << 23);
  const I inf_nan = I(0x7f800000) | (mantissa << 13) | xsimd::select(mantissa != I(0), I(0x00400000), I(0));
  // mantissa * 2^-24: convert the integer exactly, then subtract 24 from its exponent.
  const I scaled = xsimd::bitwise_cast<I>(xsimd::to_float(mantissa)) - I(24 << 23);
  const I subnormal = xsimd::select(mantissa == I(0), I(0), scaled);
  const I bits =
      xsimd::select(exponent == I(0x7c00), inf_nan, xsimd::select(exponent == I(0), subnormal, normal)) | sign;
  return xsimd::bitwise_cast<F>(bits);
}

template <class Io, DType kType>
typename Io::F Load(const void* base, size_t i) {
  if constexpr (kType == DType::kFloat32) {
    return Io::F::load_unaligned(static_cast<const float*>(base) + i);
  } else if constexpr (kType == DType::kBFloat16) {
    return Io::LoadBf16(static_cast<const uint16_t*>(base) + i);
  } else {
    return Io::LoadFp16(static_cast<const uint16_t*>(base) + i);
  }
}

template <class Io, DType kType, bool kStream>
void Store(void* base, size_t i, const typename Io::F& x) {
  if constexpr (kType == DType::kFloat32) {
    float* p = static_cast<float*>(base) + i;
    if constexpr (kStream) {
      Io::StreamF32(p, x);
    } else {
      x.store_unaligned(p);
    }
  } else if constexpr (kType == DType::kBFloat16) {
    uint16_t* p = static_cast<uint16_t*>(base) + i;
    if constexpr (kStream) {
      Io::StreamBf16(p, x);
    } else {
      Io::StoreBf16(p, x);
    }
  } else {
    uint16_t* p = static_cast<uint16_t*>(base) + i;
    if constexpr (kStream) {
      Io::StreamFp16(p, x);
    } else {
      Io::StoreFp16(p, x);
    }
  }
}

constexpr DType CopyDType(ParamCopy copy) {
  return copy == ParamCopy::kFp32 ? DType::kFloat32 : copy == ParamCopy::kFp16 ? DType::kFloat16 : DType::kBFloat16;
}

template <class Io, DType kType>
bool CanStream(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (Io::kWidth * DTypeSizeBytes(kType)) == 0;
}

// Vectors of each array Adam handles together: each array's loads are
// grouped, then the updates, then each array's stores, which keeps more loads
// in flight in the memory-bound loop (8 of each on AVX-512's 32 registers;
// 4 where there are 16). The per-element operations are unchanged.
template <class Io>
constexpr size_t kAdamBlock = Io::kWidth >= 16 ? 8 : 4;

// Adam over [begin, end) in whole vectors; kStream: param_copy is written with
// non-temporal stores (and is aligned for them).
template <class Io, DType kGrad, ParamCopy kCopy, bool kStream>
void AdamVectors(const math::AdamCoefficients<typename Io::F>& k, float* params, float* exp_avg, float* exp_avg_sq,
                 const void* grads, void* param_copy, size_t num_vector_elems) {
  using F = typename Io::F;
  constexpr size_t W = Io::kWidth, B = kAdamBlock<Io>;
  const size_t blocked = num_vector_elems - num_vector_elems % (W * B);
  for (size_t i = 0; i < blocked; i += W * B) {
    F g[B], p[B], m[B], v[B];
    for (size_t j = 0; j < B; ++j) g[j] = Load<Io, kGrad>(grads, i + j * W);
    for (size_t j = 0; j < B; ++j) p[j] = F::load_unaligned(params + i + j * W);
    for (size_t j = 0; j < B; ++j) m[j] = F::load_unaligned(exp_avg + i + j * W);
    for (size_t j = 0; j < B; ++j) v[j] = F::load_unaligned(exp_avg_sq + i + j * W);
    for (size_t j = 0; j < B; ++j) math::AdamUpdate(k, g[j], p[j], m[j], v[j]);
    for (size_t j = 0; j < B; ++j) p[j].store_unaligned(params + i + j * W);
    for (size_t j = 0; j < B; ++j) m[j].store_unaligned(exp_avg + i + j * W);
    for (size_t j = 0; j < B; ++j) v[j].store_unaligned(exp_avg_sq + i + j * W);
    if constexpr (kCopy != ParamCopy::kNone) {
      for (size_t j = 0; j < B; ++j) Store<Io, CopyDType(kCopy), kStream>(param_copy, i + j * W, p[j]);
    }
  }
  for (size_t i = blocked; i < num_vector_elems; i += W) {
    const F g = Load<Io, kGrad>(grads, i);
    F p = F::load_unaligned(params + i);
    F m = F::load_unaligned(exp_avg + i);
    F v = F::load_unaligned(exp_avg_sq + i);
    math::AdamUpdate(k, g, p, m, v);
    p.store_unaligned(params + i);
    m.store_unaligned(exp_avg + i);
    v.store_unaligned(exp_avg_sq + i);
    if constexpr (kCopy != ParamCopy::kNone) Store<Io, CopyDType(kCopy), kStream>(param_copy, i, p);
  }
}

template <class Io, DType kGrad, ParamCopy kCopy>
void AdamSimd(const math::AdamStepConstants& c, float* params, float* exp_avg, float* exp_avg_sq, const void* grads,
              void* param_copy, size_t num_elems) {
  constexpr size_t W = Io::kWidth;
  const math::AdamCoefficients<typename Io::F> k(c);
  const size_t body = num_elems - num_elems % W;
  bool streamed = false;
  if constexpr (kCopy != ParamCopy::kNone) {
    streamed = CanStream<Io, CopyDType(kCopy)>(param_copy);
  }
  if (streamed) {
    AdamVectors<Io, kGrad, kCopy, true>(k, params, exp_avg, exp_avg_sq, grads, param_copy, body);
  } else {
    AdamVectors<Io, kGrad, kCopy, false>(k, params, exp_avg, exp_avg_sq, grads, param_copy, body);
  }
  if (const size_t rest = num_elems - body; rest > 0) {
    alignas(64) float p[W] = {}, m[W] = {}, v[W] = {};
    alignas(64) unsigned char g[W * 4] = {};
    alignas(64) unsigned char copy[W * 4] = {};
    std::memcpy(p, params + body, rest * sizeof(float));
    std::memcpy(m, exp_avg + body, rest * sizeof(float));
    std::memcpy(v, exp_avg_sq + body, rest * sizeof(float));
    std::memcpy(g, static_cast<const unsigned char*>(grads) + body * DTypeSizeBytes(kGrad),
                rest * DTypeSizeBytes(kGrad));
    AdamVectors<Io, kGrad, kCopy, false>(k, p, m, v, g, copy, W);
    std::memcpy(params + body, p, rest * sizeof(float));
    std::memcpy(exp_avg + body, m, rest * sizeof(float));
    std::memcpy(exp_avg_sq + body, v, rest * sizeof(float));
    if constexpr (kCopy != ParamCopy::kNone) {
      constexpr size_t kCopyBytes = DTypeSizeBytes(CopyDType(kCopy));
      std::memcpy(static_cast<unsigned char*>(param_copy) + body * kCopyBytes, copy, rest * kCopyBytes);
    }
  }
  if (streamed) _mm_sfence();  // order the non-temporal stores before whatever signals completion
}

// 16 lanes as 32 / kWidth double vectors; see kernels.h for the lane order.
template <class Io, DType kType>
void SumSquaresGroups(const void* data, size_t num_groups, xsimd::batch<double, typename Io::Arch>* acc) {
  using D = xsimd::batch<double, typename Io::Arch>;
  constexpr size_t kPerGroup = math::kNormLanes / Io::kWidth;  // float vectors per 16 elements
  for (size_t grp = 0; grp < num_groups; ++grp) {
    for (size_t b = 0; b < kPerGroup; ++b) {
      D lo, hi;
      Io::WidenToDouble(Load<Io, kType>(data, grp * math::kNormLanes + b * Io::kWidth), lo, hi);
      acc[2 * b] = acc[2 * b] + lo * lo;  // squares are exact in double
      acc[2 * b + 1] = acc[2 * b + 1] + hi * hi;
    }
  }
}

template <class Io, DType kType>
void SumSquaresSimd(const void* data, size_t num_elems, double lanes[math::kNormLanes]) {
  using D = xsimd::batch<double, typename Io::Arch>;
  constexpr size_t kAcc = 2 * math::kNormLanes / Io::kWidth;
  D acc[kAcc];
  for (size_t j = 0; j < kAcc; ++j) acc[j] = D(0.0);
  const size_t groups = num_elems / math::kNormLanes;
  SumSquaresGroups<Io, kType>(data, groups, acc);
  if (const size_t rest = num_elems - groups * math::kNormLanes; rest > 0) {
    // Zero padding adds +0.0 to the remaining lanes, which leaves them unchanged.
    alignas(64) unsigned char padded[math::kNormLanes * 4] = {};
    std::memcpy(padded, static_cast<const unsigned char*>(data) + groups * math::kNormLanes * DTypeSizeBytes(kType),
                rest * DTypeSizeBytes(kType));
    SumSquaresGroups<Io, kType>(padded, 1, acc);
  }
  for (size_t j = 0; j < kAcc; ++j) acc[j].store_unaligned(lanes + j * D::size);
}

template <class Io, DType kSrc, DType kDst, bool kStream>
void CastVectors(const void* src, void* dst, size_t num_vector_elems) {
  for (size_t i = 0; i < num_vector_elems; i += Io::kWidth) Store<Io, kDst, kStream>(dst, i, Load<Io, kSrc>(src, i));
}

template <class Io, DType kSrc, DType kDst>
void CastSimd(const void* src, void* dst, size_t num_elems) {
  constexpr size_t W = Io::kWidth;
  const size_t body = num_elems - num_elems % W;
  const bool streamed = CanStream<Io, kDst>(dst);
  if (streamed) {
    CastVectors<Io, kSrc, kDst, true>(src, dst, body);
  } else {
    CastVectors<Io, kSrc, kDst, false>(src, dst, body);
  }
  if (const size_t rest = num_elems - body; rest > 0) {
    alignas(64) unsigned char in[W * 4] = {}, out[W * 4] = {};
    std::memcpy(in, static_cast<const unsigned char*>(src) + body * DTypeSizeBytes(kSrc), rest * DTypeSizeBytes(kSrc));
    CastVectors<Io, kSrc, kDst, false>(in, out, W);
    std::memcpy(static_cast<unsigned char*>(dst) + body * DTypeSizeBytes(kDst), out, rest * DTypeSizeBytes(kDst));
  }
  if (streamed) _mm_sfence();
}

template <class Io, DType kGrad>
void FillAdamRow(KernelTable& t) {
  constexpr int g = static_cast<int>(kGrad);
  t.adam[g][0] = &AdamSimd<Io, kGrad, ParamCopy::kNone>;
  t.adam[g][1] = &AdamSimd<Io, kGrad, ParamCopy::kBf16>;
  t.adam[g][2] = &AdamSimd<Io, kGrad, ParamCopy::kFp16>;
  t.adam[g][3] = &AdamSimd<Io, kGrad, ParamCopy::kFp32>;
}

template <class Io>
KernelTable MakeSimdTable(SimdLevel level) {
  KernelTable t{};
  t.level = level;
  FillAdamRow<Io, DType::kFloat32>(t);
  FillAdamRow<Io, DType::kBFloat16>(t);
  FillAdamRow<Io, DType::kFloat16>(t);
  t.sum_squares[0] = &SumSquaresSimd<Io, DType::kFloat32>;
  t.sum_squares[1] = &SumSquaresSimd<Io, DType::kBFloat16>;
  t.sum_squares[2] = &SumSquaresSimd<Io, DType::kFloat16>;
  t.cast[0][1] = &CastSimd<Io, DType::kFloat32, DType::kBFloat16>;
  t.cast[0][2] = &CastSimd<Io, DType::kFloat32, DType::kFloat16>;
  t.cast[1][0] = &CastSimd<Io, DType::kBFloat16, DType::kFloat32>;
  t.cast[1][2] = &CastSimd<Io, DType::kBFloat16, DType::kFloat16>;
  t.cast[2][0] = &CastSimd<Io, DType::kFloat16, DType::kFloat32>;
  t.cast[2][1] = &CastSimd<Io, DType::kFloat16, DType::kBFloat16>;
  return t;
}

}  // namespace
}  // namespace zinf::cpu
