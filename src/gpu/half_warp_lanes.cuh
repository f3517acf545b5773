// The 16 lanes of math/lane_math.h on a half-warp: thread j of a row's 16
// threads holds lane j (elements j, j + 16, ... of the row's full groups of
// 16, which the half-warp reads 64 contiguous bytes at a time) and thread
// k < n % 16 the tail element k. Combining them by shuffles in the CPU's
// order (the lanes 0..15 from zero, then the tail from zero, then the two
// added) gives every thread the CPU row function's sum bit for bit. Used by
// the causal softmax (gpu/kernels.cu) and the RMSNorm rows
// (gpu/decoder_kernels.cuh). Over gpu/simt.cuh: device code, or the CPU
// emulation in a host compiler.
#pragma once

#include <cstdint>

#include "gpu/simt.cuh"
#include "math/lane_math.h"

namespace zinf::gpu {

// The shuffle mask of the calling thread's half-warp.
__device__ inline unsigned HalfWarpMask() { return 0xffffu << (threadIdx.x & 16u); }
// Thread `lane` (0..15) of the calling half-warp's value of v.
__device__ inline float LaneOf(unsigned mask, float v, int lane) { return simt::ShflIdx(mask, v, lane, model::kLanes); }
// Σ over the 16 lanes in order, then + Σ over the `tail` tail values in order
// (tail < 16; thread k holds tail value k). Every thread of the half-warp
// must call it.
__device__ inline float LaneSumThenTail(unsigned mask, float lane_acc, float tail_value, int64_t tail) {
  float s = 0.0f;
  for (int j = 0; j < model::kLanes; ++j) s += LaneOf(mask, lane_acc, j);
  float t = 0.0f;
  for (int k = 0; k < tail; ++k) t += LaneOf(mask, tail_value, k);
  return s + t;
}

}  // namespace zinf::gpu
