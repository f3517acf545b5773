// The kernels of gpu/kernels.h. Elementwise kernels are grid-stride loops
// (256 threads a block, at most 65536 blocks) over the shared per-element
// functions; the casts, residual add, GELU and bias broadcast take eight
// elements a thread through 16-byte accesses where the arrays allow it
// (gpu/elementwise_kernels.cuh). Built with --fmad=false and IEEE division
// and sqrt (no --use_fast_math), so each element rounds the same operations
// in the same order as the CPU twin.
//
// The row sums (LayerNorm's, in gpu/layernorm_kernels.cuh, and the causal
// softmax's) run on half-warps and reproduce the 16-lane order of
// model/layers.cc exactly (gpu/half_warp_lanes.cuh): with full = n - n % 16,
// lane j accumulates acc_j = ((0 + t[j]) + t[j+16]) + ... over the indices
// below `full`; the tail is ((0 + t[full]) + t[full+1]) + ...; the row's sum
// is (((0 + acc_0) + acc_1) + ... + acc_15) + tail (a maximum takes the
// same order with `a > m ? a : m` from -inf). That is the CPU's sequence of
// additions, so the sums, and everything computed from them, are
// bit-identical to the CPU layers. Column sums (LayerNorm's dw, db, the bias
// gradients) add in lane_math.h's row chunks, the chunks of a column in
// parallel, then the partials in chunk order, as the CPU does.
#include "gpu/kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "math/dtype_access.h"
#include "common/float16.h"
#include "math/norm_math.h"
#include "gpu/cuda_check.h"
#include "gpu/elementwise_kernels.cuh"
#include "gpu/layernorm_kernels.cuh"
#include "gpu/half_warp_lanes.cuh"
#include "gpu/launch_util.cuh"
#include "math/gpt_math.h"
#include "math/lane_math.h"

namespace zinf::gpu {
namespace {

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = size_t{1} << 16;
constexpr int kLanes = 16;  // the lane count of model/layers.cc

unsigned BlocksFor(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}
unsigned BlocksForRows(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, 65535)); }
// Column kernels: a block per 32 columns (the grid takes 2^31 - 1 of them).
unsigned ColumnTiles(int64_t cols) { return static_cast<unsigned>((cols + 31) / 32); }

// ---- Adam ----

