// Flash attention's kernels on tensor cores (math/attention_math.h has the algorithm
// and the per-element steps; model/flash_attention.cc is the CPU twin, block
// for block). bf16 operands with fp32 accumulation through mma.sync
// m16n8k16; the inputs stay fp32 in memory and are rounded to bf16 (to
// nearest even, common/float16.h) as their tiles enter shared memory, or
// come as bf16 copies made beforehand (AttentionTensors::q16 ...), which
// cp.async copies into two buffers a tile: the next block's tiles are in
// flight while the warps multiply this block's. Both read the same operands
// and multiply them in the same order, so they give the same bits.
//
// Blocks of kFlashBlock = 64 queries and 64 keys, four warps of 16 rows
// each, every warp's scores, probabilities and accumulators in registers
// (see "warp products" below). Per thread block:
//   forward: one (batch row, head, query block), over the key blocks up to
//     the diagonal, with the online softmax's max and sum per row.
//   backward: δ by one warp per row; dK and dV by one (batch row, kv head,
//     key block) over the group's heads and the query blocks from the
//     diagonal on; dQ by one (batch row, head, query block), recomputing p
//     and ds. No atomics: every gradient is written once by one block, so
//     the results repeat bit for bit.
//
// The kernels use only the instructions of gpu/simt.cuh, so this header
// compiles under nvcc (flash_attention.cu launches them) and in a host
// compiler against the CPU emulation (tests/gpu/flash_attention_emu_test.cc).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/float16.h"
#include "gpu/simt.cuh"
#include "math/attention_math.h"

