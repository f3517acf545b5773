// The loss kernels of gpu/kernels.h: softmax + cross-entropy over the
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
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/float16.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels.h"
#include "gpu/launch_util.cuh"
#include "math/gpt_math.h"
#include "math/lane_math.h"

namespace zinf::gpu {
namespace {

using model::kLanes;

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = size_t{1} << 16;

unsigned BlocksFor(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}
unsigned BlocksForRows(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65535)); }

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

template <class Load, class Value, class Fold>
__device__ void LossRowLanes(int64_t n, float init, const Load& load, const Value& value, const Fold& fold,
                             float* tile, float* scratch) {
  const int64_t full = n - n % kLanes;
  float acc = init;  // lane threadIdx.x (< 16), or the tail (16)
  for (int64_t t0 = 0; t0 < n; t0 += kLossTile) {
    float v[kLossPerThread];
#pragma unroll
    for (int k = 0; k < kLossPerThread; ++k) {
      const int64_t i = t0 + threadIdx.x + k * kLossThreads;
      v[k] = i < n ? load(i) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kLossPerThread; ++k) {
      const int64_t i = t0 + threadIdx.x + k * kLossThreads;
      if (i < n) tile[threadIdx.x + k * kLossThreads] = value(i, v[k]);
    }
    __syncthreads();
    const int64_t len = min(static_cast<int64_t>(kLossTile), n - t0);
    const int64_t lanes_end = min(len, full - t0);  // the tile's elements below `full`
    if (threadIdx.x < kLanes) {
      for (int64_t k = threadIdx.x; k < lanes_end; k += kLanes) acc = fold(acc, tile[k]);
    } else if (threadIdx.x == kLanes) {
      for (int64_t k = max(lanes_end, int64_t{0}); k < len; ++k) acc = fold(acc, tile[k]);
    }
    __syncthreads();  // the tile is refilled next
  }
  if (threadIdx.x <= kLanes) scratch[threadIdx.x] = acc;
  __syncthreads();
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
  __syncthreads();
  LossRowLanes(
      vocab, 0.0f, [&](int64_t i) { return xr[i]; },
      [&](int64_t i, float x) {
        const float e = model::SoftmaxExp(x, m);
        store(i, e);
        return e;
      },
      [](float a, float e) { return a + e; }, tile, scratch);
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += scratch[j];
  row_max = m;
  sum = s + scratch[kLanes];
  __syncthreads();
}

__global__ void __launch_bounds__(kLossThreads)
    SoftmaxCrossEntropyForwardKernel(const float* logits, const int32_t* __restrict__ targets, float* probs,
                                     float* __restrict__ losses, int64_t rows, int64_t vocab, int64_t ld) {
  __shared__ float tile[kLossTile];
  __shared__ float scratch[kLanes + 1];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = logits + r * ld;
    float* pr = probs + r * ld;
    const int32_t t = targets[r];
    // The target's logit is read before the (possibly in-place) softmax
    // overwrites it; the maximum's barriers come between.
    const float target_logit = t >= 0 ? xr[t] : 0.0f;
    // out[i] = exp(x[i] - max), stored by the thread that loaded x[i].
    float row_max, sum;
    RowMaxExpSum(xr, vocab, [&](int64_t i, float e) { pr[i] = e; }, tile, scratch, row_max, sum);
    const float inv_sum = 1.0f / sum;
    for (int64_t t0 = 0; t0 < vocab; t0 += kLossTile) {
      float v[kLossPerThread];
#pragma unroll
      for (int k = 0; k < kLossPerThread; ++k) {
        const int64_t i = t0 + threadIdx.x + k * kLossThreads;
        v[k] = i < vocab ? pr[i] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kLossPerThread; ++k) {
        const int64_t i = t0 + threadIdx.x + k * kLossThreads;
        if (i < vocab) pr[i] = v[k] * inv_sum;
      }
    }
    if (threadIdx.x == 0) losses[r] = t >= 0 ? model::CrossEntropyLoss(row_max, sum, target_logit) : 0.0f;
    __syncthreads();  // scratch and the row's last reads before the next row
  }
}

__global__ void SoftmaxCrossEntropyBackwardKernel(const float* probs, const int32_t* __restrict__ targets,
                                                  float* dlogits, int64_t rows, int64_t vocab, int64_t ld,
                                                  float scale) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(vocab);
  for (size_t e = GlobalThread(); e < n; e += GridStride()) {
    const int64_t r = static_cast<int64_t>(e / static_cast<size_t>(vocab));
    const int64_t j = static_cast<int64_t>(e % static_cast<size_t>(vocab));
    const int64_t i = r * ld + j;
    const int32_t t = targets[r];
    dlogits[i] = t < 0 ? 0.0f : model::CrossEntropyLogitGrad(probs[i], j == t, scale);
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
      const float g = t < 0 ? 0.0f : model::CrossEntropyLogitGrad(p[j], j == t, 1.0f);
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
  __shared__ float tile[kLossTile];
  __shared__ float scratch[kLanes + 1];
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
    RowMaxExpSum(xr, vocab, [](int64_t, float) {}, tile, scratch, row_max, sum);
    const float inv_sum = 1.0f / sum;
    for (int64_t t0 = 0; t0 < vocab; t0 += kLossTile) {
      float v[kLossPerThread];
#pragma unroll
      for (int q = 0; q < kLossPerThread; ++q) {
        const int64_t i = t0 + threadIdx.x + q * kLossThreads;
        v[q] = i < vocab ? xr[i] : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < kLossPerThread; ++q) {
        const int64_t i = t0 + threadIdx.x + q * kLossThreads;
        if (i < vocab) {
          const float p = model::SoftmaxExp(v[q], row_max) * inv_sum;
          d[i] = FloatToBf16Bits(k * model::CrossEntropyLogitGrad(p, i == t, 1.0f));
        }
      }
    }
    __syncthreads();  // scratch before the next row
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
  for (size_t i = GlobalThread(); i < n; i += GridStride()) x[i] = k * x[i];
}

