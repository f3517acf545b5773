// LayerNorm's row kernels (gpu/kernels.h; launched by kernels.cu): a
// half-warp a row (gpu/half_warp_lanes.cuh), thread j summing lane j of the
// row's sums (x for the mean, (x - mean)² for the variance; backward's
// dy · w and dy · w · x̂), thread k the tail element k, combined by shuffles
// in model/layers.cc's lane order, so every value is the CPU's bit for bit.
// Each lane's loads go in batches (ForLaneBatches), several round trips to
// memory a row instead of one a element. The column sums (dw, db) are
// kernels.cu's. Built as kernels.cu is (--fmad=false, IEEE division and
// sqrt).
//
// Uses only gpu/simt.cuh, so it also runs in the CPU emulation
// (tests/gpu/layernorm_kernels_emu_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpu/half_warp_lanes.cuh"
#include "gpu/simt.cuh"
#include "math/gpt_math.h"
#include "math/lane_math.h"

namespace zinf::gpu::layernorm {

using math::kLanes;

constexpr unsigned kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

// Blocks of kThreads for `rows` half-warp rows (grid-stride beyond kMaxBlocks).
inline unsigned BlocksForRows(int64_t rows) {
  const int64_t per_block = kThreads / kLanes;
  const int64_t b = (rows + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : (b < kMaxBlocks ? b : kMaxBlocks));
}

// Σ term(x[c]) over a row of n in the lane order (every thread of the
// half-warp gets it).
template <class Term>
__device__ inline float RowSum(unsigned mask, int lane, const float* xr, int64_t n, const Term& term) {
  const int64_t full = n - n % kLanes, tail = n - full;
  float acc = 0.0f;
  ForLaneBatches<kForwardRowBatch>(
      lane, full, [&](int64_t c) { return xr[c]; }, [&](int64_t, float v) { acc += term(v); });
  const float tail_term = lane < tail ? term(xr[full + lane]) : 0.0f;
  return LaneSumThenTail(mask, acc, tail_term, tail);
}

// y = LayerNorm(x) · w + b per row of `cols` (fp32, or Out = uint16_t: bf16),
// and each row's mean and rstd.
template <class Out>
__global__ void LayerNormForwardKernel(const float* __restrict__ x, const float* __restrict__ w,
                                       const float* __restrict__ b, Out* __restrict__ y, float* __restrict__ mean,
                                       float* __restrict__ rstd, int64_t rows, int64_t cols) {
  const unsigned mask = HalfWarpMask();
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  const float fc = static_cast<float>(cols);
  struct XWB {
    float x, w, b;
  };
  for (int64_t r = HalfWarpRow(); r < rows; r += HalfWarpRowStride()) {
    const float* xr = x + r * cols;
    const float m = RowSum(mask, lane, xr, cols, [](float v) { return v; }) / fc;
    const float var = RowSum(mask, lane, xr, cols,
                             [m](float v) {
                               const float d = v - m;
                               return d * d;
                             }) /
                      fc;
    const float s = math::LayerNormRstd(var);
    Out* yr = y + r * cols;
    ForLaneBatches<kBackwardRowBatch>(
        lane, cols,
        [&](int64_t c) {
          return XWB{xr[c], w[c], b[c]};
        },
        [&](int64_t c, XWB v) {
          simt::StoreAs(yr + c, math::LayerNormAffine(math::LayerNormNormalize(v.x, m, s), v.w, v.b));
        });
    if (lane == 0) {
      mean[r] = m;
      rstd[r] = s;
    }
  }
}

// dx += the input gradient per row (dw and db are the column kernel's).
__global__ void LayerNormBackwardRowsKernel(const float* __restrict__ dy, const float* __restrict__ x,
                                            const float* __restrict__ w, const float* __restrict__ mean,
                                            const float* __restrict__ rstd, float* __restrict__ dx, int64_t rows,
                                            int64_t cols) {
  const unsigned mask = HalfWarpMask();
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  const float fc = static_cast<float>(cols);
  const int64_t full = cols - cols % kLanes, tail = cols - full;
  struct Terms {
    float dy, w, x, dx;
  };
  for (int64_t r = HalfWarpRow(); r < rows; r += HalfWarpRowStride()) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    const float m = mean[r], s = rstd[r];
    // Σ dy·w and Σ (dy·w)·x̂ in one pass, each in its own lane chain.
    float acc_g = 0.0f, acc_gx = 0.0f;
    ForLaneBatches<kBackwardRowBatch>(
        lane, full,
        [&](int64_t c) {
          return Terms{dyr[c], w[c], xr[c], 0.0f};
        },
        [&](int64_t, Terms v) {
          const float g = v.dy * v.w;
          acc_g += g;
          acc_gx += g * math::LayerNormNormalize(v.x, m, s);
        });
    float tail_g = 0.0f, tail_gx = 0.0f;
    if (lane < tail) {
      tail_g = dyr[full + lane] * w[full + lane];
      tail_gx = tail_g * math::LayerNormNormalize(xr[full + lane], m, s);
    }
    const float mean_g = LaneSumThenTail(mask, acc_g, tail_g, tail) / fc;
    const float mean_gx = LaneSumThenTail(mask, acc_gx, tail_gx, tail) / fc;
    ForLaneBatches<kBackwardRowBatch>(
        lane, cols,
        [&](int64_t c) {
          return Terms{dyr[c], w[c], xr[c], dxr[c]};
        },
        [&](int64_t c, Terms v) {
          dxr[c] = v.dx + math::LayerNormInputGrad(v.dy * v.w, math::LayerNormNormalize(v.x, m, s), mean_g, mean_gx, s);
        });
  }
}

}  // namespace zinf::gpu::layernorm
