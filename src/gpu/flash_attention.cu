// Flash attention on tensor cores (math/attention_math.h has the algorithm
// and the per-element steps; model/flash_attention.cc is the CPU twin, block
// for block). bf16 operands with fp32 accumulation (mma.sync in the
// forward, WMMA 16×16×16 fragments in the backward); the inputs stay fp32
// in memory and are rounded to bf16 (to nearest even, common/float16.h) as
// their tiles enter shared memory.
//
// Blocks of kFlashBlock = 64 queries and 64 keys, four warps of 16 rows
// each. Per thread block:
//   forward: one (batch row, head, query block), over the key blocks up to
//     the diagonal; each warp keeps its rows' scores, output, max and sum in
//     registers (mma.sync m16n8k16; see the forward's section below).
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
  static constexpr int kProb = kB + 8;     // bf16 [16][64] p or ds per warp
  static constexpr int kOut = D + 4;       // fp32 [16][D] output per warp
  static constexpr int kTileBytes = kB * kTile * 2;
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

// ---- forward: registers and mma.sync ----
//
// The forward keeps a warp's 16 query rows in registers throughout, as
// FlashAttention-2 does: m16n8k16 products (bf16 operands, fp32
// accumulators), where thread (g, c) = (lane / 4, lane % 4) of a warp holds
// rows g and g + 8 of each 16 × 8 accumulator tile, columns 2c and 2c + 1.
// A row's maximum and sum combine its four threads by two shuffles, and the
// score tiles of a 16-key step are the probabilities' operand as they stand
// (rounded to bf16). Shared memory holds the tiles only: q, k, and v
// transposed ([D][64 keys]) so that both products read bf16 pairs.
constexpr int kVtPitch = kB + 8;  // bf16 [D][64] transposed v

__device__ inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two bf16 values as an operand register: lo at the lower half (the lower
// column or key), each rounded to nearest even.
__device__ inline uint32_t PackBf16(float lo, float hi) {
  return static_cast<uint32_t>(FloatToBf16Bits(lo)) | static_cast<uint32_t>(FloatToBf16Bits(hi)) << 16;
}
__device__ inline uint32_t SharedPair(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Rows [first, first + count) of one head (count <= 64) rounded into a
// transposed tile: tile[d · kVtPitch + row]; rows past count are zero.
// Four values per load where base and stride allow it, as LoadTile; a
// warp's 32 loads are 8 rows' 64 contiguous bytes each (4 quads), so that
// its transposed stores spread over the banks (at most two to a bank).
template <int D>
__device__ void LoadTileTransposed(bf16* tile, const float* base, int64_t stride, int64_t first, int count) {
  if (((reinterpret_cast<uintptr_t>(base) | static_cast<uintptr_t>(stride * 4)) & 15) == 0) {
    constexpr int kQuads = D / 4, kQuadGroups = kQuads / 4;
#pragma unroll 4
    for (int e = threadIdx.x; e < kB * kQuads; e += kThreadsFa) {
      const int group = e / 32, lane = e % 32;
      const int r = group / kQuadGroups * 8 + lane % 8, d = (group % kQuadGroups * 4 + lane / 8) * 4;
      const float4 x = r < count ? *reinterpret_cast<const float4*>(base + (first + r) * stride + d)
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      tile[d * kVtPitch + r] = ToBf16(x.x);
      tile[(d + 1) * kVtPitch + r] = ToBf16(x.y);
      tile[(d + 2) * kVtPitch + r] = ToBf16(x.z);
      tile[(d + 3) * kVtPitch + r] = ToBf16(x.w);
    }
    return;
  }
  for (int e = threadIdx.x; e < kB * D; e += kThreadsFa) {
    const int r = e / D, d = e % D;
    const float x = r < count ? base[(first + r) * stride + d] : 0.0f;
    tile[d * kVtPitch + r] = ToBf16(x);
  }
}

// The maximum, or the sum, of a row over its four threads.
__device__ inline float RowMax4(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFull, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFull, x, 2));
}
__device__ inline float RowSum4(float x) {
  x += __shfl_xor_sync(kFull, x, 1);
  return x + __shfl_xor_sync(kFull, x, 2);
}