Status CheckLossRows(const char* fn, int64_t rows, int64_t vocab, int64_t ld) {
  ZINF_RETURN_IF_ERROR(CheckRows(fn, rows, vocab, "vocab"));
  if (ld < vocab) {
    return InvalidArgument(std::string(fn) + ": row stride " + std::to_string(ld) + " below vocab " +
                           std::to_string(vocab));
  }
  return Status::Ok();
}

}  // namespace

Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* targets, float* probs, float* losses,
                                  int64_t rows, int64_t vocab, int64_t ld, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckLossRows("gpu::SoftmaxCrossEntropyForward", rows, vocab, ld));
  if (rows == 0) return Status::Ok();
  if (!logits || !targets || !probs || !losses)
    return InvalidArgument("gpu::SoftmaxCrossEntropyForward: null logits, targets, probs or losses");
  SoftmaxCrossEntropyForwardKernel<<<BlocksForRows(rows), kLossThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, targets, probs, losses, rows, vocab, ld);
  return ZINF_CHECK_LAUNCH("SoftmaxCrossEntropyForwardKernel");
}

Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, int64_t rows,
                                   int64_t vocab, int64_t ld, float scale, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckLossRows("gpu::SoftmaxCrossEntropyBackward", rows, vocab, ld));
  if (rows == 0) return Status::Ok();
  if (!probs || !targets || !dlogits)
    return InvalidArgument("gpu::SoftmaxCrossEntropyBackward: null probs, targets or dlogits");
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(vocab);
  SoftmaxCrossEntropyBackwardKernel<<<BlocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      probs, targets, dlogits, rows, vocab, ld, scale);
  return ZINF_CHECK_LAUNCH("SoftmaxCrossEntropyBackwardKernel");
}

Status SoftmaxCrossEntropyBackwardBf16(const float* probs, const int32_t* targets, uint16_t* dlogits, int64_t rows,
                                       int64_t vocab, int64_t ld, float scale, const float* count, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckLossRows("gpu::SoftmaxCrossEntropyBackwardBf16", rows, vocab, ld));
  if (rows == 0) return Status::Ok();
  if (!probs || !targets || !dlogits || !count)
    return InvalidArgument("gpu::SoftmaxCrossEntropyBackwardBf16: null probs, targets, dlogits or count");
  // Blocks across a row: enough for 4 elements a thread, at most 64.
  const int64_t across = std::min<int64_t>(64, (vocab + 4 * kThreads - 1) / (4 * kThreads));
  const dim3 grid(static_cast<unsigned>(across), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  SoftmaxCrossEntropyBackwardBf16Kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      probs, targets, dlogits, rows, vocab, ld, scale, count);
  return ZINF_CHECK_LAUNCH("SoftmaxCrossEntropyBackwardBf16Kernel");
}

Status SoftmaxCrossEntropyGradBf16(const float* logits, const int32_t* targets, uint16_t* dlogits, int64_t rows,
                                   int64_t vocab, int64_t ld, float scale, const float* count, void* stream) {
  const char* fn = "gpu::SoftmaxCrossEntropyGradBf16";
  ZINF_RETURN_IF_ERROR(CheckLossRows(fn, rows, vocab, ld));
  if (rows == 0) return Status::Ok();
  if (!logits || !targets || !dlogits || !count) {
    return InvalidArgument(std::string(fn) + ": null logits, targets, dlogits or count");
  }
  const size_t n = static_cast<size_t>((rows - 1) * ld + vocab);
  if (Overlap(logits, n * 4, dlogits, n * 2)) return InvalidArgument(std::string(fn) + ": dlogits overlaps logits");
  SoftmaxCrossEntropyGradBf16Kernel<<<BlocksForRows(rows), kLossThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, targets, dlogits, rows, vocab, ld, scale, count);
  return ZINF_CHECK_LAUNCH("SoftmaxCrossEntropyGradBf16Kernel");
}

Status MeanLoss(const float* losses, const int32_t* targets, int64_t rows, float* loss, float* count, void* stream) {
  if (rows < 0) return InvalidArgument("gpu::MeanLoss: rows " + std::to_string(rows));
  if (!count || (rows > 0 && (!losses || !targets))) return InvalidArgument("gpu::MeanLoss: null losses, targets or count");
  MeanLossKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(losses, targets, rows, loss, count);
  return ZINF_CHECK_LAUNCH("MeanLossKernel");
}

Status ScaleByCount(float* x, size_t n, float scale, const float* count, void* stream) {
  if (n == 0) return Status::Ok();
  if (!x || !count) return InvalidArgument("gpu::ScaleByCount: null x or count");
  ScaleByCountKernel<<<BlocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, scale, count);
  return ZINF_CHECK_LAUNCH("ScaleByCountKernel");
}

}  // namespace zinf::gpu
