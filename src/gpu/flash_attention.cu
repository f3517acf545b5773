// Flash attention on tensor cores (math/attention_math.h has the algorithm
// and the per-element steps; model/flash_attention.cc is the CPU twin, block
// for block). bf16 operands through WMMA 16×16×16 fragments with fp32
// accumulation; the inputs stay fp32 in memory and are rounded to bf16 (to
// nearest even, common/float16.h) as their tiles enter shared memory.
//
// Blocks of kFlashBlock = 64 queries and 64 keys, four warps of 16 rows
// each. Per thread block:
//   forward: one (batch row, head, query block), over the key blocks up to
//     the diagonal; each warp keeps its rows' output in shared memory (fp32)
//     so the online softmax can rescale it, and its max and sum in registers
//     (two lanes per row, 32 columns each).
//   backward: δ by one warp per row; dK and dV by one (batch row, kv head,
//     key block) over the group's heads and the query blocks from the
//     diagonal on, accumulated in registers; dQ by one (batch row, head,
//     query block), recomputing p and ds. The backward scores come 16
//     columns at a time (small fp32 scratch: two thread blocks per SM). No
//     atomics: every gradient is written once by one block, so the results
//     repeat bit for bit.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/float16.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels.h"
#include "math/attention_math.h"

namespace zinf::gpu {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
using model::AttentionShape;
using model::AttentionTensors;

constexpr int kB = model::kFlashBlock;
constexpr int kWarps = 4;
constexpr int kThreadsFa = kWarps * 32;
constexpr int kWarpRows = kB / kWarps;  // 16, one fragment's height
static_assert(kWarpRows == 16, "one WMMA row of fragments per warp");
constexpr unsigned kFull = 0xffffffffu;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Shared-memory pitches (elements): padded rows keep WMMA's 32-byte
// alignment (16 rows × pitch × element size is a multiple of 32) and spread
// the banks.
template <int D>
struct Pitch {
  static constexpr int kTile = D + 8;      // bf16 [64][D] tiles of q, k, v, dO
  static constexpr int kScore = kB + 4;    // fp32 [16][64] scores per warp
  static constexpr int kProb = kB + 8;     // bf16 [16][64] p or ds per warp
  static constexpr int kOut = D + 4;       // fp32 [16][D] output per warp
  static constexpr int kTileBytes = kB * kTile * 2;
  static constexpr int kScoreBytes = kWarpRows * kScore * 4;
  static constexpr int kProbBytes = kWarpRows * kProb * 2;
  static constexpr int kOutBytes = kWarpRows * kOut * 4;
};

__device__ inline int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ inline bf16 ToBf16(float x) { return __ushort_as_bfloat16(FloatToBf16Bits(x)); }

// Rows [first, first + count) of one head (count <= 64), D values each at
// base + row · stride, rounded into a [64][D + 8] bf16 tile; rows past
// count are zero. Four values per load where base and stride allow it.
template <int D>
__device__ void LoadTile(bf16* tile, const float* base, int64_t stride, int64_t first, int count) {
  if (((reinterpret_cast<uintptr_t>(base) | static_cast<uintptr_t>(stride * 4)) & 15) == 0) {
    constexpr int kQuads = D / 4;
#pragma unroll 4
    for (int e = threadIdx.x; e < kB * kQuads; e += kThreadsFa) {
      const int r = e / kQuads, d = e % kQuads * 4;
      const float4 x = r < count ? *reinterpret_cast<const float4*>(base + (first + r) * stride + d)
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      uint2 packed;  // element d at the lower address
      packed.x = FloatToBf16Bits(x.x) | static_cast<uint32_t>(FloatToBf16Bits(x.y)) << 16;
      packed.y = FloatToBf16Bits(x.z) | static_cast<uint32_t>(FloatToBf16Bits(x.w)) << 16;
      *reinterpret_cast<uint2*>(tile + r * Pitch<D>::kTile + d) = packed;
    }
    return;
  }
  for (int e = threadIdx.x; e < kB * D; e += kThreadsFa) {
    const int r = e / D, d = e % D;
    const float x = r < count ? base[(first + r) * stride + d] : 0.0f;
    tile[r * Pitch<D>::kTile + d] = ToBf16(x);
  }
}

// The [16][64] product of the warp's 16 rows of `a` (a [64][D] tile) with
// the 64 rows of `b` transposed, stored fp32 at `out` (pitch kScore).
template <int D>
__device__ void RowsTimesTileT(const bf16* a_rows, const bf16* b, float* out) {
#pragma unroll
  for (int n = 0; n < kB / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a_rows + kk * 16, Pitch<D>::kTile);
      wmma::load_matrix_sync(fb, b + n * 16 * Pitch<D>::kTile + kk * 16, Pitch<D>::kTile);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, Pitch<D>::kScore, wmma::mem_row_major);
  }
}