template <int D>
__global__ void __launch_bounds__(kThreadsFa) FlashForwardKernel(AttentionShape s, AttentionTensors t) {
  using P = Pitch<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = reinterpret_cast<bf16*>(smem + P::kTileBytes);
  bf16* vt = reinterpret_cast<bf16*>(smem + 2 * P::kTileBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, c = lane & 3;

  const int64_t T = s.seq_len, H = s.heads, G = s.heads / s.kv_heads;
  const int64_t nb = (T + kB - 1) / kB;
  const int64_t qb = nb - 1 - blockIdx.x;  // the longest rows first
  const int64_t b = blockIdx.y / H, h = blockIdx.y % H, hk = h / G;
  const int64_t row0 = b * T, i0 = qb * kB;
  LoadTile<D>(qs, t.q + h * D, t.q_stride, row0 + i0, static_cast<int>(Min64(kB, T - i0)));
  __syncthreads();
  // The warp's query operands for each 16-wide step along D.
  uint32_t qf[D / 16][4];
  const bf16* qw = qs + warp * kWarpRows * P::kTile + 2 * c;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qf[kk][0] = SharedPair(qw + g * P::kTile + kk * 16);
    qf[kk][1] = SharedPair(qw + (g + 8) * P::kTile + kk * 16);
    qf[kk][2] = SharedPair(qw + g * P::kTile + kk * 16 + 8);
    qf[kk][3] = SharedPair(qw + (g + 8) * P::kTile + kk * 16 + 8);
  }

  // The thread's two rows (index 0: row g of the warp's 16, 1: row g + 8).
  const int64_t rows[2] = {i0 + warp * kWarpRows + g, i0 + warp * kWarpRows + g + 8};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int64_t kb = 0; kb <= qb; ++kb) {
    const int64_t j0 = kb * kB;
    const int keys = static_cast<int>(Min64(kB, T - j0));
    __syncthreads();  // every warp is done with the previous k and v
    LoadTile<D>(ks, t.k + hk * D, t.kv_stride, row0 + j0, keys);
    LoadTileTransposed<D>(vt, t.v + hk * D, t.kv_stride, row0 + j0, keys);
    __syncthreads();

    // Scores q·k of the warp's rows against the 64 keys, 8 keys a tile.
    float sc[kB / 8][4];
#pragma unroll
    for (int n = 0; n < kB / 8; ++n) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
      const bf16* kr = ks + (n * 8 + g) * P::kTile + 2 * c;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) MmaBf16(sc[n], qf[kk], SharedPair(kr + kk * 16), SharedPair(kr + kk * 16 + 8));
    }
    // Element e of a tile: row rows[e / 2], key j0 + 8n + 2c + e % 2.
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kB / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[n][e] *= s.scale;
        if (model::FlashVisible(rows[e / 2], j0 + n * 8 + 2 * c + e % 2, T)) {
          row_max[e / 2] = fmaxf(row_max[e / 2], sc[n][e]);
        }
      }
    }
    float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float m_new = fmaxf(m[k], RowMax4(row_max[k]));
      alpha[k] = model::FlashRescale(m[k], m_new);
      m[k] = m_new;
    }
#pragma unroll
    for (int n = 0; n < kB / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool visible = model::FlashVisible(rows[e / 2], j0 + n * 8 + 2 * c + e % 2, T);
        sc[n][e] = visible ? model::FlashProb(sc[n][e], m[e / 2]) : 0.0f;
        sum[e / 2] += sc[n][e];
      }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) l[k] = l[k] * alpha[k] + RowSum4(sum[k]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // o += p v, 16 keys a step: the score tiles 2kk and 2kk + 1 are the
    // operand's left and right halves.
#pragma unroll
    for (int kk = 0; kk < kB / 16; ++kk) {
      const uint32_t pf[4] = {PackBf16(sc[2 * kk][0], sc[2 * kk][1]), PackBf16(sc[2 * kk][2], sc[2 * kk][3]),
                              PackBf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              PackBf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const bf16* vr = vt + (n * 8 + g) * kVtPitch + kk * 16 + 2 * c;
        MmaBf16(o[n], pf, SharedPair(vr), SharedPair(vr + 8));
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int64_t i = rows[k];
    if (i >= T) continue;
    const float inv = 1.0f / l[k];
    if (c == 0) t.lse[(b * H + h) * T + i] = model::FlashLse(m[k], l[k]);
    float* out = t.out + (row0 + i) * t.out_stride + h * D + 2 * c;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      out[n * 8] = o[n][2 * k] * inv;
      out[n * 8 + 1] = o[n][2 * k + 1] * inv;
    }
  }
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
  return 2 * Pitch<D>::kTileBytes + D * kVtPitch * 2;
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