namespace zinf::gpu::flash {

using math::AttentionShape;
using math::AttentionTensors;
using simt::bf16;

constexpr int kB = math::kFlashBlock;
constexpr int kWarps = 4;
constexpr int kThreadsFa = kWarps * 32;
constexpr int kWarpRows = kB / kWarps;  // 16, one mma tile's height
static_assert(kWarpRows == 16, "one row of mma tiles per warp");

// Shared-memory tiles: bf16 [64][D] rows of q, k, v or dO, padded so that
// the eight rows an ldmatrix or a row of pair loads touches fall in
// different banks (the pitch is 4 words past a multiple of 32).
template <int D>
struct Pitch {
  static constexpr int kTile = D + 8;
  static constexpr int kTileBytes = kB * kTile * 2;
};

__device__ inline int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ inline bf16 ToBf16(float x) { return simt::Bf16FromBits(FloatToBf16Bits(x)); }

// Rows [first, first + count) of one head (count <= 64), D values each at
// base + row · stride, rounded into a [64][D + 8] bf16 tile; rows past
// count are zero. Four values per load where base and stride allow it.
template <int D>
__device__ void LoadTile(bf16* tile, const float* base, int64_t stride, int64_t first, int count) {
  if (((reinterpret_cast<uintptr_t>(base) | static_cast<uintptr_t>(stride * 4)) & 15) == 0) {
    // A thread's quads in batches of kBatch, each batch's loads issued
    // before any of its stores, so that they are in flight together.
    constexpr int kQuads = D / 4, kPerThread = kB * kQuads / kThreadsFa, kBatch = 4;
    static_assert(kB * kQuads % kThreadsFa == 0 && kPerThread % kBatch == 0);
#pragma unroll
    for (int b0 = 0; b0 < kPerThread; b0 += kBatch) {
      float4 x[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int e = threadIdx.x + (b0 + k) * kThreadsFa, r = e / kQuads, d = e % kQuads * 4;
        x[k] = r < count ? *reinterpret_cast<const float4*>(base + (first + r) * stride + d)
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int e = threadIdx.x + (b0 + k) * kThreadsFa, r = e / kQuads, d = e % kQuads * 4;
        uint2 packed;  // element d at the lower address
        packed.x = simt::PackBf16x2(x[k].x, x[k].y);
        packed.y = simt::PackBf16x2(x[k].z, x[k].w);
        *reinterpret_cast<uint2*>(tile + r * Pitch<D>::kTile + d) = packed;
      }
    }
    return;
  }
  for (int e = threadIdx.x; e < kB * D; e += kThreadsFa) {
    const int r = e / D, d = e % D;
    const float x = r < count ? base[(first + r) * stride + d] : 0.0f;
    tile[r * Pitch<D>::kTile + d] = ToBf16(x);
  }
}

// ---- bf16 copies: cp.async, 16 bytes (or 4) a copy, zero past the rows ----

// LoadTile's rows from a bf16 copy (16-byte aligned, stride a multiple of 8),
// as copies in flight: rows past count are zero-filled (a copy of 0 bytes
// from row `first`, which exists).
template <int D>
__device__ void IssueTile(bf16* tile, const uint16_t* base, int64_t stride, int64_t first, int count) {
  constexpr int kChunks = D / 8;  // 16-byte chunks a row
  static_assert(kB * kChunks % kThreadsFa == 0);
#pragma unroll
  for (int e = threadIdx.x; e < kB * kChunks; e += kThreadsFa) {
    const int r = e / kChunks, d = e % kChunks * 8;
    const bool valid = r < count;
    simt::CpAsync16(tile + r * Pitch<D>::kTile + d, base + (first + (valid ? r : 0)) * stride + d, valid);
  }
}

// A tile from the fp32 tensor (rounded; done when this returns) or from its
// bf16 copy (in flight until CpAsyncWaitAll): the head's columns start at
// `col` in both.
template <int D, bool kAsync>
__device__ void FetchTile(bf16* tile, const float* x32, const uint16_t* x16, int64_t col, int64_t stride, int64_t first,
                          int count) {
  if constexpr (kAsync)
    IssueTile<D>(tile, x16 + col, stride, first, count);
  else
    LoadTile<D>(tile, x32 + col, stride, first, count);
}

// The start of step `it` of a loop over `steps` blocks of fetched tiles;
// returns the buffer whose tiles the step reads. With kAsync: waits for the
// step's copies (issued a step before, or before the loop for step 0), and
// once every warp is past the barrier, so done with the previous step's
// buffer, issues the next step's copies into it (fetch(step, buffer)).
// Otherwise the step's tiles load now, between two barriers, into buffer 0.
template <bool kAsync, class Fetch>
__device__ inline int BeginStep(int64_t it, int64_t steps, const Fetch& fetch) {
  if constexpr (kAsync) {
    simt::CpAsyncWaitAll();
    simt::SyncThreads();
    if (it + 1 < steps) {
      fetch(it + 1, static_cast<int>((it + 1) & 1));
      simt::CpAsyncCommit();
    }
    return static_cast<int>(it & 1);
  } else {
    simt::SyncThreads();  // every warp is done with the previous step's tiles
    fetch(it, 0);
    simt::SyncThreads();
    return 0;
  }
}

// ---- warp products: mma.sync m16n8k16, bf16 operands, fp32 accumulators ----
//
// Thread (g, c) = (lane / 4, lane % 4) of a warp holds rows g and g + 8 of
// each 16 × 8 accumulator tile, columns 2c and 2c + 1 (elements 0, 1: row g;
// 2, 3: row g + 8). An A operand (16 rows × 16 of k) is four registers of
// bf16 pairs: (g, 2c), (g + 8, 2c), (g, 2c + 8), (g + 8, 2c + 8). So the
// accumulator tiles of 16 k-columns (two tiles side by side) are, packed,
// the next product's A operand, which keeps scores, probabilities and
// outputs in registers (as FlashAttention-2 does). A operands from a tile
// (q, k, v or dO rows) and B operands come from the shared tiles by
// ldmatrix, four 8×8 matrices an instruction: a tile's rows as B's columns
// (q kᵀ: pairs along D), or a tile as B itself (p v: transposed).

// The A operand of tile rows [row0, row0 + 16), k-step kk (16 columns):
// matrix i holds rows row0 + 8 (i & 1), columns kk·16 + 8 (i >> 1).
template <int D>
__device__ inline void RowsOperand(uint32_t (&a)[4], const bf16* tile, int row0, int kk, int lane) {
  const int i = lane / 8;
  simt::LoadMatrices(a, tile + (row0 + (i & 1) * 8 + lane % 8) * Pitch<D>::kTile + kk * 16 + (i >> 1) * 8);
}

// acc0 += a · (tile rows [n0, n0 + 8))ᵀ and acc1 += a · (rows [n0 + 8,
// n0 + 16))ᵀ over k-step kk: B[k][n] = tile[n0 + n][k], so a B operand is
// two matrices of 8 rows (keys or queries) by 8 columns, matrix i holding
// rows n0 + 8 (i >> 1), columns kk·16 + 8 (i & 1). RowsB loads the two B
// operands (b[0..1] for acc0, b[2..3] for acc1).
template <int D>
__device__ inline void RowsB(uint32_t (&b)[4], const bf16* tile, int n0, int kk, int lane) {
  const int i = lane / 8;
  simt::LoadMatrices(b, tile + (n0 + (i >> 1) * 8 + lane % 8) * Pitch<D>::kTile + kk * 16 + (i & 1) * 8);
}
template <int D>
__device__ inline void MmaRowsT2(float (&acc0)[4], float (&acc1)[4], const uint32_t (&a)[4], const bf16* tile, int n0,
                                 int kk, int lane) {
  uint32_t b[4];
  RowsB<D>(b, tile, n0, kk, lane);
  simt::MmaBf16(acc0, a, b[0], b[1]);
  simt::MmaBf16(acc1, a, b[2], b[3]);
}

// acc[n], acc[n + 1] += a · tile[k0 .. k0 + 16)[8n .. 8n + 16) (TileB loads
// the two B operands): B is the
// tile itself (rows k, columns n), read transposed by ldmatrix (thread
// 8i + r gives row r of 8×8 matrix i: rows k0 + 8 (i & 1) + r, columns from
// 8 (n + (i >> 1))).
template <int D>
__device__ inline void TileB(uint32_t (&b)[4], const bf16* tile, int k0, int n, int lane) {
  const int i = lane / 8;
  simt::LoadMatricesTrans(b, tile + (k0 + (i & 1) * 8 + lane % 8) * Pitch<D>::kTile + (n + (i >> 1)) * 8);
}
template <int D>
__device__ inline void MmaTile(float (&acc)[D / 8][4], int n, const uint32_t (&a)[4], const bf16* tile, int k0,
                               int lane) {
  uint32_t b[4];
  TileB<D>(b, tile, k0, n, lane);
  simt::MmaBf16(acc[n], a, b[0], b[1]);
  simt::MmaBf16(acc[n + 1], a, b[2], b[3]);
}

// The two score products of a backward pass over D, started from zero:
// sa = (a_tile rows [row0, row0 + 16)) · (ta rows [col0, col0 + kN))ᵀ and
// sb likewise from b_tile and tb (the scores and their gradients, or
// their transposes), the A operands loaded once a 16-wide step.
template <int D, int kN>
__device__ inline void ScorePair(float (&sa)[kN / 8][4], float (&sb)[kN / 8][4], const bf16* a_tile, const bf16* b_tile,
                                 int row0, const bf16* ta, const bf16* tb, int col0, int lane) {
#pragma unroll
  for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sa[n][e] = sb[n][e] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t fa[4], fb[4];
    RowsOperand<D>(fa, a_tile, row0, kk, lane);
    RowsOperand<D>(fb, b_tile, row0, kk, lane);
#pragma unroll
    for (int n = 0; n < kN / 8; n += 2) {
      MmaRowsT2<D>(sa[n], sa[n + 1], fa, ta, col0 + n * 8, kk, lane);
      MmaRowsT2<D>(sb[n], sb[n + 1], fb, tb, col0 + n * 8, kk, lane);
    }
  }
}

