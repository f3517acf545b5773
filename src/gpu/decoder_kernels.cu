// The kernels of gpu/decoder_kernels.h. Built as gpu/kernels.cu is
// (--fmad=false, IEEE division and sqrt), so each element rounds the same
// operations in the same order as model/decoder_layers.cc.
//
// RMSNorm rows run on a half-warp each (gpu/half_warp_lanes.cuh): thread j
// sums lane j of the row's squares (or of backward's Σ g x̂ terms), thread k
// the tail element k, and the shuffled combination is RmsNormRow's and
// RmsNormGradDot's order exactly. A row of the head norm (D = 64 or 128)
// is four or eight elements a thread; a model row of C is C / 16. Each
// element is read and then written by the one thread that holds it, so the
// forward may run in place and the backward may write dx over dy. The weight
// gradient sums columns in ColumnChunkRows' chunks: a block per 32 columns,
// its warps taking the chunks in turn, the chunk partials then added in
// chunk order by warp 0, as the CPU's column loop does.
//
// RoPE and SwiGLU are elementwise: a thread per rotated pair, a thread per
// output element (grid-stride loops of 256-thread blocks).
#include "gpu/decoder_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/half_warp_lanes.cuh"
#include "gpu/launch_util.cuh"
#include "math/decoder_math.h"
#include "math/lane_math.h"