// kCopy: 0 none, else the DType of the parameter copy.
template <DType kGrad, int kCopy>
__global__ void AdamKernel(math::AdamStepConstants c, float* __restrict__ params, float* __restrict__ exp_avg,
                           float* __restrict__ exp_avg_sq, const void* __restrict__ grads, void* __restrict__ copy,
                           size_t n) {
  const math::AdamCoefficients<float> k(c);
  for (size_t i = GlobalThread(); i < n; i += GridStride()) {
    float p = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    math::AdamUpdate(k, math::LoadAsFloat<kGrad>(grads, i), p, m, v);
    params[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if constexpr (kCopy == 1) math::StoreFromFloat<DType::kBFloat16>(copy, i, p);
    if constexpr (kCopy == 2) math::StoreFromFloat<DType::kFloat16>(copy, i, p);
  }
}

template <DType kGrad>
Status LaunchAdam(const math::AdamStepConstants& c, float* p, float* m, float* v, const void* g, void* copy,
                  DType copy_dtype, size_t n, cudaStream_t stream) {
  const unsigned blocks = BlocksFor(n);
  if (copy == nullptr) {
    AdamKernel<kGrad, 0><<<blocks, kThreads, 0, stream>>>(c, p, m, v, g, copy, n);
  } else if (copy_dtype == DType::kBFloat16) {
    AdamKernel<kGrad, 1><<<blocks, kThreads, 0, stream>>>(c, p, m, v, g, copy, n);
  } else {
    AdamKernel<kGrad, 2><<<blocks, kThreads, 0, stream>>>(c, p, m, v, g, copy, n);
  }
  return ZINF_CHECK_LAUNCH("AdamKernel");
}

// ---- casts (gpu/elementwise_kernels.cuh) ----

template <DType kSrc>
Status LaunchCast(const void* src, void* dst, DType dst_dtype, size_t n, cudaStream_t stream) {
  using elementwise::CastKernel;
  const bool vector = elementwise::CastVector(src, dst);
  const unsigned blocks = elementwise::BlocksForElements(n, vector);
  constexpr unsigned kT = elementwise::kThreads;
  switch (dst_dtype) {
    case DType::kFloat32:
      CastKernel<kSrc, DType::kFloat32><<<blocks, kT, 0, stream>>>(src, dst, n, vector);
      break;
    case DType::kBFloat16:
      CastKernel<kSrc, DType::kBFloat16><<<blocks, kT, 0, stream>>>(src, dst, n, vector);
      break;
    case DType::kFloat16:
      CastKernel<kSrc, DType::kFloat16><<<blocks, kT, 0, stream>>>(src, dst, n, vector);
      break;
  }
  return ZINF_CHECK_LAUNCH("CastKernel");
}

// ---- gradient norm partials and accumulation ----

// One thread block per norm block. The sum is a chain per lane (lane l adds
// the squares of elements l, l + 16, l + 32, ... in order, as the CPU's lane
// l does), so only 16 threads can add; what keeps the memory busy is the
// rest of the block: warps 1-7 load the next kNormChunk elements into
// shared memory while warp 0's first 16 lanes add the current ones (two
// buffers, one barrier a chunk). Lane 0 then combines the 16 lanes.
constexpr int kNormThreads = 256;
constexpr int kNormLoaders = kNormThreads - 32;
constexpr int kNormChunk = 4096;  // elements a stage: 16 KiB, 256 per lane
static_assert(kNormChunk % math::kNormLanes == 0 && math::kNormBlockElems % kNormChunk == 0,
              "a chunk starts every lane at its own elements");

// Elements [0, count) of src into dst by the loaders (t = 0 .. kNormLoaders - 1):
// every load of a thread issued before its first store.
__device__ inline void LoadNormChunk(float* __restrict__ dst, const float* __restrict__ src, int count, bool vec,
                                     int t) {
  if (vec) {
    constexpr int kPer = (kNormChunk / 4 + kNormLoaders - 1) / kNormLoaders;
    const int quads = count / 4;
    float4 v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int q = t + k * kNormLoaders;
      if (q < quads) v[k] = reinterpret_cast<const float4*>(src)[q];
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int q = t + k * kNormLoaders;
      if (q < quads) reinterpret_cast<float4*>(dst)[q] = v[k];
    }
    for (int i = quads * 4 + t; i < count; i += kNormLoaders) dst[i] = src[i];
  } else {
    constexpr int kPer = (kNormChunk + kNormLoaders - 1) / kNormLoaders;
    float v[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = t + k * kNormLoaders;
      if (i < count) v[k] = src[i];
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = t + k * kNormLoaders;
      if (i < count) dst[i] = v[k];
    }
  }
}

__global__ void __launch_bounds__(kNormThreads)
    SumSquaresBlocksKernel(const float* __restrict__ data, size_t n, double* __restrict__ out) {
  __shared__ __align__(16) float stage[2][kNormChunk];
  __shared__ double lanes[math::kNormLanes];
  const size_t begin = static_cast<size_t>(blockIdx.x) * math::kNormBlockElems;
  const size_t left = n - begin;
  const int count = static_cast<int>(left < math::kNormBlockElems ? left : math::kNormBlockElems);
  const int chunks = (count + kNormChunk - 1) / kNormChunk;
  const float* src = data + begin;
  const bool vec = (reinterpret_cast<uintptr_t>(data) & 15) == 0;  // begin is a multiple of 4 elements
  const bool loader = threadIdx.x >= 32;
  const int lane = static_cast<int>(threadIdx.x);
  auto chunk_count = [&](int c) { return count - c * kNormChunk < kNormChunk ? count - c * kNormChunk : kNormChunk; };
  if (loader) LoadNormChunk(stage[0], src, chunk_count(0), vec, threadIdx.x - 32);
  __syncthreads();
  double acc = 0.0;
  for (int c = 0; c < chunks; ++c) {
    if (loader) {
      if (c + 1 < chunks) {
        LoadNormChunk(stage[(c + 1) & 1], src + static_cast<size_t>(c + 1) * kNormChunk, chunk_count(c + 1), vec,
                      threadIdx.x - 32);
      }
    } else if (lane < math::kNormLanes) {
      const float* x = stage[c & 1];
      const int m = chunk_count(c);
#pragma unroll 8
      for (int i = lane; i < m; i += math::kNormLanes) {
        const double v = x[i];
        acc += v * v;  // exact square; --fmad=false keeps the add separate (an fma would round the same)
      }
    }
    __syncthreads();
  }
  if (lane < math::kNormLanes) lanes[lane] = acc;
  __syncthreads();
  if (lane == 0) out[blockIdx.x] = math::CombineNormLanes(lanes);
}