// The A operand of accumulator tiles 2kk and 2kk + 1 (16 columns), rounded.
__device__ inline void TilesOperand(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = simt::PackBf16x2(lo[0], lo[1]);
  a[1] = simt::PackBf16x2(lo[2], lo[3]);
  a[2] = simt::PackBf16x2(hi[0], hi[1]);
  a[3] = simt::PackBf16x2(hi[2], hi[3]);
}

// The maximum, or the sum, of a row over its four threads.
__device__ inline float RowMax4(float x) {
  x = fmaxf(x, simt::ShflXor(x, 1));
  return fmaxf(x, simt::ShflXor(x, 2));
}
__device__ inline float RowSum4(float x) {
  x += simt::ShflXor(x, 1);
  return x + simt::ShflXor(x, 2);
}

// Rows `rows` (the thread's two, global positions) of a D-wide accumulator,
// times `scale`, to base + (row0 + row) · stride + 2c, for rows below T: fp32
// (Out = float), or rounded to bf16 (Out = uint16_t, simt::StoreAs).
template <int D, class Out>
__device__ inline void StoreRows(const float (&acc)[D / 8][4], const int64_t (&rows)[2], int64_t T, Out* base,
                                 int64_t row0, int64_t stride, float scale, int c) {
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (rows[k] >= T) continue;
    Out* out = base + (row0 + rows[k]) * stride + 2 * c;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      simt::StoreAs(out + n * 8, acc[n][2 * k] * scale);
      simt::StoreAs(out + n * 8 + 1, acc[n][2 * k + 1] * scale);
    }
  }
}

// Tiles a kernel keeps a buffer each of (`fixed`) and those it refills per
// block (`fetched`), twice over when the bf16 copies are copied ahead.
template <int D, bool kAsync>
__host__ __device__ constexpr int TileBytes(int fixed, int fetched) {
  return (fixed + (kAsync ? 2 : 1) * fetched) * Pitch<D>::kTileBytes;
}

// The forward's scores of a key block, started from zero: sc[m] = (the
// warp's query rows of tile m, as A operands qf[m]) · (k tile rows)ᵀ, 8 keys
// a tile; each B operand (two 8-key tiles of k) is loaded once for the kM
// row tiles.
template <int D, int kM>
__device__ __forceinline__ void ForwardScores(float (&sc)[kM][kB / 8][4], const uint32_t (&qf)[kM][D / 16][4],
                                              const bf16* kt, int lane) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < kB / 8; ++n) sc[m][n][0] = sc[m][n][1] = sc[m][n][2] = sc[m][n][3] = 0.0f;
  }
#pragma unroll
  for (int n = 0; n < kB / 8; n += 2) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t kf[4];
      RowsB<D>(kf, kt, n * 8, kk, lane);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        simt::MmaBf16(sc[m][n], qf[m][kk], kf[0], kf[1]);
        simt::MmaBf16(sc[m][n + 1], qf[m][kk], kf[2], kf[3]);
      }
    }
  }
}