namespace zinf::gpu {
namespace {

using model::kLanes;

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = size_t{1} << 16;
constexpr int64_t kHalfWarpsPerBlock = kThreads / kLanes;
// The weight gradient's block: 32 warps, so each takes at most four of the
// (at most 128) chunks; the q/k norm has only D / 32 column tiles.
constexpr int kColumnWarps = 32;

unsigned BlocksFor(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}
unsigned BlocksForHalfWarpRows(int64_t rows) {
  return static_cast<unsigned>(
      std::min<int64_t>((rows + kHalfWarpsPerBlock - 1) / kHalfWarpsPerBlock, static_cast<int64_t>(kMaxBlocks)));
}

// The calling half-warp's first row and the stride between its rows.
__device__ inline int64_t HalfWarpRow() { return static_cast<int64_t>(GlobalThread() / kLanes); }
__device__ inline int64_t HalfWarpRowStride() { return static_cast<int64_t>(GridStride() / kLanes); }

// ---- RMSNorm ----

// The calling lane's elements c = lane, lane + 16, ... below `end`, in
// increasing order: load(c) of a batch of kRowBatch of them is issued before
// use(c, loaded) of any, so the loads are in flight together and a use may
// store to its own element (x and y, or dy and dx, may be one buffer: without
// the batch, each load would wait for the store before it).
constexpr int kRowBatch = 8;
template <class Load, class Use>
__device__ inline void ForLaneBatches(int lane, int64_t end, const Load& load, const Use& use) {
  using Loaded = decltype(load(int64_t{0}));
  int64_t c = lane;
  for (; c + (kRowBatch - 1) * kLanes < end; c += kRowBatch * kLanes) {
    Loaded v[kRowBatch];
#pragma unroll
    for (int k = 0; k < kRowBatch; ++k) v[k] = load(c + k * kLanes);
#pragma unroll
    for (int k = 0; k < kRowBatch; ++k) use(c + k * kLanes, v[k]);
  }
  for (; c < end; c += kLanes) use(c, load(c));
}

// x and y may be the same buffer (Out = float): not __restrict__.
template <class Out>
__global__ void RmsNormForwardKernel(const float* x, const float* __restrict__ w, Out* y, float* __restrict__ rstd,
                                     StridedRows rows, float eps) {
  const unsigned mask = HalfWarpMask();
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  const int64_t n = rows.n, full = n / kLanes * kLanes, tail = n - full;
  struct XW {
    float x, w;
  };
  for (int64_t r = HalfWarpRow(); r < rows.rows; r += HalfWarpRowStride()) {
    const int64_t at = rows.Offset(r);
    const float* xr = x + at;
    float acc = 0.0f;  // LaneSumSquares: lane `lane`
    ForLaneBatches(
        lane, full, [&](int64_t c) { return xr[c]; }, [&](int64_t, float v) { acc += v * v; });
    const float tail_x = lane < tail ? xr[full + lane] : 0.0f;
    const float s = model::RmsNormRstd(LaneSumThenTail(mask, acc, tail_x * tail_x, tail), n, eps);
    Out* yr = y + at;
    ForLaneBatches(
        lane, n, [&](int64_t c) { return XW{xr[c], w[c]}; },
        [&](int64_t c, XW v) { StoreAs(yr + c, model::RmsNormOutput(v.x, s, v.w)); });
    if (lane == 0) rstd[r] = s;
  }
}

// dy and dx may be the same buffer: not __restrict__.
__global__ void RmsNormBackwardRowsKernel(const float* dy, const float* __restrict__ x, const float* __restrict__ w,
                                          const float* __restrict__ rstd, float* dx, bool accumulate,
                                          StridedRows rows) {
  const unsigned mask = HalfWarpMask();
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  const int64_t n = rows.n, full = n / kLanes * kLanes, tail = n - full;
  struct Terms {
    float dy, w, x, dx;
  };
  for (int64_t r = HalfWarpRow(); r < rows.rows; r += HalfWarpRowStride()) {
    const int64_t at = rows.Offset(r);
    const float* dyr = dy + at;
    const float* xr = x + at;
    const float s = rstd[r];
    float acc = 0.0f;  // RmsNormGradDot: lane `lane`
    ForLaneBatches(
        lane, full, [&](int64_t c) { return Terms{dyr[c], w[c], xr[c], 0.0f}; },
        [&](int64_t, Terms v) { acc += model::RmsNormGradDotTerm(v.dy, v.w, v.x, s); });
    const float tail_term =
        lane < tail ? model::RmsNormGradDotTerm(dyr[full + lane], w[full + lane], xr[full + lane], s) : 0.0f;
    const float dot = LaneSumThenTail(mask, acc, tail_term, tail);
    float* dxr = dx + at;
    ForLaneBatches(
        lane, n, [&](int64_t c) { return Terms{dyr[c], w[c], xr[c], accumulate ? dxr[c] : 0.0f}; },
        [&](int64_t c, Terms v) {
          const float g = model::RmsNormInputGrad(v.dy, v.w, v.x, s, dot, n);
          dxr[c] = accumulate ? v.dx + g : g;
        });
  }
}

__global__ void __launch_bounds__(kColumnWarps * 32)
    RmsNormWeightGradKernel(const float* __restrict__ dy, const float* __restrict__ x,
                            const float* __restrict__ rstd, float* __restrict__ dw, StridedRows rows) {
  __shared__ float part[model::kMaxColumnChunks][32];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const int64_t R = rows.rows;
  const int64_t chunk = model::ColumnChunkRows(R), chunks = (R + chunk - 1) / chunk;
  for (int64_t k = warp; k < chunks; k += kColumnWarps) {
    float acc = 0.0f;
    if (c < rows.n) {
      const int64_t r1 = R < (k + 1) * chunk ? R : (k + 1) * chunk;
      // The chunk's rows in order, kRowBatch rows' loads in flight at once.
      int64_t r = k * chunk;
      for (; r + kRowBatch <= r1; r += kRowBatch) {
        float d[kRowBatch], xv[kRowBatch], s[kRowBatch];
#pragma unroll
        for (int b = 0; b < kRowBatch; ++b) {
          const int64_t at = rows.Offset(r + b) + c;
          d[b] = dy[at];
          xv[b] = x[at];
          s[b] = rstd[r + b];
        }
#pragma unroll
        for (int b = 0; b < kRowBatch; ++b) acc += model::RmsNormWeightGradTerm(d[b], xv[b], s[b]);
      }
      for (; r < r1; ++r) {
        const int64_t at = rows.Offset(r) + c;
        acc += model::RmsNormWeightGradTerm(dy[at], x[at], rstd[r]);
      }
    }
    part[k][lane] = acc;
  }
  __syncthreads();
  if (warp == 0 && c < rows.n) {
    float acc = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) acc += part[k][lane];
    dw[c] += acc;
  }
}

// ---- RoPE ----

template <bool kBackward>
__global__ void RopeKernel(float* x, StridedRows rows, int64_t seq_len, const float* __restrict__ cos_table,
                           const float* __restrict__ sin_table) {
  const int64_t half = rows.n / 2;
  const size_t total = static_cast<size_t>(rows.rows) * static_cast<size_t>(half);
  for (size_t e = GlobalThread(); e < total; e += GridStride()) {
    const int64_t r = static_cast<int64_t>(e / static_cast<size_t>(half));
    const int64_t i = static_cast<int64_t>(e % static_cast<size_t>(half));
    float* v = x + rows.Offset(r);
    const int64_t at = ((r / rows.per_token) % seq_len) * half + i;
    float a = v[i], b = v[i + half];
    if constexpr (kBackward) {
      model::RopeRotateBack(a, b, cos_table[at], sin_table[at]);
    } else {
      model::RopeRotate(a, b, cos_table[at], sin_table[at]);
    }
    v[i] = a;
    v[i + half] = b;
  }
}

// ---- SwiGLU ----

template <class Out>
__global__ void SwiGluForwardKernel(const float* __restrict__ x, Out* __restrict__ out, int64_t rows, int64_t inter) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(inter);
  for (size_t e = GlobalThread(); e < n; e += GridStride()) {
    const int64_t r = static_cast<int64_t>(e / static_cast<size_t>(inter));
    const int64_t i = static_cast<int64_t>(e % static_cast<size_t>(inter));
    const float* gate = x + r * 2 * inter;
    StoreAs(out + e, model::SwiGlu(gate[i], gate[inter + i]));
  }
}

