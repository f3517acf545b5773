// The kernels of gpu/decoder_kernels.h (launched by decoder_kernels.cu).
// Built as gpu/kernels.cu is
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
// RoPE and SwiGLU are elementwise (gpu/elementwise.cuh's loop): eight
// rotated pairs or outputs a thread through 16-byte accesses where the
// shapes and alignment allow it, else one a thread.
//
// The kernels use only gpu/simt.cuh's instructions, so this header also
// compiles in a host compiler against the CPU emulation
// (tests/gpu/decoder_kernels_emu_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpu/decoder_kernels.h"
#include "gpu/elementwise.cuh"
#include "gpu/half_warp_lanes.cuh"
#include "gpu/simt.cuh"
#include "math/decoder_math.h"
#include "math/lane_math.h"

namespace zinf::gpu::decoder {

using math::kLanes;

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = size_t{1} << 16;
constexpr int64_t kHalfWarpsPerBlock = kThreads / kLanes;
// The weight gradient's block: 32 warps, so each takes at most four of the
// (at most 128) chunks; the q/k norm has only D / 32 column tiles.
constexpr int kColumnWarps = 32;

// Blocks of kThreads for `rows` half-warp rows (grid-stride beyond kMaxBlocks).
inline unsigned BlocksForHalfWarpRows(int64_t rows) {
  const int64_t b = (rows + kHalfWarpsPerBlock - 1) / kHalfWarpsPerBlock;
  return static_cast<unsigned>(b < static_cast<int64_t>(kMaxBlocks) ? b : static_cast<int64_t>(kMaxBlocks));
}

// ---- RMSNorm ----

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
    ForLaneBatches<kForwardRowBatch>(
        lane, full, [&](int64_t c) { return xr[c]; }, [&](int64_t, float v) { acc += v * v; });
    const float tail_x = lane < tail ? xr[full + lane] : 0.0f;
    const float s = math::RmsNormRstd(LaneSumThenTail(mask, acc, tail_x * tail_x, tail), n, eps);
    Out* yr = y + at;
    ForLaneBatches<kForwardRowBatch>(
        lane, n,
        [&](int64_t c) {
          return XW{xr[c], w[c]};
        },
        [&](int64_t c, XW v) { simt::StoreAs(yr + c, math::RmsNormOutput(v.x, s, v.w)); });
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
    ForLaneBatches<kBackwardRowBatch>(
        lane, full,
        [&](int64_t c) {
          return Terms{dyr[c], w[c], xr[c], 0.0f};
        },
        [&](int64_t, Terms v) { acc += math::RmsNormGradDotTerm(v.dy, v.w, v.x, s); });
    const float tail_term =
        lane < tail ? math::RmsNormGradDotTerm(dyr[full + lane], w[full + lane], xr[full + lane], s) : 0.0f;
    const float dot = LaneSumThenTail(mask, acc, tail_term, tail);
    float* dxr = dx + at;
    ForLaneBatches<kBackwardRowBatch>(
        lane, n,
        [&](int64_t c) {
          return Terms{dyr[c], w[c], xr[c], accumulate ? dxr[c] : 0.0f};
        },
        [&](int64_t c, Terms v) {
          const float g = math::RmsNormInputGrad(v.dy, v.w, v.x, s, dot, n);
          dxr[c] = accumulate ? v.dx + g : g;
        });
  }
}

__global__ void __launch_bounds__(kColumnWarps * 32)
    RmsNormWeightGradKernel(const float* __restrict__ dy, const float* __restrict__ x, const float* __restrict__ rstd,
                            float* __restrict__ dw, StridedRows rows) {
  using Partials = float[32];
  ZINF_STATIC_SMEM(Partials, part, math::kMaxColumnChunks);
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const int64_t R = rows.rows;
  const int64_t chunk = math::ColumnChunkRows(R), chunks = (R + chunk - 1) / chunk;
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
        for (int b = 0; b < kRowBatch; ++b) acc += math::RmsNormWeightGradTerm(d[b], xv[b], s[b]);
      }
      for (; r < r1; ++r) {
        const int64_t at = rows.Offset(r) + c;
        acc += math::RmsNormWeightGradTerm(dy[at], x[at], rstd[r]);
      }
    }
    part[k][lane] = acc;
  }
  simt::SyncThreads();
  if (warp == 0 && c < rows.n) {
    float acc = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) acc += part[k][lane];
    dw[c] += acc;
  }
}

// ---- RoPE ----