// acc[n] += p (a warp's [16][64] bf16, pitch kProb) × tile (a [64][D] tile),
// for the D / 16 column fragments n.
template <int D>
__device__ void ProbTimesTile(FragC (&acc)[D / 16], const bf16* p, const bf16* tile) {
#pragma unroll
  for (int kk = 0; kk < kB / 16; ++kk) {
    FragA fa;
    wmma::load_matrix_sync(fa, p + kk * 16, Pitch<D>::kProb);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, tile + kk * 16 * Pitch<D>::kTile + n * 16, Pitch<D>::kTile);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes a warp's 16 rows of D fp32 values from the staging buffer to
// base + (first + r) · stride for the rows below `count`, times `scale`;
// lanes run along the row (coalesced).
template <int D>
__device__ void StoreRows(float* base, int64_t stride, int64_t first, int count, const float* stage, float scale,
                          int lane) {
  for (int r = 0; r < kWarpRows && r < count; ++r) {
    for (int d = lane; d < D; d += 32) base[(first + r) * stride + d] = stage[r * Pitch<D>::kOut + d] * scale;
  }
}

template <int D>
__device__ void StoreFragments(FragC (&acc)[D / 16], float* stage) {
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::store_matrix_sync(stage + n * 16, acc[n], Pitch<D>::kOut, wmma::mem_row_major);
}

template <int D>
__global__ void __launch_bounds__(kThreadsFa) FlashForwardKernel(AttentionShape s, AttentionTensors t) {
  using P = Pitch<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = reinterpret_cast<bf16*>(smem + P::kTileBytes);
  bf16* vs = reinterpret_cast<bf16*>(smem + 2 * P::kTileBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* sw = reinterpret_cast<float*>(smem + 3 * P::kTileBytes + warp * P::kScoreBytes);
  bf16* pw = reinterpret_cast<bf16*>(smem + 3 * P::kTileBytes + kWarps * P::kScoreBytes + warp * P::kProbBytes);
  float* ow = reinterpret_cast<float*>(smem + 3 * P::kTileBytes + kWarps * (P::kScoreBytes + P::kProbBytes) +
                                       warp * P::kOutBytes);

  const int64_t T = s.seq_len, H = s.heads, G = s.heads / s.kv_heads;
  const int64_t nb = (T + kB - 1) / kB;
  const int64_t qb = nb - 1 - blockIdx.x;  // the longest rows first
  const int64_t b = blockIdx.y / H, h = blockIdx.y % H, hk = h / G;
  const int64_t row0 = b * T, i0 = qb * kB;
  LoadTile<D>(qs, t.q + h * D, t.q_stride, row0 + i0, static_cast<int>(Min64(kB, T - i0)));
  for (int e = lane; e < kWarpRows * D; e += 32) ow[(e / D) * P::kOut + e % D] = 0.0f;

  // Lane pair (2r, 2r + 1) holds row r: columns [32 half, 32 half + 32).
  const int r = lane >> 1, half = lane & 1;
  const int64_t i = i0 + warp * kWarpRows + r;
  float m = -INFINITY, l = 0.0f;
  for (int64_t kb = 0; kb <= qb; ++kb) {
    const int64_t j0 = kb * kB;
    const int keys = static_cast<int>(Min64(kB, T - j0));
    __syncthreads();  // every warp is done with the previous k and v
    LoadTile<D>(ks, t.k + hk * D, t.kv_stride, row0 + j0, keys);
    LoadTile<D>(vs, t.v + hk * D, t.kv_stride, row0 + j0, keys);
    __syncthreads();
    RowsTimesTileT<D>(qs + warp * kWarpRows * P::kTile, ks, sw);
    __syncwarp();
    float row_max = -INFINITY;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      if (model::FlashVisible(i, j0 + c, T)) row_max = fmaxf(row_max, sw[r * P::kScore + c] * s.scale);
    }
    row_max = fmaxf(row_max, __shfl_xor_sync(kFull, row_max, 1));
    const float m_new = fmaxf(m, row_max);
    const float alpha = model::FlashRescale(m, m_new);
    float sum = 0.0f;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const float p =
          model::FlashVisible(i, j0 + c, T) ? model::FlashProb(sw[r * P::kScore + c] * s.scale, m_new) : 0.0f;
      sum += p;
      pw[r * P::kProb + c] = ToBf16(p);
    }
    sum += __shfl_xor_sync(kFull, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    for (int d = half * (D / 2); d < half * (D / 2) + D / 2; ++d) ow[r * P::kOut + d] *= alpha;
    __syncwarp();
    FragC acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; ++n) wmma::load_matrix_sync(acc[n], ow + n * 16, P::kOut, wmma::mem_row_major);
    ProbTimesTile<D>(acc, pw, vs);
    StoreFragments<D>(acc, ow);
    __syncwarp();
  }
  // Normalize in place (the row's lanes), then write coalesced.
  const float inv = 1.0f / l;
  for (int d = half * (D / 2); d < half * (D / 2) + D / 2; ++d) ow[r * P::kOut + d] *= inv;
  if (half == 0 && i < T) t.lse[(b * H + h) * T + i] = model::FlashLse(m, l);
  __syncwarp();
  const int64_t first = i0 + warp * kWarpRows;
  StoreRows<D>(t.out + h * D, t.out_stride, row0 + first, static_cast<int>(Min64(kWarpRows, T - first)), ow,
               1.0f, lane);
}