// The online softmax's step over one row tile's scores sc of key block j0
// (the thread's rows `rows`): the scores to log2 units (hidden ones -inf
// where `masked`), the running maximum m_run and sum l, the accumulator o
// rescaled, and the probabilities p, in sc and as the A operands pf of p v.
template <int D>
__device__ __forceinline__ void OnlineSoftmaxStep(float (&sc)[kB / 8][4], uint32_t (&pf)[kB / 16][4],
                                                  float (&o)[D / 8][4], float (&m_run)[2], float (&l)[2],
                                                  const int64_t (&rows)[2], float log2_scale, bool masked, int64_t j0,
                                                  int64_t T, int c) {
  // z in log2 units; a hidden score is -inf, which 2^(z - m) takes to 0.
  float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kB / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sc[n][e] *= log2_scale;
      if (masked && !math::FlashVisible(rows[e / 2], j0 + n * 8 + 2 * c + e % 2, T)) sc[n][e] = -INFINITY;
      row_max[e / 2] = fmaxf(row_max[e / 2], sc[n][e]);
    }
  }
  float alpha[2], sum[2] = {0.0f, 0.0f}, m_sub[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float m_new = fmaxf(m_run[k], RowMax4(row_max[k]));
    alpha[k] = math::FlashRescale(m_run[k], m_new);
    m_run[k] = m_new;
    m_sub[k] = m_new == -INFINITY ? 0.0f : m_new;  // a row past T sees no key: its p are 0, not NaN
  }
#pragma unroll
  for (int n = 0; n < kB / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sc[n][e] = math::FlashProb(sc[n][e], m_sub[e / 2]);
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
#pragma unroll
  for (int kk = 0; kk < kB / 16; ++kk) TilesOperand(pf[kk], sc[2 * kk], sc[2 * kk + 1]);
}

// o[m] += p[m] v over a key block, 16 keys a step; each B operand (v) is
// loaded once for the kM row tiles.
template <int D, int kM>
__device__ __forceinline__ void ForwardPv(float (&o)[kM][D / 8][4], const uint32_t (&pf)[kM][kB / 16][4],
                                          const bf16* vt, int lane) {
#pragma unroll
  for (int kk = 0; kk < kB / 16; ++kk) {
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t vf[4];
      TileB<D>(vf, vt, kk * 16, n, lane);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        simt::MmaBf16(o[m][n], pf[m][kk], vf[0], vf[1]);
        simt::MmaBf16(o[m][n + 1], pf[m][kk], vf[2], vf[3]);
      }
    }
  }
}

