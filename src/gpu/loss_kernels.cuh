// The loss kernels of gpu/kernels.h (launched by loss_kernels.cu): softmax + cross-entropy over the
// vocabulary, its gradient (alone, or fused with the scaling and the bf16
// cast for bf16 products), the mean loss and the scaling by the count of
// targets. Built as gpu/kernels.cu is (--fmad=false, IEEE division), and
// with the CPU's 16-lane order of model/layers.cc (LaneMax, LaneExpSum)
// for the row sums and maxima, so probabilities and gradients are
// bit-identical to the CPU layers':
//   thread j < 16 accumulates lane j over the indices i ≡ j (mod 16) below
//     full = n - n % 16, in increasing order; thread 16 the tail, in order;
//   sums combine as (((0 + acc_0) + acc_1) + ... + acc_15) + tail; a
//   maximum starts at the tail's and takes the lanes 0..15, each step
//   `a > m ? a : m`.
//
// The kernels use only gpu/simt.cuh's instructions, so this header also
// compiles in a host compiler against the CPU emulation
// (tests/gpu/loss_kernels_emu_test.cc).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/float16.h"
#include "gpu/simt.cuh"
#include "math/gpt_math.h"
#include "math/lane_math.h"

namespace zinf::gpu::loss {

using math::kLanes;

// The row reductions of the loss over a whole block. A row of the vocabulary
// is long (32K to 256K) and there are few of them (a loss chunk), so 16 lane
// threads a row would leave the memory idle. Here every thread of the block
// loads: the row goes by in tiles of kLossTile elements, each thread loading
// its kLossPerThread elements of the tile at once (load(i)), mapping each
// (value(i, v), which may store to element i: it runs in the thread that
// loaded it) into shared memory; then thread j < 16 folds lane j's elements
// of the tile in increasing order and thread 16 the tail's, exactly the
// sequence of layers.cc's lane loops (a tile starts at a multiple of 16, so
// element i is the tile's i % 16 lane). On return scratch[j] holds lane j's
// accumulator (j < 16) and scratch[16] the tail's, each started from `init`.
constexpr unsigned kLossThreads = 256;
constexpr int kLossPerThread = 8;
constexpr int kLossTile = kLossThreads * kLossPerThread;
static_assert(kLossTile % kLanes == 0);

// The tile of a row from t0 (kLossTile elements, those below n): each
// thread's kLossPerThread loads (load(i)) are issued before any of its
// use(i, loaded), so they are in flight together.
template <class Load, class Use>
__device__ inline void RowTile(int64_t t0, int64_t n, const Load& load, const Use& use) {
  float v[kLossPerThread];
#pragma unroll
  for (int k = 0; k < kLossPerThread; ++k) {
    const int64_t i = t0 + threadIdx.x + k * kLossThreads;
    v[k] = i < n ? load(i) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kLossPerThread; ++k) {
    const int64_t i = t0 + threadIdx.x + k * kLossThreads;
    if (i < n) use(i, v[k]);
  }
}
// Every element of a row, a tile at a time.
template <class Load, class Use>
__device__ void ForRowTiles(int64_t n, const Load& load, const Use& use) {
  for (int64_t t0 = 0; t0 < n; t0 += kLossTile) RowTile(t0, n, load, use);
}

template <class Load, class Value, class Fold>
__device__ void LossRowLanes(int64_t n, float init, const Load& load, const Value& value, const Fold& fold, float* tile,
                             float* scratch) {
  const int64_t full = n - n % kLanes;
  float acc = init;  // lane threadIdx.x (< 16), or the tail (16)
  for (int64_t t0 = 0; t0 < n; t0 += kLossTile) {
    RowTile(t0, n, load, [&](int64_t i, float x) { tile[i - t0] = value(i, x); });
    simt::SyncThreads();
    const int64_t len = simt::Min(static_cast<int64_t>(kLossTile), n - t0);
    const int64_t lanes_end = simt::Min(len, full - t0);  // the tile's elements below `full`
    if (threadIdx.x < kLanes) {
      for (int64_t k = threadIdx.x; k < lanes_end; k += kLanes) acc = fold(acc, tile[k]);
    } else if (threadIdx.x == kLanes) {
      for (int64_t k = simt::Max(lanes_end, int64_t{0}); k < len; ++k) acc = fold(acc, tile[k]);
    }
    simt::SyncThreads();  // the tile is refilled next
  }
  if (threadIdx.x <= kLanes) scratch[threadIdx.x] = acc;
  simt::SyncThreads();
}

// A row's maximum (LaneMax: each lane and the tail from -inf, then the
// tail first and the lanes 0..15 in order) and its sum of exp(x - max)
// (LaneExpSum: the lanes from 0 in order, then the tail). store(i, e) sees
// each exp in the thread that computed it. Every thread of the block calls
// it; scratch is free again when it returns.
template <class Store>
__device__ void RowMaxExpSum(const float* xr, int64_t vocab, const Store& store, float* tile, float* scratch,
                             float& row_max, float& sum) {
  const auto max_of = [](float m, float a) { return a > m ? a : m; };
  LossRowLanes(
      vocab, -INFINITY, [&](int64_t i) { return xr[i]; }, [](int64_t, float x) { return x; }, max_of, tile, scratch);
  float m = scratch[kLanes];
  for (int j = 0; j < kLanes; ++j) m = max_of(m, scratch[j]);
  simt::SyncThreads();
  LossRowLanes(
      vocab, 0.0f, [&](int64_t i) { return xr[i]; },
      [&](int64_t i, float x) {
        const float e = math::SoftmaxExp(x, m);
        store(i, e);
        return e;
      },
      [](float a, float e) { return a + e; }, tile, scratch);
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += scratch[j];
  row_max = m;
  sum = s + scratch[kLanes];
  simt::SyncThreads();
}

__global__ void __launch_bounds__(kLossThreads)
    SoftmaxCrossEntropyForwardKernel(const float* logits, const int32_t* __restrict__ targets, float* probs,
                                     float* __restrict__ losses, int64_t rows, int64_t vocab, int64_t ld) {
  ZINF_STATIC_SMEM(float, tile, kLossTile);
  ZINF_STATIC_SMEM(float, scratch, kLanes + 1);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = logits + r * ld;
    float* pr = probs + r * ld;
    const int32_t t = targets[r];
    // The target's logit is read before the (possibly in-place) softmax
    // overwrites it; the maximum's barriers come between.
    const float target_logit = t >= 0 ? xr[t] : 0.0f;
    // out[i] = exp(x[i] - max), stored by the thread that loaded x[i].
    float row_max, sum;
    RowMaxExpSum(
        xr, vocab, [&](int64_t i, float e) { pr[i] = e; }, tile, scratch, row_max, sum);
    const float inv_sum = 1.0f / sum;
    ForRowTiles(
        vocab, [&](int64_t i) { return pr[i]; }, [&](int64_t i, float e) { pr[i] = e * inv_sum; });
    if (threadIdx.x == 0) losses[r] = t >= 0 ? math::CrossEntropyLoss(row_max, sum, target_logit) : 0.0f;
    simt::SyncThreads();  // scratch and the row's last reads before the next row
  }
}