// δ = dO · O per (token, head), one warp each.
template <int D>
__global__ void FlashDeltaKernel(AttentionShape s, AttentionTensors t) {
  const int64_t rows = s.batch * s.seq_len * s.heads;
  const int lane = threadIdx.x % 32;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < rows;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
    const int64_t h = w % s.heads, token = w / s.heads;  // token = b · T + i
    const float* dout = t.dout + token * t.out_stride + h * D;
    const float* out = t.out + token * t.out_stride + h * D;
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += dout[d] * out[d];
    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(kFull, acc, o);
    const int64_t b = token / s.seq_len, i = token % s.seq_len;
    if (lane == 0) t.delta[(b * s.heads + h) * s.seq_len + i] = acc;
  }
}

// Loads the statistics of rows [first, first + count) of (b, h) into
// shared memory (0 past count).
__device__ void LoadStats(float* lse_s, float* delta_s, const AttentionTensors& t, int64_t stat0, int count) {
  for (int c = threadIdx.x; c < kB; c += kThreadsFa) {
    lse_s[c] = c < count ? t.lse[stat0 + c] : 0.0f;
    delta_s[c] = c < count ? t.delta[stat0 + c] : 0.0f;
  }
}

// Backward scores come 16 columns at a time: a warp's [16][16] tile of
// q·k and of dO·v (fp32, pitch kSub), turned into p and ds at once, so the
// fp32 scratch stays small and two thread blocks fit an SM.
constexpr int kSub = 16 + 4;
constexpr int kSubBytes = kWarpRows * kSub * 4;

// The [16][16] products a_rows · b_tileᵀ of the warp's rows of two pairs
// of tiles, for the 16 b rows from b_row: (a1, b1) into s1, (a2, b2) into s2.
template <int D>
__device__ void TwoProductsT(const bf16* a1, const bf16* b1, float* s1, const bf16* a2, const bf16* b2, float* s2) {
  FragC c1, c2;
  wmma::fill_fragment(c1, 0.0f);
  wmma::fill_fragment(c2, 0.0f);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    FragA fa;
    FragBCol fb;
    wmma::load_matrix_sync(fa, a1 + kk * 16, Pitch<D>::kTile);
    wmma::load_matrix_sync(fb, b1 + kk * 16, Pitch<D>::kTile);
    wmma::mma_sync(c1, fa, fb, c1);
    wmma::load_matrix_sync(fa, a2 + kk * 16, Pitch<D>::kTile);
    wmma::load_matrix_sync(fb, b2 + kk * 16, Pitch<D>::kTile);
    wmma::mma_sync(c2, fa, fb, c2);
  }
  wmma::store_matrix_sync(s1, c1, kSub, wmma::mem_row_major);
  wmma::store_matrix_sync(s2, c2, kSub, wmma::mem_row_major);
}