template <class Out>
__global__ void SwiGluBackwardKernel(const float* __restrict__ x, const float* __restrict__ dy, Out* __restrict__ dx,
                                     int64_t rows, int64_t inter) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(inter);
  for (size_t e = GlobalThread(); e < n; e += GridStride()) {
    const int64_t r = static_cast<int64_t>(e / static_cast<size_t>(inter));
    const int64_t i = static_cast<int64_t>(e % static_cast<size_t>(inter));
    const float* gate = x + r * 2 * inter;
    Out* dgate = dx + r * 2 * inter;
    float dg, du;
    model::SwiGluGrad(gate[i], gate[inter + i], dy[e], dg, du);
    StoreAs(dgate + i, dg);
    StoreAs(dgate + inter + i, du);
  }
}

Status CheckRows(const char* fn, const StridedRows& rows) {
  if (rows.rows < 0 || rows.n < 1 || rows.per_token < 1 || rows.token_stride < rows.per_token * rows.n) {
    return InvalidArgument(std::string(fn) + ": rows " + std::to_string(rows.rows) + ", n " + std::to_string(rows.n) +
                           ", per_token " + std::to_string(rows.per_token) + ", token_stride " +
                           std::to_string(rows.token_stride) +
                           " (need rows >= 0, n >= 1, per_token >= 1, token_stride >= per_token · n)");
  }
  return Status::Ok();
}

Status Rope(const char* fn, bool backward, float* x, const StridedRows& rows, int64_t seq_len, const float* cos,
            const float* sin, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows(fn, rows));
  if (rows.n % 2 != 0) return InvalidArgument(std::string(fn) + ": head size " + std::to_string(rows.n) + " is odd");
  if (seq_len < 1) return InvalidArgument(std::string(fn) + ": seq_len " + std::to_string(seq_len));
  if (rows.rows == 0) return Status::Ok();
  if (!x || !cos || !sin) return InvalidArgument(std::string(fn) + ": null x, cos or sin");
  const size_t n = static_cast<size_t>(rows.rows) * static_cast<size_t>(rows.n / 2);
  auto s = static_cast<cudaStream_t>(stream);
  if (backward) {
    RopeKernel<true><<<BlocksFor(n), kThreads, 0, s>>>(x, rows, seq_len, cos, sin);
  } else {
    RopeKernel<false><<<BlocksFor(n), kThreads, 0, s>>>(x, rows, seq_len, cos, sin);
  }
  return ZINF_CHECK_LAUNCH("RopeKernel");
}

Status CheckSwiGlu(const char* fn, int64_t rows, int64_t inter) {
  if (rows < 0 || inter < 1) {
    return InvalidArgument(std::string(fn) + ": rows " + std::to_string(rows) + ", inter " + std::to_string(inter) +
                           " (need rows >= 0, inter >= 1)");
  }
  return Status::Ok();
}

template <class Out>
Status LaunchRmsNormForward(const char* fn, const float* x, const float* w, Out* y, float* rstd,
                            const StridedRows& rows, float eps, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows(fn, rows));
  if (!(eps > 0.0f)) return InvalidArgument(std::string(fn) + ": eps must be positive");
  if (rows.rows == 0) return Status::Ok();
  if (!x || !w || !y || !rstd) return InvalidArgument(std::string(fn) + ": null x, w, y or rstd");
  if constexpr (sizeof(Out) != sizeof(float)) {  // a narrower y may not overlap x (y == x is fine in fp32)
    const size_t extent = static_cast<size_t>(rows.Offset(rows.rows - 1) + rows.n);
    if (Overlap(x, extent * sizeof(float), y, extent * sizeof(Out))) {
      return InvalidArgument(std::string(fn) + ": y overlaps x");
    }
  }
  RmsNormForwardKernel<Out><<<BlocksForHalfWarpRows(rows.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, w, y, rstd, rows, eps);
  return ZINF_CHECK_LAUNCH("RmsNormForwardKernel");
}

}  // namespace

