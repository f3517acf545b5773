// The elementwise kernels of gpu/kernels.h (launched by kernels.cu): casts
// between fp32, bf16 and fp16, the residual add, GELU and its gradient, and
// a bias broadcast over rows. Each is ForEach's loop (gpu/elementwise.cuh):
// groups of eight elements through 16-byte accesses where the arrays allow
// it, one element a thread otherwise, with the same per-element function
// (math/dtype_access.h's conversions, math/gpt_math.h's GELU) either way, so
// both give the CPU's bits. Built as kernels.cu is (--fmad=false, IEEE
// division and sqrt).
//
// The header compiles in a host compiler too, against the CPU emulation
// (tests/gpu/elementwise_kernels_emu_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpu/elementwise.cuh"
#include "math/dtype_access.h"
#include "math/gpt_math.h"

namespace zinf::gpu::elementwise {

// dst[i] = src[i] in dst's type (rounded to nearest even when narrowing).
template <DType kSrc, DType kDst>
__global__ void CastKernel(const void* __restrict__ src, void* __restrict__ dst, size_t n, bool vector) {
  constexpr size_t kSrcBytes = kSrc == DType::kFloat32 ? 4 : 2, kDstBytes = kDst == DType::kFloat32 ? 4 : 2;
  ForEach(
      n, vector,
      [&](size_t i) {
        float v[kVec];
        Load8<kSrc>(static_cast<const char*>(src) + i * kSrcBytes, v);
        Store8<kDst>(static_cast<char*>(dst) + i * kDstBytes, v);
      },
      [&](size_t i) { math::StoreFromFloat<kDst>(dst, i, math::LoadAsFloat<kSrc>(src, i)); });
}
inline bool CastVector(const void* src, const void* dst) { return Aligned16(src) && Aligned16(dst); }

// out[i] = a[i] + b[i]; out may be a or b (each element is read before the
// thread writes it, and no other thread touches it).
__global__ void AddKernel(const float* a, const float* b, float* out, size_t n, bool vector) {
  ForEach(
      n, vector,
      [&](size_t i) {
        float x[kVec], y[kVec];
        Load8(a + i, x);
        Load8(b + i, y);
#pragma unroll
        for (int k = 0; k < kVec; ++k) x[k] = x[k] + y[k];
        Store8(out + i, x);
      },
      [&](size_t i) { out[i] = a[i] + b[i]; });
}
inline bool AddVector(const float* a, const float* b, const float* out) {
  return Aligned16(a) && Aligned16(b) && Aligned16(out);
}

// y = GELU(x), fp32 (y may be x) or (Out = uint16_t) bf16.
template <class Out>
__global__ void GeluForwardKernel(const float* x, Out* y, size_t n, bool vector) {
  ForEach(
      n, vector,
      [&](size_t i) {
        float v[kVec];
        Load8(x + i, v);
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[k] = math::Gelu(v[k]);
        Store8(y + i, v);
      },
      [&](size_t i) { simt::StoreAs(y + i, math::Gelu(x[i])); });
}

// dx = GELU'(x) · dy; dx may be x or dy.
__global__ void GeluBackwardKernel(const float* x, const float* dy, float* dx, size_t n, bool vector) {
  ForEach(
      n, vector,
      [&](size_t i) {
        float v[kVec], d[kVec];
        Load8(x + i, v);
        Load8(dy + i, d);
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[k] = math::GeluGrad(v[k]) * d[k];
        Store8(dx + i, v);
      },
      [&](size_t i) { dx[i] = math::GeluGrad(x[i]) * dy[i]; });
}

// out[i] = row[i % cols] over n = rows · cols elements; groups need whole
// groups in a row (cols % 8 == 0).
__global__ void BroadcastRowKernel(const float* __restrict__ row, float* __restrict__ out, size_t n, int64_t cols,
                                   bool vector) {
  ForEach(
      n, vector,
      [&](size_t i) {
        float v[kVec];
        Load8(row + static_cast<int64_t>(i) % cols, v);
        Store8(out + i, v);
      },
      [&](size_t i) { out[i] = row[static_cast<int64_t>(i) % cols]; });
}
inline bool BroadcastVector(const float* row, const float* out, int64_t cols) {
  return Aligned16(row) && Aligned16(out) && cols % kVec == 0;
}

}  // namespace zinf::gpu::elementwise