template <int D>
__global__ void __launch_bounds__(kThreadsFa) FlashBackwardKvKernel(AttentionShape s, AttentionTensors t) {
  using P = Pitch<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = reinterpret_cast<bf16*>(smem + P::kTileBytes);
  bf16* qs = reinterpret_cast<bf16*>(smem + 2 * P::kTileBytes);
  bf16* dos = reinterpret_cast<bf16*>(smem + 3 * P::kTileBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* wbase = smem + 4 * P::kTileBytes;
  float* st = reinterpret_cast<float*>(wbase + warp * 2 * kSubBytes);  // (q kᵀ)ᵀ, 16 query columns
  float* dpt = st + kWarpRows * kSub;                                  // (dO vᵀ)ᵀ
  wbase += kWarps * 2 * kSubBytes;
  bf16* pt = reinterpret_cast<bf16*>(wbase + warp * 2 * P::kProbBytes);
  bf16* dst = pt + kWarpRows * P::kProb;
  wbase += kWarps * 2 * P::kProbBytes;
  float* lse_s = reinterpret_cast<float*>(wbase);
  float* delta_s = lse_s + kB;

  const int64_t T = s.seq_len, H = s.heads, G = s.heads / s.kv_heads;
  const int64_t nb = (T + kB - 1) / kB;
  const int64_t kb = blockIdx.x;  // the most query blocks first
  const int64_t b = blockIdx.y / s.kv_heads, hk = blockIdx.y % s.kv_heads;
  const int64_t row0 = b * T, j0 = kb * kB;
  const int keys = static_cast<int>(Min64(kB, T - j0));
  LoadTile<D>(ks, t.k + hk * D, t.kv_stride, row0 + j0, keys);
  LoadTile<D>(vs, t.v + hk * D, t.kv_stride, row0 + j0, keys);

  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  // Lane pair (2r, 2r + 1) holds key row r: 8 query columns each.
  const int r = lane >> 1, c0 = (lane & 1) * 8;
  const int64_t j = j0 + warp * kWarpRows + r;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = hk * G + g;
    for (int64_t qb = kb; qb < nb; ++qb) {
      const int64_t i0 = qb * kB;
      const int rows = static_cast<int>(Min64(kB, T - i0));
      __syncthreads();  // every warp is done with the previous q and dO
      LoadTile<D>(qs, t.q + h * D, t.q_stride, row0 + i0, rows);
      LoadTile<D>(dos, t.dout + h * D, t.out_stride, row0 + i0, rows);
      LoadStats(lse_s, delta_s, t, (b * H + h) * T + i0, rows);
      __syncthreads();
#pragma unroll
      for (int n = 0; n < kB / 16; ++n) {
        TwoProductsT<D>(ks + warp * kWarpRows * P::kTile, qs + n * 16 * P::kTile, st,
                        vs + warp * kWarpRows * P::kTile, dos + n * 16 * P::kTile, dpt);
        __syncwarp();
        for (int cc = c0; cc < c0 + 8; ++cc) {
          const int c = n * 16 + cc;
          float p = 0.0f, ds = 0.0f;
          if (model::FlashVisible(i0 + c, j, T)) {
            p = model::FlashProb(st[r * kSub + cc] * s.scale, lse_s[c]);
            ds = model::FlashScoreGrad(p, dpt[r * kSub + cc], delta_s[c]);
          }
          pt[r * P::kProb + c] = ToBf16(p);
          dst[r * P::kProb + c] = ToBf16(ds);
        }
        __syncwarp();
      }
      ProbTimesTile<D>(dv, pt, dos);  // dV += pᵀ dO
      ProbTimesTile<D>(dk, dst, qs);  // dK += dsᵀ q
    }
  }
  // Stage through the tiles' memory, free once every warp is done.
  __syncthreads();
  float* stage = reinterpret_cast<float*>(smem + warp * P::kOutBytes);
  const int64_t first = j0 + warp * kWarpRows;
  const int count = static_cast<int>(Min64(kWarpRows, T - first));
  StoreFragments<D>(dv, stage);
  __syncwarp();
  StoreRows<D>(t.dv + hk * D, t.kv_stride, row0 + first, count, stage, 1.0f, lane);
  __syncwarp();
  StoreFragments<D>(dk, stage);
  __syncwarp();
  StoreRows<D>(t.dk + hk * D, t.kv_stride, row0 + first, count, stage, s.scale, lane);
}