// Row r's pairs (i, i + n/2), rotated by position (r / per_token) % seq_len;
// with `vector`, eight pairs a thread (half = n/2 a multiple of 8, every row
// and the tables 16-byte aligned: RopeVector). T is float, or uint16_t for
// rows kept in bf16 (model::QkvInBf16): each pair widened, rotated in fp32
// and rounded as it is written.
template <bool kBackward, class T = float>
__global__ void RopeKernel(T* x, StridedRows rows, int64_t seq_len, const float* __restrict__ cos_table,
                           const float* __restrict__ sin_table, bool vector) {
  const int64_t half = rows.n / 2;
  const size_t total = static_cast<size_t>(rows.rows) * static_cast<size_t>(half);
  const auto rotate = [](float& a, float& b, float cos_t, float sin_t) {
    if constexpr (kBackward) {
      math::RopeRotateBack(a, b, cos_t, sin_t);
    } else {
      math::RopeRotate(a, b, cos_t, sin_t);
    }
  };
  // Pair e: its first element in x (the second is half further on) and
  // its position's entry in the tables.
  struct Pair {
    T* v;
    int64_t at;
  };
  const auto pair = [&](size_t e) {
    const int64_t r = static_cast<int64_t>(e / static_cast<size_t>(half));
    const int64_t i = static_cast<int64_t>(e % static_cast<size_t>(half));
    return Pair{x + rows.Offset(r) + i, ((r / rows.per_token) % seq_len) * half + i};
  };
  elementwise::ForEach(
      total, vector,
      [&](size_t e) {
        using elementwise::kVec;
        const Pair p = pair(e);
        float a[kVec], b[kVec], ct[kVec], st[kVec];
        elementwise::Load8(p.v, a);
        elementwise::Load8(p.v + half, b);
        elementwise::Load8(cos_table + p.at, ct);
        elementwise::Load8(sin_table + p.at, st);
#pragma unroll
        for (int k = 0; k < kVec; ++k) rotate(a[k], b[k], ct[k], st[k]);
        elementwise::Store8(p.v, a);
        elementwise::Store8(p.v + half, b);
      },
      [&](size_t e) {
        const Pair p = pair(e);
        float a = elementwise::LoadAs(p.v), b = elementwise::LoadAs(p.v + half);
        rotate(a, b, cos_table[p.at], sin_table[p.at]);
        simt::StoreAs(p.v, a);
        simt::StoreAs(p.v + half, b);
      });
}
// Rows of T start 16-byte aligned (each a whole number of groups of eight
// pairs, token_stride a multiple of 16 bytes).
template <class T>
inline bool RopeVector(const T* x, const StridedRows& rows, const float* cos_table, const float* sin_table) {
  using elementwise::Aligned16;
  return rows.n % (2 * elementwise::kVec) == 0 && rows.token_stride % (16 / static_cast<int64_t>(sizeof(T))) == 0 &&
         Aligned16(x) && Aligned16(cos_table) && Aligned16(sin_table);
}

// ---- SwiGLU ----
//
// x holds rows of [gate | up], 2 · inter each; out (and dy) rows of inter.
// With `vector`, eight outputs a thread (inter a multiple of 8, the arrays
// 16-byte aligned: SwiGluVector). In (x), Dy and Out are float, or uint16_t
// for bf16 (a tensor kept in bf16 alone: with bf16 products, a SwiGLU MLP
// without an fc bias keeps its fc output and the activation's gradient so,
// model::SwiGluInBf16); each element is widened, computed in fp32 and
// rounded as it is written.

// Output e's gate element in x (its up element is `inter` further on).
__device__ inline int64_t GateOffset(size_t e, int64_t inter) {
  const size_t n = static_cast<size_t>(inter);
  return static_cast<int64_t>((e / n) * 2 * n + e % n);
}

template <class Out, class In = float>
__global__ void SwiGluForwardKernel(const In* __restrict__ x, Out* __restrict__ out, int64_t rows, int64_t inter,
                                    bool vector) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(inter);
  elementwise::ForEach(
      n, vector,
      [&](size_t e) {
        using elementwise::kVec;
        const In* gate = x + GateOffset(e, inter);
        float g[kVec], u[kVec];
        elementwise::Load8(gate, g);
        elementwise::Load8(gate + inter, u);
#pragma unroll
        for (int k = 0; k < kVec; ++k) g[k] = math::SwiGlu(g[k], u[k]);
        elementwise::Store8(out + e, g);
      },
      [&](size_t e) {
        const In* gate = x + GateOffset(e, inter);
        simt::StoreAs(out + e, math::SwiGlu(elementwise::LoadAs(gate), elementwise::LoadAs(gate + inter)));
      });
}

template <class Out, class In = float, class Dy = float>
__global__ void SwiGluBackwardKernel(const In* __restrict__ x, const Dy* __restrict__ dy, Out* __restrict__ dx,
                                     int64_t rows, int64_t inter, bool vector) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(inter);
  elementwise::ForEach(
      n, vector,
      [&](size_t e) {
        using elementwise::kVec;
        const In* gate = x + GateOffset(e, inter);
        Out* dgate = dx + GateOffset(e, inter);
        float g[kVec], u[kVec], d[kVec];
        elementwise::Load8(gate, g);
        elementwise::Load8(gate + inter, u);
        elementwise::Load8(dy + e, d);
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          float dg, du;
          math::SwiGluGrad(g[k], u[k], d[k], dg, du);
          g[k] = dg;
          u[k] = du;
        }
        elementwise::Store8(dgate, g);
        elementwise::Store8(dgate + inter, u);
      },
      [&](size_t e) {
        const In* gate = x + GateOffset(e, inter);
        Out* dgate = dx + GateOffset(e, inter);
        float dg, du;
        math::SwiGluGrad(elementwise::LoadAs(gate), elementwise::LoadAs(gate + inter), elementwise::LoadAs(dy + e), dg,
                         du);
        simt::StoreAs(dgate, dg);
        simt::StoreAs(dgate + inter, du);
      });
}
inline bool SwiGluVector(const void* x, const void* dy, const void* out, int64_t inter) {
  using elementwise::Aligned16;
  return inter % elementwise::kVec == 0 && Aligned16(x) && Aligned16(dy) && Aligned16(out);
}

}  // namespace zinf::gpu::decoder