// ---- LayerNorm (the rows: gpu/layernorm_kernels.cuh) ----

// Column sums in lane_math.h's row chunks: a block per 32 columns (lane c
// of each warp is column c, so a row's 32 values are one coalesced load);
// warp w sums chunks w, w + 8, ... of its columns, each chunk's rows in
// order, loaded a batch ahead; the chunk partials meet in shared memory and
// warp 0 adds them in chunk order. The CPU's column loop adds the same
// partials in the same order.
constexpr int kColumnWarps = 8;
constexpr int kColumnBatch = 16;

// Σ over rows [r0, r1) of f(r) in order, f's loads kColumnBatch rows ahead.
template <class Load, class Add>
__device__ inline void ColumnChunk(int64_t r0, int64_t r1, const Load& load, const Add& add) {
  int64_t r = r0;
  for (; r + kColumnBatch <= r1; r += kColumnBatch) {
    decltype(load(r)) v[kColumnBatch];
#pragma unroll
    for (int k = 0; k < kColumnBatch; ++k) v[k] = load(r + k);
#pragma unroll
    for (int k = 0; k < kColumnBatch; ++k) add(r + k, v[k]);
  }
  for (; r < r1; ++r) add(r, load(r));
}

__global__ void __launch_bounds__(kColumnWarps * 32)
    LayerNormBackwardColumnsKernel(const float* __restrict__ dy, const float* __restrict__ x,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   float* __restrict__ dw, float* __restrict__ db, int64_t rows, int64_t cols) {
  __shared__ float part_w[math::kMaxColumnChunks][32], part_b[math::kMaxColumnChunks][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const int64_t chunk = math::ColumnChunkRows(rows), chunks = (rows + chunk - 1) / chunk;
  for (int64_t k = warp; k < chunks; k += kColumnWarps) {
    float acc_w = 0.0f, acc_b = 0.0f;
    if (c < cols) {
      struct Pair {
        float d, xn;
      };
      ColumnChunk(
          k * chunk, min(rows, (k + 1) * chunk),
          [&](int64_t r) {
            return Pair{dy[r * cols + c], x[r * cols + c]};
          },
          [&](int64_t r, Pair p) {
            acc_w += p.d * math::LayerNormNormalize(p.xn, mean[r], rstd[r]);
            acc_b += p.d;
          });
    }
    part_w[k][lane] = acc_w;
    part_b[k][lane] = acc_b;
  }
  __syncthreads();
  if (warp == 0 && c < cols) {
    float acc_w = 0.0f, acc_b = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) {
      acc_w += part_w[k][lane];
      acc_b += part_b[k][lane];
    }
    dw[c] += acc_w;
    db[c] += acc_b;
  }
}

// ---- embedding ----

// A table element's value: fp32, or bf16 bits widened.
__device__ inline float TableValue(float x) { return x; }
__device__ inline float TableValue(uint16_t bits) { return Bf16BitsToFloat(bits); }

template <class W>
__global__ void EmbeddingForwardKernel(const int32_t* __restrict__ tokens, const W* __restrict__ wte,
                                       const float* __restrict__ wpe, float* __restrict__ out, int64_t rows,
                                       int64_t seq_len, int64_t channels) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(channels);
  for (size_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t r = static_cast<int64_t>(i / static_cast<size_t>(channels));
    const int64_t c = static_cast<int64_t>(i % static_cast<size_t>(channels));
    const float te = TableValue(wte[static_cast<int64_t>(tokens[r]) * channels + c]);
    out[i] = wpe ? te + wpe[(r % seq_len) * channels + c] : te;
  }
}

// Embedding backward without atomics. Keys (token << 32 | row) for the
// rows, the padding up to a power of two all ones (sorted last).
__global__ void EmbeddingKeysKernel(const int32_t* __restrict__ tokens, uint64_t* __restrict__ keys, int64_t rows,
                                    int64_t n) {
  for (size_t i = GlobalThread(); i < static_cast<size_t>(n); i += GridStride()) {
    const int64_t r = static_cast<int64_t>(i);
    keys[i] = r < rows ? (static_cast<uint64_t>(static_cast<uint32_t>(tokens[r])) << 32) | static_cast<uint64_t>(r)
                       : ~uint64_t{0};
  }
}