template <int D>
__global__ void __launch_bounds__(kThreadsFa) FlashBackwardQKernel(AttentionShape s, AttentionTensors t) {
  using P = Pitch<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = reinterpret_cast<bf16*>(smem + P::kTileBytes);
  bf16* ks = reinterpret_cast<bf16*>(smem + 2 * P::kTileBytes);
  bf16* vs = reinterpret_cast<bf16*>(smem + 3 * P::kTileBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* wbase = smem + 4 * P::kTileBytes;
  float* sw = reinterpret_cast<float*>(wbase + warp * 2 * kSubBytes);  // q kᵀ, 16 key columns
  float* dpw = sw + kWarpRows * kSub;                                  // dO vᵀ
  wbase += kWarps * 2 * kSubBytes;
  bf16* dsw = reinterpret_cast<bf16*>(wbase + warp * P::kProbBytes);
  wbase += kWarps * P::kProbBytes;
  float* lse_s = reinterpret_cast<float*>(wbase);
  float* delta_s = lse_s + kB;

  const int64_t T = s.seq_len, H = s.heads, G = s.heads / s.kv_heads;
  const int64_t nb = (T + kB - 1) / kB;
  const int64_t qb = nb - 1 - blockIdx.x;
  const int64_t b = blockIdx.y / H, h = blockIdx.y % H, hk = h / G;
  const int64_t row0 = b * T, i0 = qb * kB;
  const int rows = static_cast<int>(Min64(kB, T - i0));
  LoadTile<D>(qs, t.q + h * D, t.q_stride, row0 + i0, rows);
  LoadTile<D>(dos, t.dout + h * D, t.out_stride, row0 + i0, rows);
  LoadStats(lse_s, delta_s, t, (b * H + h) * T + i0, rows);

  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  const int r = lane >> 1, c0 = (lane & 1) * 8;
  const int row = warp * kWarpRows + r;
  const int64_t i = i0 + row;
  for (int64_t kb = 0; kb <= qb; ++kb) {
    const int64_t j0 = kb * kB;
    const int keys = static_cast<int>(Min64(kB, T - j0));
    __syncthreads();
    LoadTile<D>(ks, t.k + hk * D, t.kv_stride, row0 + j0, keys);
    LoadTile<D>(vs, t.v + hk * D, t.kv_stride, row0 + j0, keys);
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kB / 16; ++n) {
      TwoProductsT<D>(qs + warp * kWarpRows * P::kTile, ks + n * 16 * P::kTile, sw, dos + warp * kWarpRows * P::kTile,
                      vs + n * 16 * P::kTile, dpw);
      __syncwarp();
      for (int cc = c0; cc < c0 + 8; ++cc) {
        const int c = n * 16 + cc;
        float ds = 0.0f;
        if (model::FlashVisible(i, j0 + c, T)) {
          const float p = model::FlashProb(sw[r * kSub + cc] * s.scale, lse_s[row]);
          ds = model::FlashScoreGrad(p, dpw[r * kSub + cc], delta_s[row]);
        }
        dsw[r * P::kProb + c] = ToBf16(ds);
      }
      __syncwarp();
    }
    ProbTimesTile<D>(dq, dsw, ks);  // dQ += ds k
  }
  __syncthreads();
  float* stage = reinterpret_cast<float*>(smem + warp * P::kOutBytes);
  const int64_t first = i0 + warp * kWarpRows;
  StoreFragments<D>(dq, stage);
  __syncwarp();
  StoreRows<D>(t.dq + h * D, t.q_stride, row0 + first, static_cast<int>(Min64(kWarpRows, T - first)), stage, s.scale,
               lane);
}

