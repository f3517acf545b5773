// The loop of the elementwise kernels (casts, residual adds, GELU, SwiGLU,
// RoPE ...): a grid-stride loop over groups of kVec = 8 elements, each
// moved by 16-byte loads and stores, when every array the kernel touches is
// 16-byte aligned (and, for row-shaped kernels, a row holds whole groups);
// then the elements past the last whole group, one a thread. Otherwise every
// element one a thread, as before. An element's value is computed by the
// same per-element function either way, so the two paths give the same
// bits; only the memory traffic differs (one 16-byte access where a warp
// made eight 2- or 4-byte ones).
//
// Uses only gpu/simt.cuh, so the kernels built on it also run in the CPU
// emulation (tests/gpu/elementwise_kernels_emu_test.cc), which faults a
// misaligned vector access as the hardware would.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/float16.h"
#include "gpu/simt.cuh"
#include "zinf/dtype.h"

namespace zinf::gpu::elementwise {

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = size_t{1} << 16;
constexpr int kVec = 8;

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The grid of a loop over `items` (groups or elements), kThreads a block.
inline unsigned BlocksFor(size_t items) {
  const size_t b = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b == 0 ? 1 : (b < kMaxBlocks ? b : kMaxBlocks));
}
// The grid of ForEach over n elements: enough threads for the groups (or
// for every element without `vector`).
inline unsigned BlocksForElements(size_t n, bool vector) { return BlocksFor(vector ? n / kVec : n); }

// group(i) for i = 0, 8, 16 ... below n - n % 8 when `vector` (each call owns
// elements [i, i + 8)), then one(i) for every element not in a group. Called
// by every thread of the grid.
template <class Group, class One>
__device__ inline void ForEach(size_t n, bool vector, const Group& group, const One& one) {
  const size_t groups = vector ? n / kVec : 0;
  for (size_t v = simt::GlobalThread(); v < groups; v += simt::GridStride()) group(v * kVec);
  for (size_t i = groups * kVec + simt::GlobalThread(); i < n; i += simt::GridStride()) one(i);
}

// ---- eight elements through 16-byte accesses (p 16-byte aligned) ----

// 16-bit element k of four words (element 0 in the low half of word 0).
__device__ inline uint16_t Half(const simt::Words4& w, int k) {
  const uint32_t word = k < 2 ? w.x : k < 4 ? w.y : k < 6 ? w.z : w.w;
  return static_cast<uint16_t>(k % 2 == 0 ? word & 0xffffu : word >> 16);
}
__device__ inline uint32_t Pair(uint16_t lo, uint16_t hi) { return lo | static_cast<uint32_t>(hi) << 16; }

// Elements [0, 8) at p, widened to fp32 (common/float16.h, as LoadAsFloat).
template <DType kType>
__device__ inline void Load8(const void* p, float (&v)[kVec]) {
  if constexpr (kType == DType::kFloat32) {
    const simt::Words4 a = simt::Load16(p);
    const simt::Words4 b = simt::Load16(static_cast<const float*>(p) + 4);
    const uint32_t w[kVec] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = BitsToFloat(w[k]);
  } else {
    const simt::Words4 a = simt::Load16(p);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      v[k] = kType == DType::kBFloat16 ? Bf16BitsToFloat(Half(a, k)) : HalfBitsToFloat(Half(a, k));
    }
  }
}
// v into elements [0, 8) at p, rounded to nearest even for the 16-bit types
// (as StoreFromFloat).
template <DType kType>
__device__ inline void Store8(void* p, const float (&v)[kVec]) {
  if constexpr (kType == DType::kFloat32) {
    simt::Store16(p, simt::Words4{FloatToBits(v[0]), FloatToBits(v[1]), FloatToBits(v[2]), FloatToBits(v[3])});
    simt::Store16(static_cast<float*>(p) + 4,
                  simt::Words4{FloatToBits(v[4]), FloatToBits(v[5]), FloatToBits(v[6]), FloatToBits(v[7])});
  } else {
    uint16_t h[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) h[k] = kType == DType::kBFloat16 ? FloatToBf16Bits(v[k]) : FloatToHalfBits(v[k]);
    simt::Store16(p, simt::Words4{Pair(h[0], h[1]), Pair(h[2], h[3]), Pair(h[4], h[5]), Pair(h[6], h[7])});
  }
}
// The typed forms: fp32 arrays, and uint16_t arrays holding bf16 (the kernels'
// Out = uint16_t, simt::StoreAs's rounding; an input kept in bf16 alone).
__device__ inline void Load8(const float* p, float (&v)[kVec]) { Load8<DType::kFloat32>(p, v); }
__device__ inline void Load8(const uint16_t* p, float (&v)[kVec]) { Load8<DType::kBFloat16>(p, v); }
// One element of either, as fp32 (the one-a-thread path's load).
__device__ inline float LoadAs(const float* p) { return *p; }
__device__ inline float LoadAs(const uint16_t* p) { return Bf16BitsToFloat(*p); }
__device__ inline void Store8(float* p, const float (&v)[kVec]) { Store8<DType::kFloat32>(p, v); }
__device__ inline void Store8(uint16_t* p, const float (&v)[kVec]) { Store8<DType::kBFloat16>(p, v); }

}  // namespace zinf::gpu::elementwise