// One compare-exchange step (j, k) of an ascending bitonic sort of n keys.
__global__ void BitonicStepKernel(uint64_t* keys, int64_t n, int64_t j, int64_t k) {
  for (size_t t = GlobalThread(); t < static_cast<size_t>(n); t += GridStride()) {
    const int64_t i = static_cast<int64_t>(t), l = i ^ j;
    if (l <= i) continue;
    const uint64_t a = keys[i], b = keys[l];
    const bool ascending = (i & k) == 0;
    if ((a > b) == ascending) {
      keys[i] = b;
      keys[l] = a;
    }
  }
}

// A thread block per sorted position that starts a token's run: its
// channels, each the run's rows added in increasing row order.
__global__ void EmbeddingTokenGradKernel(const float* __restrict__ dout, const uint64_t* __restrict__ keys,
                                         float* __restrict__ dwte, int64_t rows, int64_t channels) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const uint64_t token = keys[i] >> 32;
    if (i > 0 && (keys[i - 1] >> 32) == token) continue;
    float* te = dwte + static_cast<int64_t>(token) * channels;
    for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
      float acc = te[c];
      for (int64_t j = i; j < rows && (keys[j] >> 32) == token; ++j) {
        acc += dout[static_cast<int64_t>(keys[j] & 0xffffffffu) * channels + c];
      }
      te[c] = acc;
    }
  }
}

// A thread per (position, channel): rows t, t + seq_len, ... in order.
__global__ void EmbeddingPositionGradKernel(const float* __restrict__ dout, float* __restrict__ dwpe, int64_t rows,
                                            int64_t seq_len, int64_t channels) {
  const size_t n = static_cast<size_t>(rows < seq_len ? rows : seq_len) * static_cast<size_t>(channels);
  for (size_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t t = static_cast<int64_t>(i / static_cast<size_t>(channels));
    const int64_t c = static_cast<int64_t>(i % static_cast<size_t>(channels));
    float acc = dwpe[i];
    for (int64_t r = t; r < rows; r += seq_len) acc += dout[r * channels + c];
    dwpe[i] = acc;
  }
}

// ---- the rest of the GPT layers ----

// The CPU's ColumnSumAccumulate in its row chunks, as the LayerNorm columns.
__global__ void __launch_bounds__(kColumnWarps * 32)
    ColumnSumKernel(const float* __restrict__ x, float* __restrict__ out, int64_t rows, int64_t cols) {
  __shared__ float part[math::kMaxColumnChunks][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const int64_t chunk = math::ColumnChunkRows(rows), chunks = (rows + chunk - 1) / chunk;
  for (int64_t k = warp; k < chunks; k += kColumnWarps) {
    float acc = 0.0f;
    if (c < cols) {
      ColumnChunk(
          k * chunk, min(rows, (k + 1) * chunk), [&](int64_t r) { return x[r * cols + c]; },
          [&](int64_t, float v) { acc += v; });
    }
    part[k][lane] = acc;
  }
  __syncthreads();
  if (warp == 0 && c < cols) {
    float acc = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) acc += part[k][lane];
    out[c] += acc;
  }
}

// ---- causal softmax: 16 threads per attention row ----
//
// math/lane_math.h's lanes, one per thread: thread j of a row's half-warp
// holds lane j (elements j, j + 16, ... of the full groups of 16, read by the
// half-warp 64 contiguous bytes at a time) and thread k < n % 16 tail element
// k. Every thread then combines the lanes and the tail it gathers by shuffles
// in the CPU's order, so each row gets the CPU's bits (row i of a T × T
// matrix: the softmax of its causal prefix, the rest zeroed). The lane
// helpers are gpu/half_warp_lanes.cuh's.
constexpr unsigned kRowsPerSoftmaxBlock = kThreads / kLanes;

unsigned BlocksForLaneRows(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>((rows + kRowsPerSoftmaxBlock - 1) / kRowsPerSoftmaxBlock, kMaxBlocks));
}