__global__ void SoftmaxCrossEntropyBackwardKernel(const float* probs, const int32_t* __restrict__ targets,
                                                  float* dlogits, int64_t rows, int64_t vocab, int64_t ld,
                                                  float scale) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(vocab);
  for (size_t e = simt::GlobalThread(); e < n; e += simt::GridStride()) {
    const int64_t r = static_cast<int64_t>(e / static_cast<size_t>(vocab));
    const int64_t j = static_cast<int64_t>(e % static_cast<size_t>(vocab));
    const int64_t i = r * ld + j;
    const int32_t t = targets[r];
    dlogits[i] = t < 0 ? 0.0f : math::CrossEntropyLogitGrad(probs[i], j == t, scale);
  }
}

// SoftmaxCrossEntropyBackwardKernel with scale 1, ScaleByCountKernel and
// the fp32 -> bf16 cast in one pass: the same operations per element, in
// the same order. A block row (blockIdx.y) per logits row.
__global__ void SoftmaxCrossEntropyBackwardBf16Kernel(const float* __restrict__ probs,
                                                      const int32_t* __restrict__ targets,
                                                      uint16_t* __restrict__ dlogits, int64_t rows, int64_t vocab,
                                                      int64_t ld, float scale, const float* __restrict__ count) {
  const float c = *count;
  const float k = c > 0 ? scale / c : 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int32_t t = targets[r];
    const float* p = probs + r * ld;
    uint16_t* d = dlogits + r * ld;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < vocab; j += stride) {
      const float g = t < 0 ? 0.0f : math::CrossEntropyLogitGrad(p[j], j == t, 1.0f);
      d[j] = FloatToBf16Bits(k * g);
    }
  }
}

// SoftmaxCrossEntropyForwardKernel's maximum and exp-sum passes (the exps
// not stored), then per element its probability (the same exp, times the
// same 1 / sum) into SoftmaxCrossEntropyBackwardBf16Kernel's gradient.
__global__ void __launch_bounds__(kLossThreads)
    SoftmaxCrossEntropyGradBf16Kernel(const float* __restrict__ logits, const int32_t* __restrict__ targets,
                                      uint16_t* __restrict__ dlogits, int64_t rows, int64_t vocab, int64_t ld,
                                      float scale, const float* __restrict__ count) {
  ZINF_STATIC_SMEM(float, tile, kLossTile);
  ZINF_STATIC_SMEM(float, scratch, kLanes + 1);
  const float c = *count;
  const float k = c > 0 ? scale / c : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = logits + r * ld;
    uint16_t* d = dlogits + r * ld;
    const int32_t t = targets[r];
    if (t < 0) {  // an ignored row's gradient is zero
      for (int64_t j = threadIdx.x; j < vocab; j += kLossThreads) d[j] = FloatToBf16Bits(k * 0.0f);
      continue;
    }
    float row_max, sum;
    RowMaxExpSum(
        xr, vocab, [](int64_t, float) {}, tile, scratch, row_max, sum);
    const float inv_sum = 1.0f / sum;
    ForRowTiles(
        vocab, [&](int64_t i) { return xr[i]; },
        [&](int64_t i, float x) {
          const float p = math::SoftmaxExp(x, row_max) * inv_sum;
          d[i] = FloatToBf16Bits(k * math::CrossEntropyLogitGrad(p, i == t, 1.0f));
        });
    simt::SyncThreads();  // scratch before the next row
  }
}

// One thread: the losses summed in double in row order, as GptModel does.
__global__ void MeanLossKernel(const float* losses, const int32_t* targets, int64_t rows, float* loss, float* count) {
  double sum = 0;
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    sum += losses[r];
    n += targets[r] >= 0;
  }
  if (loss) *loss = n ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f;
  *count = static_cast<float>(n);
}

__global__ void ScaleByCountKernel(float* x, size_t n, float scale, const float* count) {
  const float c = *count;
  const float k = c > 0 ? scale / c : 0.0f;
  for (size_t i = simt::GlobalThread(); i < n; i += simt::GridStride()) x[i] = k * x[i];
}

// The forward and the one-kernel gradient: a block per row, at most 65535.
inline unsigned BlocksForRows(int64_t rows) { return static_cast<unsigned>(rows < 65535 ? rows : 65535); }

}  // namespace zinf::gpu::loss