// The forward of one (batch row, head, block of kM · 64 queries): each warp
// takes kM row tiles of 16 (rows warp · 16 kM ...), so every B operand a
// warp loads from shared memory (k for q kᵀ, v for p v) feeds kM products;
// the key blocks are 64 keys, as the CPU twin's. A warp skips a key block
// all of whose keys are past its last row (the blocks of 128 queries reach
// one key block past the first half's diagonal), so each row sees the key
// blocks the twin gives it, in the same order: kM = 1 and 2 give the same
// bits.
template <int D, bool kAsync, int kM>
__global__ void __launch_bounds__(kThreadsFa) FlashForwardKernel(AttentionShape s, AttentionTensors t) {
  using P = Pitch<D>;
  constexpr int kQ = kB * kM;  // queries a block
  ZINF_DYNAMIC_SMEM(smem);
  bf16* qs = reinterpret_cast<bf16*>(smem);  // kM tiles of 64 rows, one after another
  // Buffer i's k and v (i = 0, and 1 with kAsync).
  auto ks = [&](int i) { return reinterpret_cast<bf16*>(smem + (kM + 2 * i) * P::kTileBytes); };
  auto vs = [&](int i) { return reinterpret_cast<bf16*>(smem + (kM + 1 + 2 * i) * P::kTileBytes); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, c = lane & 3;

  const int64_t T = s.seq_len, H = s.heads, G = s.heads / s.kv_heads;
  const int64_t nq = (T + kQ - 1) / kQ;
  const int64_t qb = nq - 1 - blockIdx.y;  // the longest rows first (LaunchShape)
  const int64_t b = blockIdx.x / H, h = blockIdx.x % H, hk = h / G;
  const int64_t row0 = b * T, i0 = qb * kQ;
  const int64_t steps = (Min64(i0 + kQ, T) - 1) / kB + 1;  // key blocks up to the block's last row
  auto fetch_kv = [&](int64_t kb, int i) {
    const int64_t j0 = kb * kB;
    const int keys = static_cast<int>(Min64(kB, T - j0));
    FetchTile<D, kAsync>(ks(i), t.k, t.k16, hk * D, t.kv_stride, row0 + j0, keys);
    FetchTile<D, kAsync>(vs(i), t.v, t.v16, hk * D, t.kv_stride, row0 + j0, keys);
  };
#pragma unroll
  for (int m = 0; m < kM; ++m) {  // rows past T are zero (a tile wholly past T reads row i0, which exists)
    const int64_t first = i0 + m * kB;
    const int rows = static_cast<int>(Min64(kB, T - first));
    FetchTile<D, kAsync>(qs + m * kB * P::kTile, t.q, t.q16, h * D, t.q_stride, row0 + (rows > 0 ? first : i0), rows);
  }
  if constexpr (kAsync) {
    fetch_kv(0, 0);
    simt::CpAsyncCommit();
    simt::CpAsyncWaitAll();
  }
  simt::SyncThreads();
  const int wr = warp * kWarpRows * kM;  // the warp's first row in the block
  uint32_t qf[kM][D / 16][4];            // the warp's query rows, each tile, each 16-wide step along D
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) RowsOperand<D>(qf[m][kk], qs, wr + m * kWarpRows, kk, lane);
  }

  // The thread's two rows of each tile (index 0: row g of the tile's 16, 1: row g + 8).
  int64_t rows[kM][2];
  float m_run[kM][2], l[kM][2];  // m_run: the maximum of z, log2 units
  float o[kM][D / 8][4];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    rows[m][0] = i0 + wr + m * kWarpRows + g;
    rows[m][1] = rows[m][0] + 8;
    m_run[m][0] = m_run[m][1] = -INFINITY;
    l[m][0] = l[m][1] = 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
  }
  const float log2_scale = math::FlashLog2Scale(s.scale);
  const int64_t warp_last = i0 + wr + kWarpRows * kM - 1;

  for (int64_t kb = 0; kb < steps; ++kb) {
    const int64_t j0 = kb * kB;
    const int buf = BeginStep<kAsync>(kb, steps, fetch_kv);
    if (j0 > warp_last) continue;  // every key past the warp's rows (the other warps still use the tiles)
    const bf16* kt = ks(buf);
    const bf16* vt = vs(buf);

    // Only blocks reaching past the block's first row (the diagonal ones)
    // and a last, partial query block hide scores (a key past T is in the
    // last key block, which is a diagonal one).
    const bool masked = j0 + kB - 1 > i0 || i0 + kQ > T;
    // Scores q·k of the warp's rows against the 64 keys, 8 keys a tile;
    // element e of tile n: row rows[m][e / 2], key j0 + 8n + 2c + e % 2.
    float sc[kM][kB / 8][4];
    ForwardScores<D, kM>(sc, qf, kt, lane);
    uint32_t pf[kM][kB / 16][4];  // p as the A operands of p v, 16 keys a step
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      OnlineSoftmaxStep<D>(sc[m], pf[m], o[m], m_run[m], l[m], rows[m], log2_scale, masked, j0, T, c);
    }
    // o += p v.
    ForwardPv<D, kM>(o, pf, vt, lane);
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const float inv[2] = {1.0f / l[m][0], 1.0f / l[m][1]};
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (c == 0 && rows[m][k] < T) t.lse[(b * H + h) * T + rows[m][k]] = math::FlashLse(m_run[m][k], l[m][k]);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[m][n][2 * k] *= inv[k];
        o[m][n][2 * k + 1] *= inv[k];
      }
    }
    if (t.out16) {  // O kept in bf16 alone
      StoreRows<D>(o[m], rows[m], T, t.out16 + h * D, row0, t.out_stride, 1.0f, c);
    } else {
      StoreRows<D>(o[m], rows[m], T, t.out + h * D, row0, t.out_stride, 1.0f, c);
    }
  }
}

// δ = dO · O per (token, head), one warp each. dO and O from the fp32
// tensors, or (null) from their bf16 values (dout16, out16), widened.
template <int D>
__global__ void FlashDeltaKernel(AttentionShape s, AttentionTensors t) {
  const int64_t rows = s.batch * s.seq_len * s.heads;
  const int lane = threadIdx.x % 32;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < rows;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x / 32) {
    const int64_t h = w % s.heads, token = w / s.heads;  // token = b · T + i
    const int64_t at = token * t.out_stride + h * D;
    const auto dout = [&](int d) { return t.dout ? t.dout[at + d] : Bf16BitsToFloat(t.dout16[at + d]); };
    const auto out = [&](int d) { return t.out ? t.out[at + d] : Bf16BitsToFloat(t.out16[at + d]); };
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += dout(d) * out(d);
    for (int o = 16; o > 0; o /= 2) acc += simt::ShflXor(acc, o);
    const int64_t b = token / s.seq_len, i = token % s.seq_len;
    if (lane == 0) t.delta[(b * s.heads + h) * s.seq_len + i] = acc;
  }
}