__global__ void CausalSoftmaxKernel(float* att, int64_t rows, int64_t T) {
  const unsigned mask = HalfWarpMask();
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  for (int64_t r = static_cast<int64_t>(GlobalThread() / kLanes); r < rows;
       r += static_cast<int64_t>(GridStride() / kLanes)) {
    const int64_t n = r % T + 1, full = n / kLanes * kLanes, tail = n - full;
    float* row = att + r * T;
    // LaneMax: the tail first, then the lanes in order.
    float acc = -INFINITY;
    for (int64_t c = lane; c < full; c += kLanes) acc = row[c] > acc ? row[c] : acc;
    const float tail_x = lane < tail ? row[full + lane] : 0.0f;
    float m = -INFINITY;
    for (int k = 0; k < tail; ++k) {
      const float t = LaneOf(mask, tail_x, k);
      m = t > m ? t : m;
    }
    for (int j = 0; j < kLanes; ++j) {
      const float a = LaneOf(mask, acc, j);
      m = a > m ? a : m;
    }
    // LaneExpSum, then the scaling: every element stays with its thread.
    float sum = 0.0f;
    for (int64_t c = lane; c < full; c += kLanes) {
      const float e = math::SoftmaxExp(row[c], m);
      row[c] = e;
      sum += e;
    }
    float tail_e = 0.0f;
    if (lane < tail) row[full + lane] = tail_e = math::SoftmaxExp(tail_x, m);
    const float inv_sum = 1.0f / LaneSumThenTail(mask, sum, tail_e, tail);
    for (int64_t c = lane; c < n; c += kLanes) row[c] *= inv_sum;
    for (int64_t c = n + lane; c < T; c += kLanes) row[c] = 0.0f;
  }
}

__global__ void CausalSoftmaxBackwardKernel(const float* __restrict__ att, float* __restrict__ datt, int64_t rows,
                                            int64_t T, float scale) {
  const unsigned mask = HalfWarpMask();
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  for (int64_t r = static_cast<int64_t>(GlobalThread() / kLanes); r < rows;
       r += static_cast<int64_t>(GridStride() / kLanes)) {
    const int64_t n = r % T + 1, full = n / kLanes * kLanes, tail = n - full;
    const float* p = att + r * T;
    float* d = datt + r * T;
    float acc = 0.0f;  // LaneDot
    for (int64_t c = lane; c < full; c += kLanes) acc += p[c] * d[c];
    const float tail_pd = lane < tail ? p[full + lane] * d[full + lane] : 0.0f;
    const float dot = LaneSumThenTail(mask, acc, tail_pd, tail);
    for (int64_t c = lane; c < n; c += kLanes) d[c] = scale * math::SoftmaxInputGrad(p[c], d[c], dot);
    for (int64_t c = n + lane; c < T; c += kLanes) d[c] = 0.0f;
  }
}

__device__ inline uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void BusyWaitKernel(uint64_t ns) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < ns) __nanosleep(1000);
}

bool IsFloatDType(DType d) { return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16; }

std::string DTypeArg(DType d) { return std::to_string(static_cast<int>(d)); }

}  // namespace

Status AdamStep(const math::AdamStepConstants& constants, float* params, float* exp_avg, float* exp_avg_sq,
                const void* grads, DType grad_dtype, void* param_copy, DType param_copy_dtype, size_t n, void* stream) {
  if (!IsFloatDType(grad_dtype)) return InvalidArgument("gpu::AdamStep: unknown grad dtype " + DTypeArg(grad_dtype));
  if (param_copy != nullptr && param_copy_dtype != DType::kBFloat16 && param_copy_dtype != DType::kFloat16)
    return InvalidArgument("gpu::AdamStep: param_copy dtype must be bf16 or fp16, got " + DTypeArg(param_copy_dtype));
  if (n == 0) return Status::Ok();
  if (!params || !exp_avg || !exp_avg_sq || !grads)
    return InvalidArgument("gpu::AdamStep: null params, exp_avg, exp_avg_sq or grads");
  auto s = static_cast<cudaStream_t>(stream);
  switch (grad_dtype) {
    case DType::kFloat32:
      return LaunchAdam<DType::kFloat32>(constants, params, exp_avg, exp_avg_sq, grads, param_copy, param_copy_dtype, n,
                                         s);
    case DType::kBFloat16:
      return LaunchAdam<DType::kBFloat16>(constants, params, exp_avg, exp_avg_sq, grads, param_copy, param_copy_dtype,
                                          n, s);
    case DType::kFloat16:
      return LaunchAdam<DType::kFloat16>(constants, params, exp_avg, exp_avg_sq, grads, param_copy, param_copy_dtype, n,
                                         s);
  }
  return InvalidArgument("gpu::AdamStep: unknown grad dtype " + DTypeArg(grad_dtype));
}

Status SumSquaresBlocks(const float* data, size_t n, double* block_partials, void* stream) {
  if (n == 0) return Status::Ok();
  if (!data || !block_partials) return InvalidArgument("gpu::SumSquaresBlocks: null data or block_partials");
  const size_t num_blocks = (n + math::kNormBlockElems - 1) / math::kNormBlockElems;
  if (num_blocks > 0x7fffffffu) {
    return InvalidArgument("gpu::SumSquaresBlocks: " + std::to_string(n) + " elements is too many");
  }
  SumSquaresBlocksKernel<<<static_cast<unsigned>(num_blocks), kNormThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      data, n, block_partials);
  return ZINF_CHECK_LAUNCH("SumSquaresBlocksKernel");
}