template <int D>
constexpr int ForwardSmem() {
  using P = Pitch<D>;
  return 3 * P::kTileBytes + kWarps * (P::kScoreBytes + P::kProbBytes + P::kOutBytes);
}
template <int D>
constexpr int BackwardKvSmem() {
  using P = Pitch<D>;
  static_assert(kWarps * P::kOutBytes <= 4 * P::kTileBytes, "the output staging fits the tiles");
  return 4 * P::kTileBytes + kWarps * 2 * (kSubBytes + P::kProbBytes) + 2 * kB * 4;
}
template <int D>
constexpr int BackwardQSmem() {
  using P = Pitch<D>;
  return 4 * P::kTileBytes + kWarps * (2 * kSubBytes + P::kProbBytes) + 2 * kB * 4;
}

Status Check(const char* fn, const AttentionShape& s, const AttentionTensors& t, bool backward) {
  ZINF_RETURN_IF_ERROR(model::CheckAttentionShape(s, t, backward).WithContext(fn));
  if (s.head_dim != 64 && s.head_dim != 128) {
    return InvalidArgument(std::string(fn) + ": head_dim " + std::to_string(s.head_dim) +
                           " (the CUDA kernels take 64 or 128)");
  }
  if (s.batch * s.heads > 65535) return InvalidArgument(std::string(fn) + ": batch · heads above 65535");
  return Status::Ok();
}

// Launches kernel<<<grid, 128, smem>>> after raising its shared-memory limit.
template <class Kernel>
Status Launch(Kernel kernel, const char* name, dim3 grid, int smem, void* stream, const AttentionShape& s,
              const AttentionTensors& t) {
  ZINF_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<grid, kThreadsFa, smem, static_cast<cudaStream_t>(stream)>>>(s, t);
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  return CudaError(err, (std::string("launch of ") + name).c_str(), __FILE__, __LINE__);
}

template <int D>
Status Forward(const AttentionShape& s, const AttentionTensors& t, void* stream) {
  const dim3 grid(static_cast<unsigned>((s.seq_len + kB - 1) / kB), static_cast<unsigned>(s.batch * s.heads));
  return Launch(FlashForwardKernel<D>, "FlashForwardKernel", grid, ForwardSmem<D>(), stream, s, t);
}

template <int D>
Status Backward(const AttentionShape& s, const AttentionTensors& t, void* stream) {
  const cudaStream_t cs = static_cast<cudaStream_t>(stream);
  const int64_t warps = s.batch * s.seq_len * s.heads;
  const unsigned delta_blocks = static_cast<unsigned>(std::min<int64_t>((warps + 7) / 8, 65535));
  FlashDeltaKernel<D><<<delta_blocks, 256, 0, cs>>>(s, t);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return CudaError(err, "launch of FlashDeltaKernel", __FILE__, __LINE__);
  const unsigned nb = static_cast<unsigned>((s.seq_len + kB - 1) / kB);
  ZINF_RETURN_IF_ERROR(Launch(FlashBackwardKvKernel<D>, "FlashBackwardKvKernel",
                              dim3(nb, static_cast<unsigned>(s.batch * s.kv_heads)), BackwardKvSmem<D>(), stream, s,
                              t));
  return Launch(FlashBackwardQKernel<D>, "FlashBackwardQKernel", dim3(nb, static_cast<unsigned>(s.batch * s.heads)),
                BackwardQSmem<D>(), stream, s, t);
}

}  // namespace

Status FlashAttentionForward(const AttentionShape& shape, const AttentionTensors& tensors, void* stream) {
  ZINF_RETURN_IF_ERROR(Check("gpu::FlashAttentionForward", shape, tensors, false));
  return shape.head_dim == 64 ? Forward<64>(shape, tensors, stream) : Forward<128>(shape, tensors, stream);
}

Status FlashAttentionBackward(const AttentionShape& shape, const AttentionTensors& tensors, void* stream) {
  ZINF_RETURN_IF_ERROR(Check("gpu::FlashAttentionBackward", shape, tensors, true));
  return shape.head_dim == 64 ? Backward<64>(shape, tensors, stream) : Backward<128>(shape, tensors, stream);
}

}  // namespace zinf::gpu