// Loads the statistics of rows [first, first + count) of (b, h) into
// shared memory (0 past count); with kAsync, as copies in flight.
template <bool kAsync>
__device__ void FetchStats(float* lse_s, float* delta_s, const AttentionTensors& t, int64_t stat0, int count) {
  for (int c = threadIdx.x; c < kB; c += kThreadsFa) {
    const bool valid = c < count;
    if constexpr (kAsync) {
      simt::CpAsync4(lse_s + c, t.lse + stat0 + (valid ? c : 0), valid);
      simt::CpAsync4(delta_s + c, t.delta + stat0 + (valid ? c : 0), valid);
    } else {
      lse_s[c] = valid ? t.lse[stat0 + c] : 0.0f;
      delta_s[c] = valid ? t.delta[stat0 + c] : 0.0f;
    }
  }
}
constexpr int kStatsBytes = 2 * kB * 4;  // lse and δ of a query block

// The blocks a SM the dK/dV kernel's registers are capped for (its
// __launch_bounds__ minimum): at head_dim 64 three, where uncapped only two
// fit (a few registers spill; ptxas's counts are in docs/figures.md); at
// 128 no cap (two a SM).
template <int D>
constexpr int kKvMinBlocks = D == 64 ? 3 : 1;

// dK and dV of one (batch row, kv head, key block): each warp's 16 keys over
// the group's heads and the query blocks from the diagonal on, kQc query
// columns a pass (their scores and score gradients in registers).
template <int D, bool kAsync, int kMinBlocks = kKvMinBlocks<D>>
__global__ void __launch_bounds__(kThreadsFa, kMinBlocks) FlashBackwardKvKernel(AttentionShape s, AttentionTensors t) {
  using P = Pitch<D>;
  constexpr int kQc = D == 64 ? 64 : 32;
  ZINF_DYNAMIC_SMEM(smem);
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = reinterpret_cast<bf16*>(smem + P::kTileBytes);
  // Buffer i's q, dO, lse and δ (i = 0, and 1 with kAsync).
  auto qs = [&](int i) { return reinterpret_cast<bf16*>(smem + (2 + 2 * i) * P::kTileBytes); };
  auto dos = [&](int i) { return reinterpret_cast<bf16*>(smem + (3 + 2 * i) * P::kTileBytes); };
  auto lses = [&](int i) { return reinterpret_cast<float*>(smem + TileBytes<D, kAsync>(2, 2) + i * kStatsBytes); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, c = lane & 3;

  const int64_t T = s.seq_len, H = s.heads, G = s.heads / s.kv_heads;
  const int64_t nb = (T + kB - 1) / kB;
  const int64_t kb = blockIdx.y;  // the most query blocks first (LaunchShape)
  const int64_t b = blockIdx.x / s.kv_heads, hk = blockIdx.x % s.kv_heads;
  const int64_t row0 = b * T, j0 = kb * kB;
  const int keys = static_cast<int>(Min64(kB, T - j0));
  FetchTile<D, kAsync>(ks, t.k, t.k16, hk * D, t.kv_stride, row0 + j0, keys);
  FetchTile<D, kAsync>(vs, t.v, t.v16, hk * D, t.kv_stride, row0 + j0, keys);
  // Step `it` of the loop below: the group's head it / nq, query block
  // kb + it % nq.
  const int64_t nq = nb - kb, steps = G * nq;
  auto fetch_q = [&](int64_t it, int i) {
    const int64_t h = hk * G + it / nq, i0 = (kb + it % nq) * kB;
    const int rows = static_cast<int>(Min64(kB, T - i0));
    FetchTile<D, kAsync>(qs(i), t.q, t.q16, h * D, t.q_stride, row0 + i0, rows);
    FetchTile<D, kAsync>(dos(i), t.dout, t.dout16, h * D, t.out_stride, row0 + i0, rows);
    FetchStats<kAsync>(lses(i), lses(i) + kB, t, (b * H + h) * T + i0, rows);
  };
  if constexpr (kAsync) {
    fetch_q(0, 0);
    simt::CpAsyncCommit();
  }

  const int kr = warp * kWarpRows;  // the warp's keys in the tile
  const float log2_scale = math::FlashLog2Scale(s.scale);
  const int64_t key[2] = {j0 + kr + g, j0 + kr + g + 8};
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
  }
  for (int64_t it = 0; it < steps; ++it) {
    const int64_t qb = kb + it % nq, i0 = qb * kB;
    const int buf = BeginStep<kAsync>(it, steps, fetch_q);  // at step 0 k and v land too
    const bf16* qt = qs(buf);
    const bf16* dot = dos(buf);
    const float* lse_s = lses(buf);
    const float* delta_s = lse_s + kB;
    const bool masked = qb == kb || i0 + kB > T;  // as in the forward
#pragma unroll 1
    for (int q0 = 0; q0 < kB; q0 += kQc) {
      // (q kᵀ)ᵀ and (dO vᵀ)ᵀ: the warp's keys against kQc queries;
      // element e of tile n: key key[e / 2], query column q0 + 8n + 2c + e % 2.
      float st[kQc / 8][4], dpt[kQc / 8][4];
      ScorePair<D, kQc>(st, dpt, ks, vs, kr, qt, dot, q0, lane);
      // p and ds in place of the scores and their gradients (0 where
      // hidden), from the statistics of the thread's query columns.
#pragma unroll
      for (int n = 0; n < kQc / 8; ++n) {
        float lse2[2], delta[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          lse2[x] = math::FlashLse2(lse_s[q0 + n * 8 + 2 * c + x]);
          delta[x] = delta_s[q0 + n * 8 + 2 * c + x];
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = math::FlashProb(st[n][e] * log2_scale, lse2[e % 2]);
          const float ds = math::FlashScoreGrad(p, dpt[n][e], delta[e % 2]);
          const bool hidden = masked && !math::FlashVisible(i0 + q0 + n * 8 + 2 * c + e % 2, key[e / 2], T);
          st[n][e] = hidden ? 0.0f : p;
          dpt[n][e] = hidden ? 0.0f : ds;
        }
      }
      // dV += pᵀ dO and dK += dsᵀ q, 16 queries a step.
#pragma unroll
      for (int kk = 0; kk < kQc / 16; ++kk) {
        uint32_t pa[4], da[4];
        TilesOperand(pa, st[2 * kk], st[2 * kk + 1]);
        TilesOperand(da, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          MmaTile<D>(dv, n, pa, dot, q0 + kk * 16, lane);
          MmaTile<D>(dk, n, da, qt, q0 + kk * 16, lane);
        }
      }
    }
  }
  if (t.dv16) {  // in bf16 alone
    StoreRows<D>(dv, key, T, t.dv16 + hk * D, row0, t.kv_stride, 1.0f, c);
    StoreRows<D>(dk, key, T, t.dk16 + hk * D, row0, t.kv_stride, s.scale, c);
  } else {
    StoreRows<D>(dv, key, T, t.dv + hk * D, row0, t.kv_stride, 1.0f, c);
    StoreRows<D>(dk, key, T, t.dk + hk * D, row0, t.kv_stride, s.scale, c);
  }
}