Status AddInPlace(float* a, const float* b, size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  if (!a || !b) return InvalidArgument("gpu::AddInPlace: null a or b");
  const bool vector = elementwise::AddVector(a, b, a);
  elementwise::AddKernel<<<elementwise::BlocksForElements(n, vector), elementwise::kThreads, 0,
                           static_cast<cudaStream_t>(stream)>>>(a, b, a, n, vector);
  return ZINF_CHECK_LAUNCH("AddKernel");
}

Status Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, void* stream) {
  if (!IsFloatDType(src_dtype) || !IsFloatDType(dst_dtype))
    return InvalidArgument("gpu::Cast: unknown dtype " + DTypeArg(src_dtype) + " -> " + DTypeArg(dst_dtype));
  if (n == 0) return Status::Ok();
  if (!src || !dst) return InvalidArgument("gpu::Cast: null src or dst");
  auto s = static_cast<cudaStream_t>(stream);
  if (src_dtype == dst_dtype) {  // a copy: every bit kept, a NaN's payload too (as the CPU's)
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, n * DTypeSizeBytes(src_dtype), cudaMemcpyDeviceToDevice, s));
    return Status::Ok();
  }
  switch (src_dtype) {
    case DType::kFloat32:
      return LaunchCast<DType::kFloat32>(src, dst, dst_dtype, n, s);
    case DType::kBFloat16:
      return LaunchCast<DType::kBFloat16>(src, dst, dst_dtype, n, s);
    case DType::kFloat16:
      return LaunchCast<DType::kFloat16>(src, dst, dst_dtype, n, s);
  }
  return InvalidArgument("gpu::Cast: unknown dtype " + DTypeArg(src_dtype));
}

Status GeluForward(const float* x, float* y, size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  if (!x || !y) return InvalidArgument("gpu::GeluForward: null x or y");
  const bool vector = elementwise::Aligned16(x) && elementwise::Aligned16(y);
  elementwise::GeluForwardKernel<float>
      <<<elementwise::BlocksForElements(n, vector), elementwise::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          x, y, n, vector);
  return ZINF_CHECK_LAUNCH("GeluForwardKernel");
}

Status GeluForwardBf16(const float* x, uint16_t* y, size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  if (!x || !y) return InvalidArgument("gpu::GeluForwardBf16: null x or y");
  if (Overlap(x, n * 4, y, n * 2)) return InvalidArgument("gpu::GeluForwardBf16: y overlaps x");
  const bool vector = elementwise::Aligned16(x) && elementwise::Aligned16(y);
  elementwise::GeluForwardKernel<uint16_t>
      <<<elementwise::BlocksForElements(n, vector), elementwise::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
          x, y, n, vector);
  return ZINF_CHECK_LAUNCH("GeluForwardKernel");
}

Status GeluBackward(const float* x, const float* dy, float* dx, size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  if (!x || !dy || !dx) return InvalidArgument("gpu::GeluBackward: null x, dy or dx");
  const bool vector = elementwise::AddVector(x, dy, dx);
  elementwise::GeluBackwardKernel<<<elementwise::BlocksForElements(n, vector), elementwise::kThreads, 0,
                                    static_cast<cudaStream_t>(stream)>>>(x, dy, dx, n, vector);
  return ZINF_CHECK_LAUNCH("GeluBackwardKernel");
}

namespace {

template <class Out>
Status LaunchLayerNormForward(const char* fn, const float* x, const float* w, const float* b, Out* y, float* mean,
                              float* rstd, int64_t rows, int64_t cols, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows(fn, rows, cols, "cols"));
  if (rows == 0) return Status::Ok();
  if (!x || !w || !b || !y || !mean || !rstd)
    return InvalidArgument(std::string(fn) + ": null x, w, b, y, mean or rstd");
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  if (Overlap(x, n * 4, y, n * sizeof(Out))) return InvalidArgument(std::string(fn) + ": y overlaps x");
  layernorm::LayerNormForwardKernel<Out>
      <<<layernorm::BlocksForRows(rows), layernorm::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, w, b, y, mean,
                                                                                                      rstd, rows, cols);
  return ZINF_CHECK_LAUNCH("LayerNormForwardKernel");
}

}  // namespace

