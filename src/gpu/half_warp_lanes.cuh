// The 16 lanes of math/lane_math.h on a half-warp: thread j of a row's 16
// threads holds lane j (elements j, j + 16, ... of the row's full groups of
// 16, which the half-warp reads 64 contiguous bytes at a time) and thread
// k < n % 16 the tail element k. Combining them by shuffles in the CPU's
// order (the lanes 0..15 from zero, then the tail from zero, then the two
// added) gives every thread the CPU row function's sum bit for bit. Used by
// the causal softmax (gpu/kernels.cu), the RMSNorm rows
// (gpu/decoder_kernels.cuh) and the LayerNorm rows
// (gpu/layernorm_kernels.cuh). Over gpu/simt.cuh: device code, or the CPU
// emulation in a host compiler.
#pragma once

#include <cstdint>

#include "gpu/simt.cuh"
#include "math/lane_math.h"

namespace zinf::gpu {

// The shuffle mask of the calling thread's half-warp.
__device__ inline unsigned HalfWarpMask() { return 0xffffu << (threadIdx.x & 16u); }
// Thread `lane` (0..15) of the calling half-warp's value of v.
__device__ inline float LaneOf(unsigned mask, float v, int lane) { return simt::ShflIdx(mask, v, lane, math::kLanes); }
// Σ over the 16 lanes in order, then + Σ over the `tail` tail values in order
// (tail < 16; thread k holds tail value k). Every thread of the half-warp
// must call it.
__device__ inline float LaneSumThenTail(unsigned mask, float lane_acc, float tail_value, int64_t tail) {
  float s = 0.0f;
  for (int j = 0; j < math::kLanes; ++j) s += LaneOf(mask, lane_acc, j);
  float t = 0.0f;
  for (int k = 0; k < tail; ++k) t += LaneOf(mask, tail_value, k);
  return s + t;
}

// The calling half-warp's first row and the stride between its rows.
__device__ inline int64_t HalfWarpRow() { return static_cast<int64_t>(simt::GlobalThread() / math::kLanes); }
__device__ inline int64_t HalfWarpRowStride() { return static_cast<int64_t>(simt::GridStride() / math::kLanes); }

// The calling lane's elements c = lane, lane + 16, ... below `end`, in
// increasing order: load(c) of a batch of kBatch of them is issued before
// use(c, loaded) of any, so the loads are in flight together and a use may
// store to its own element (x and y, or dy and dx, may be one buffer: without
// the batch, each load would wait for the store before it). What is left
// after the batches of kBatch goes in batches of kRowBatch, then singly. A
// row of a model's width (2048: 128 elements a lane) is a few round trips to
// memory in batches of 32 where it was 16 in batches of 8; a row kernel's
// grid is one half-warp a row, too few threads to hide the latency
// otherwise (4096 rows: 16 warps a SM on an H100). Used by the RMSNorm
// (gpu/decoder_kernels.cuh) and LayerNorm (gpu/layernorm_kernels.cuh) rows.
constexpr int kRowBatch = 8;
template <int kBatch, class Load, class Use>
__device__ inline int64_t LaneBatchesOf(int64_t c, int64_t end, const Load& load, const Use& use) {
  using Loaded = decltype(load(int64_t{0}));
  for (; c + (kBatch - 1) * math::kLanes < end; c += kBatch * math::kLanes) {
    Loaded v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) v[k] = load(c + k * math::kLanes);
#pragma unroll
    for (int k = 0; k < kBatch; ++k) use(c + k * math::kLanes, v[k]);
  }
  return c;
}
template <int kBatch = kRowBatch, class Load, class Use>
__device__ inline void ForLaneBatches(int lane, int64_t end, const Load& load, const Use& use) {
  int64_t c = LaneBatchesOf<kBatch>(lane, end, load, use);
  if constexpr (kBatch > kRowBatch) c = LaneBatchesOf<kRowBatch>(c, end, load, use);
  for (; c < end; c += math::kLanes) use(c, load(c));
}
// The batches of the norms' row kernels: 32 single floats or pairs
// (forward), 16 sets of up to four (backward's dy, w, x and dx): at most 64
// registers of loads.
constexpr int kForwardRowBatch = 32;
constexpr int kBackwardRowBatch = 16;

}  // namespace zinf::gpu