Status RmsNormForward(const float* x, const float* w, float* y, float* rstd, const StridedRows& rows, float eps,
                      void* stream) {
  return LaunchRmsNormForward("gpu::RmsNormForward", x, w, y, rstd, rows, eps, stream);
}

Status RmsNormForwardBf16(const float* x, const float* w, uint16_t* y, float* rstd, const StridedRows& rows, float eps,
                          void* stream) {
  return LaunchRmsNormForward("gpu::RmsNormForwardBf16", x, w, y, rstd, rows, eps, stream);
}

Status RmsNormBackward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                       bool accumulate_dx, float* dw, const StridedRows& rows, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows("gpu::RmsNormBackward", rows));
  if (rows.rows == 0) return Status::Ok();
  if (!dy || !x || !w || !rstd || !dx || !dw) {
    return InvalidArgument("gpu::RmsNormBackward: null dy, x, w, rstd, dx or dw");
  }
  auto s = static_cast<cudaStream_t>(stream);
  // The weight gradient first: with dx == dy the row pass overwrites dy.
  const unsigned tiles = static_cast<unsigned>((rows.n + 31) / 32);
  RmsNormWeightGradKernel<<<tiles, kColumnWarps * 32, 0, s>>>(dy, x, rstd, dw, rows);
  ZINF_RETURN_IF_ERROR(ZINF_CHECK_LAUNCH("RmsNormWeightGradKernel"));
  RmsNormBackwardRowsKernel<<<BlocksForHalfWarpRows(rows.rows), kThreads, 0, s>>>(dy, x, w, rstd, dx, accumulate_dx,
                                                                                 rows);
  return ZINF_CHECK_LAUNCH("RmsNormBackwardRowsKernel");
}

Status RopeForward(float* x, const StridedRows& rows, int64_t seq_len, const float* cos, const float* sin,
                   void* stream) {
  return Rope("gpu::RopeForward", false, x, rows, seq_len, cos, sin, stream);
}

Status RopeBackward(float* dx, const StridedRows& rows, int64_t seq_len, const float* cos, const float* sin,
                    void* stream) {
  return Rope("gpu::RopeBackward", true, dx, rows, seq_len, cos, sin, stream);
}

namespace {

template <class Out>
Status LaunchSwiGluForward(const char* fn, const float* x, Out* out, int64_t rows, int64_t inter, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckSwiGlu(fn, rows, inter));
  if (rows == 0) return Status::Ok();
  if (!x || !out) return InvalidArgument(std::string(fn) + ": null x or out");
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(inter);
  if (Overlap(x, 2 * n * 4, out, n * sizeof(Out))) return InvalidArgument(std::string(fn) + ": out overlaps x");
  SwiGluForwardKernel<Out><<<BlocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, out, rows, inter);
  return ZINF_CHECK_LAUNCH("SwiGluForwardKernel");
}

template <class Out>
Status LaunchSwiGluBackward(const char* fn, const float* x, const float* dy, Out* dx, int64_t rows, int64_t inter,
                            void* stream) {
  ZINF_RETURN_IF_ERROR(CheckSwiGlu(fn, rows, inter));
  if (rows == 0) return Status::Ok();
  if (!x || !dy || !dx) return InvalidArgument(std::string(fn) + ": null x, dy or dx");
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(inter);
  if (Overlap(x, 2 * n * 4, dx, 2 * n * sizeof(Out)) || Overlap(dy, n * 4, dx, 2 * n * sizeof(Out))) {
    return InvalidArgument(std::string(fn) + ": dx overlaps x or dy");
  }
  SwiGluBackwardKernel<Out><<<BlocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, dy, dx, rows, inter);
  return ZINF_CHECK_LAUNCH("SwiGluBackwardKernel");
}

}  // namespace

Status SwiGluForward(const float* x, float* out, int64_t rows, int64_t inter, void* stream) {
  return LaunchSwiGluForward("gpu::SwiGluForward", x, out, rows, inter, stream);
}

Status SwiGluForwardBf16(const float* x, uint16_t* out, int64_t rows, int64_t inter, void* stream) {
  return LaunchSwiGluForward("gpu::SwiGluForwardBf16", x, out, rows, inter, stream);
}

Status SwiGluBackward(const float* x, const float* dy, float* dx, int64_t rows, int64_t inter, void* stream) {
  return LaunchSwiGluBackward("gpu::SwiGluBackward", x, dy, dx, rows, inter, stream);
}

Status SwiGluBackwardBf16(const float* x, const float* dy, uint16_t* dx, int64_t rows, int64_t inter, void* stream) {
  return LaunchSwiGluBackward("gpu::SwiGluBackwardBf16", x, dy, dx, rows, inter, stream);
}

}  // namespace zinf::gpu