Status LayerNormForward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t cols, void* stream) {
  return LaunchLayerNormForward("gpu::LayerNormForward", x, w, b, y, mean, rstd, rows, cols, stream);
}

Status LayerNormForwardBf16(const float* x, const float* w, const float* b, uint16_t* y, float* mean, float* rstd,
                            int64_t rows, int64_t cols, void* stream) {
  return LaunchLayerNormForward("gpu::LayerNormForwardBf16", x, w, b, y, mean, rstd, rows, cols, stream);
}

Status LayerNormBackward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                         float* dx, float* dw, float* db, int64_t rows, int64_t cols, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows("gpu::LayerNormBackward", rows, cols, "cols"));
  if (rows == 0) return Status::Ok();
  if (!dy || !x || !w || !mean || !rstd || !dx || !dw || !db)
    return InvalidArgument("gpu::LayerNormBackward: null dy, x, w, mean, rstd, dx, dw or db");
  auto s = static_cast<cudaStream_t>(stream);
  layernorm::LayerNormBackwardRowsKernel<<<layernorm::BlocksForRows(rows), layernorm::kThreads, 0, s>>>(
      dy, x, w, mean, rstd, dx, rows, cols);
  ZINF_RETURN_IF_ERROR(ZINF_CHECK_LAUNCH("LayerNormBackwardRowsKernel"));
  LayerNormBackwardColumnsKernel<<<ColumnTiles(cols), kColumnWarps * 32, 0, s>>>(dy, x, mean, rstd, dw, db, rows, cols);
  return ZINF_CHECK_LAUNCH("LayerNormBackwardColumnsKernel");
}

namespace {

template <class W>
Status EmbeddingForwardOf(const int32_t* tokens, const W* wte, const float* wpe, float* out, int64_t rows,
                          int64_t seq_len, int64_t channels, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows("gpu::EmbeddingForward", rows, channels, "channels"));
  if (seq_len < 1) return InvalidArgument("gpu::EmbeddingForward: seq_len " + std::to_string(seq_len));
  if (rows == 0) return Status::Ok();
  if (!tokens || !wte || !out) return InvalidArgument("gpu::EmbeddingForward: null tokens, wte or out");
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(channels);
  EmbeddingForwardKernel<W><<<BlocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(tokens, wte, wpe, out,
                                                                                              rows, seq_len, channels);
  return ZINF_CHECK_LAUNCH("EmbeddingForwardKernel");
}

}  // namespace

Status EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int64_t rows,
                        int64_t seq_len, int64_t channels, void* stream) {
  return EmbeddingForwardOf(tokens, wte, wpe, out, rows, seq_len, channels, stream);
}

Status EmbeddingForward(const int32_t* tokens, const uint16_t* wte, const float* wpe, float* out, int64_t rows,
                        int64_t seq_len, int64_t channels, void* stream) {
  return EmbeddingForwardOf(tokens, wte, wpe, out, rows, seq_len, channels, stream);
}

size_t EmbeddingBackwardWorkspaceBytes(int64_t rows) {
  size_t n = 1;
  while (static_cast<int64_t>(n) < rows) n <<= 1;
  return n * sizeof(uint64_t);
}

Status EmbeddingBackward(const float* dout, const int32_t* tokens, float* dwte, float* dwpe, int64_t rows,
                         int64_t seq_len, int64_t channels, void* workspace, size_t workspace_bytes, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows("gpu::EmbeddingBackward", rows, channels, "channels"));
  if (seq_len < 1) return InvalidArgument("gpu::EmbeddingBackward: seq_len " + std::to_string(seq_len));
  if (rows >= (int64_t{1} << 31)) {
    return InvalidArgument("gpu::EmbeddingBackward: " + std::to_string(rows) + " rows (at most 2^31 - 1)");
  }
  if (rows == 0) return Status::Ok();
  if (!dout || !tokens || !dwte) return InvalidArgument("gpu::EmbeddingBackward: null dout, tokens or dwte");
  const size_t need = EmbeddingBackwardWorkspaceBytes(rows);
  if (!workspace || workspace_bytes < need || reinterpret_cast<uintptr_t>(workspace) % alignof(uint64_t) != 0) {
    return InvalidArgument("gpu::EmbeddingBackward: the workspace must hold " + std::to_string(need) +
                           " bytes, 8-byte aligned (given " + std::to_string(workspace_bytes) + ")");
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t n = static_cast<int64_t>(need / sizeof(uint64_t));
  auto* keys = static_cast<uint64_t*>(workspace);
  EmbeddingKeysKernel<<<BlocksFor(n), kThreads, 0, s>>>(tokens, keys, rows, n);
  ZINF_RETURN_IF_ERROR(ZINF_CHECK_LAUNCH("EmbeddingKeysKernel"));
  for (int64_t k = 2; k <= n; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      BitonicStepKernel<<<BlocksFor(n), kThreads, 0, s>>>(keys, n, j, k);
      ZINF_RETURN_IF_ERROR(ZINF_CHECK_LAUNCH("BitonicStepKernel"));
    }
  }
  EmbeddingTokenGradKernel<<<BlocksForRows(rows), kThreads, 0, s>>>(dout, keys, dwte, rows, channels);
  ZINF_RETURN_IF_ERROR(ZINF_CHECK_LAUNCH("EmbeddingTokenGradKernel"));
  if (!dwpe) return Status::Ok();
  const size_t positions = static_cast<size_t>(std::min(rows, seq_len)) * static_cast<size_t>(channels);
  EmbeddingPositionGradKernel<<<BlocksFor(positions), kThreads, 0, s>>>(dout, dwpe, rows, seq_len, channels);
  return ZINF_CHECK_LAUNCH("EmbeddingPositionGradKernel");
}