// dQ of one (batch row, head, query block): each warp's 16 queries over the
// key blocks up to the diagonal, recomputing p and ds.
template <int D, bool kAsync>
__global__ void __launch_bounds__(kThreadsFa) FlashBackwardQKernel(AttentionShape s, AttentionTensors t) {
  using P = Pitch<D>;
  ZINF_DYNAMIC_SMEM(smem);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = reinterpret_cast<bf16*>(smem + P::kTileBytes);
  // Buffer i's k and v (i = 0, and 1 with kAsync).
  auto ks = [&](int i) { return reinterpret_cast<bf16*>(smem + (2 + 2 * i) * P::kTileBytes); };
  auto vs = [&](int i) { return reinterpret_cast<bf16*>(smem + (3 + 2 * i) * P::kTileBytes); };
  float* lse_s = reinterpret_cast<float*>(smem + TileBytes<D, kAsync>(2, 2));
  float* delta_s = lse_s + kB;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, c = lane & 3;

  const int64_t T = s.seq_len, H = s.heads, G = s.heads / s.kv_heads;
  const int64_t nb = (T + kB - 1) / kB;
  const int64_t qb = nb - 1 - blockIdx.y;  // the longest rows first (LaunchShape)
  const int64_t b = blockIdx.x / H, h = blockIdx.x % H, hk = h / G;
  const int64_t row0 = b * T, i0 = qb * kB;
  const int rows = static_cast<int>(Min64(kB, T - i0));
  FetchTile<D, kAsync>(qs, t.q, t.q16, h * D, t.q_stride, row0 + i0, rows);
  FetchTile<D, kAsync>(dos, t.dout, t.dout16, h * D, t.out_stride, row0 + i0, rows);
  FetchStats<kAsync>(lse_s, delta_s, t, (b * H + h) * T + i0, rows);
  auto fetch_kv = [&](int64_t kb, int i) {
    const int64_t j0 = kb * kB;
    const int keys = static_cast<int>(Min64(kB, T - j0));
    FetchTile<D, kAsync>(ks(i), t.k, t.k16, hk * D, t.kv_stride, row0 + j0, keys);
    FetchTile<D, kAsync>(vs(i), t.v, t.v16, hk * D, t.kv_stride, row0 + j0, keys);
  };
  if constexpr (kAsync) {
    fetch_kv(0, 0);
    simt::CpAsyncCommit();
  }

  const int qr = warp * kWarpRows;  // the warp's queries in the tile
  const int local[2] = {qr + g, qr + g + 8};
  const int64_t query[2] = {i0 + local[0], i0 + local[1]};
  const float log2_scale = math::FlashLog2Scale(s.scale);
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  for (int64_t kb = 0; kb <= qb; ++kb) {
    const int64_t j0 = kb * kB;
    const int buf = BeginStep<kAsync>(kb, qb + 1, fetch_kv);  // block 0's tiles come with q, dO and the statistics
    const bf16* kt = ks(buf);
    const bf16* vt = vs(buf);
    const bool masked = kb == qb || i0 + kB > T;  // as in the forward
    // q kᵀ and dO vᵀ; element e of tile n: query query[e / 2], key j0 + 8n + 2c + e % 2.
    float sc[kB / 8][4], dp[kB / 8][4];
    ScorePair<D, kB>(sc, dp, qs, dos, qr, kt, vt, 0, lane);
    // ds in place of the scores (0 where hidden).
    const float lse2[2] = {math::FlashLse2(lse_s[local[0]]), math::FlashLse2(lse_s[local[1]])};
    const float delta[2] = {delta_s[local[0]], delta_s[local[1]]};
#pragma unroll
    for (int n = 0; n < kB / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = math::FlashProb(sc[n][e] * log2_scale, lse2[e / 2]);
        const float ds = math::FlashScoreGrad(p, dp[n][e], delta[e / 2]);
        const bool hidden = masked && !math::FlashVisible(query[e / 2], j0 + n * 8 + 2 * c + e % 2, T);
        sc[n][e] = hidden ? 0.0f : ds;
      }
    }
    // dQ += ds k, 16 keys a step.
#pragma unroll
    for (int kk = 0; kk < kB / 16; ++kk) {
      uint32_t dsa[4];
      TilesOperand(dsa, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) MmaTile<D>(dq, n, dsa, kt, kk * 16, lane);
    }
  }
  if (t.dq16) {  // in bf16 alone
    StoreRows<D>(dq, query, T, t.dq16 + h * D, row0, t.q_stride, s.scale, c);
  } else {
    StoreRows<D>(dq, query, T, t.dq + h * D, row0, t.q_stride, s.scale, c);
  }
}