Status ResidualForward(const float* a, const float* b, float* out, size_t n, void* stream) {
  if (n == 0) return Status::Ok();
  if (!a || !b || !out) return InvalidArgument("gpu::ResidualForward: null a, b or out");
  const bool vector = elementwise::AddVector(a, b, out);
  elementwise::AddKernel<<<elementwise::BlocksForElements(n, vector), elementwise::kThreads, 0,
                           static_cast<cudaStream_t>(stream)>>>(a, b, out, n, vector);
  return ZINF_CHECK_LAUNCH("AddKernel");
}

Status BroadcastRow(const float* row, float* out, int64_t rows, int64_t cols, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows("gpu::BroadcastRow", rows, cols, "cols"));
  if (rows == 0) return Status::Ok();
  if (!row || !out) return InvalidArgument("gpu::BroadcastRow: null row or out");
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  const bool vector = elementwise::BroadcastVector(row, out, cols);
  elementwise::BroadcastRowKernel<<<elementwise::BlocksForElements(n, vector), elementwise::kThreads, 0,
                                    static_cast<cudaStream_t>(stream)>>>(row, out, n, cols, vector);
  return ZINF_CHECK_LAUNCH("BroadcastRowKernel");
}

Status ColumnSumAccumulate(const float* x, float* out, int64_t rows, int64_t cols, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows("gpu::ColumnSumAccumulate", rows, cols, "cols"));
  if (!x || !out) return InvalidArgument("gpu::ColumnSumAccumulate: null x or out");
  ColumnSumKernel<<<ColumnTiles(cols), kColumnWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(x, out, rows, cols);
  return ZINF_CHECK_LAUNCH("ColumnSumKernel");
}

Status CausalSoftmaxForward(float* att, int64_t matrices, int64_t T, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows("gpu::CausalSoftmaxForward", matrices, T, "T"));
  if (matrices == 0) return Status::Ok();
  if (!att) return InvalidArgument("gpu::CausalSoftmaxForward: null att");
  const int64_t rows = matrices * T;
  CausalSoftmaxKernel<<<BlocksForLaneRows(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(att, rows, T);
  return ZINF_CHECK_LAUNCH("CausalSoftmaxKernel");
}

Status CausalSoftmaxBackward(const float* att, float* datt, int64_t matrices, int64_t T, float scale, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows("gpu::CausalSoftmaxBackward", matrices, T, "T"));
  if (matrices == 0) return Status::Ok();
  if (!att || !datt) return InvalidArgument("gpu::CausalSoftmaxBackward: null att or datt");
  const int64_t rows = matrices * T;
  CausalSoftmaxBackwardKernel<<<BlocksForLaneRows(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      att, datt, rows, T, scale);
  return ZINF_CHECK_LAUNCH("CausalSoftmaxBackwardKernel");
}

Status BusyWait(double seconds, void* stream) {
  if (!(seconds >= 0)) return InvalidArgument("gpu::BusyWait: seconds must be >= 0");
  if (seconds == 0) return Status::Ok();
  BusyWaitKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<uint64_t>(seconds * 1e9));
  return ZINF_CHECK_LAUNCH("BusyWaitKernel");
}

}  // namespace zinf::gpu