// The forward's query tiles a block: 2 (128 queries) for head_dim 64, whose
// registers allow it, 1 for 128.
template <int D>
constexpr int kForwardTiles = D == 64 ? 2 : 1;
template <int D, bool kAsync>
constexpr int ForwardSmem() {
  return TileBytes<D, kAsync>(kForwardTiles<D>, 2);
}
template <int D, bool kAsync>
constexpr int BackwardKvSmem() {
  return TileBytes<D, kAsync>(2, 2) + (kAsync ? 2 : 1) * kStatsBytes;
}
template <int D, bool kAsync>
constexpr int BackwardQSmem() {
  return TileBytes<D, kAsync>(2, 2) + kStatsBytes;
}

// A kernel's launch: grid, threads a block and dynamic shared memory.
struct LaunchShape {
  unsigned grid_x, grid_y;
  unsigned threads;
  int smem;
};
inline unsigned QueryBlocks(const AttentionShape& s) { return static_cast<unsigned>((s.seq_len + kB - 1) / kB); }
// FlashForwardKernel<D, kAsync, kForwardTiles<D>>, FlashBackwardKvKernel
// and FlashBackwardQKernel: a block per (batch row · head or kv head, query
// or key block). The heads are x, the blocks y: blocks start in the order
// of their linear index, x first, so every head's longest blocks (the last
// query blocks, or the first key blocks) start before any head's shorter
// ones, and the short ones fill the SMs the long ones leave. With y first
// (one head's blocks, then the next head's), a head's longest block could
// start only after every block of the heads before it; a causal grid's
// blocks differ in length up to nb times, so those late long blocks set the
// kernel's end (a greedy model of 264 block slots, two a SM on an H100, at
// llama-3.2-1b's T = 2048: dK/dV 208 block-steps against 128, dQ 148
// against 129, forward 86 against 68).
template <int D, bool kAsync, int kM = kForwardTiles<D>>
LaunchShape ForwardLaunch(const AttentionShape& s) {
  constexpr int64_t kQ = kB * kM;
  return {static_cast<unsigned>(s.batch * s.heads), static_cast<unsigned>((s.seq_len + kQ - 1) / kQ), kThreadsFa,
          TileBytes<D, kAsync>(kM, 2)};
}
template <int D, bool kAsync>
LaunchShape BackwardKvLaunch(const AttentionShape& s) {
  return {static_cast<unsigned>(s.batch * s.kv_heads), QueryBlocks(s), kThreadsFa, BackwardKvSmem<D, kAsync>()};
}
template <int D, bool kAsync>
LaunchShape BackwardQLaunch(const AttentionShape& s) {
  return {static_cast<unsigned>(s.batch * s.heads), QueryBlocks(s), kThreadsFa, BackwardQSmem<D, kAsync>()};
}
// FlashDeltaKernel: eight rows (warps) a block, at most 65535 blocks.
inline LaunchShape DeltaLaunch(const AttentionShape& s) {
  const int64_t warps = s.batch * s.seq_len * s.heads;
  const int64_t blocks = (warps + 7) / 8;
  return {static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 1, 256, 0};
}

}  // namespace zinf::gpu::flash
