// Gemm: OpenBLAS behind a template, and its fixed tiling over ModelThreads.
#include "model/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <limits>

#include "common/check.h"

namespace zinf::model {
namespace {

int Dim(int64_t v) {
  ZINF_CHECK(v >= 0 && v <= std::numeric_limits<int32_t>::max());
  return static_cast<int>(v);
}

CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

void BlasGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, Trans(ta), Trans(tb), Dim(m), Dim(n), Dim(k), alpha, a, Dim(lda), b, Dim(ldb), beta, c,
              Dim(ldc));
}

void BlasGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
              const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, Trans(ta), Trans(tb), Dim(m), Dim(n), Dim(k), alpha, a, Dim(lda), b, Dim(ldb), beta, c,
              Dim(ldc));
}

}  // namespace

template <class F>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, F alpha, const F* a, int64_t lda, const F* b,
          int64_t ldb, F beta, F* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  BlasGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Tiles of C. Each tile repacks its rows of op(A) (k × tile_m) and its
// columns of op(B) (k × tile_n): OpenBLAS packs both operands per call, so
// the more tiles, the more packing (it was a fifth of the GEMM time with
// 256 × 768 tiles on gpt2). Tiles are therefore large — at least 512 × 768
// where the product is that large, and up to 4096 along a dimension long
// enough to still give 16 tiles (the LM head's V) — and split each
// dimension evenly, so a few threads get balanced work (the LM head's dx,
// 1024 × 768 with k = V, becomes two 512-row tiles). On this 2-core VM the
// tiles of the three LM-head products ran at 0.94-1.08 of one
// OpenBLAS-threaded call, 0.96-0.99 single-threaded.
GemmTiles GemmTilesFor(int64_t m, int64_t n, int64_t k) {
  // Larger tiles where a dimension is long enough to give 16 of them anyway
  // (the LM head's V): less repacking of the other operand.
  auto largest_tile = [](int64_t dim, int64_t base) { return std::clamp<int64_t>((dim + 15) / 16, base, 4096); };
  const int64_t max_m = largest_tile(m, 512), max_n = largest_tile(n, 768);
  // Even split into the fewest tiles no larger than the maximum, rounded up
  // to 16 (OpenBLAS's register-block multiple).
  auto split = [](int64_t dim, int64_t max_tile) {
    dim = std::max<int64_t>(dim, 1);
    const int64_t tiles = (dim + max_tile - 1) / max_tile;
    const int64_t tile = ((dim + tiles - 1) / tiles + 15) / 16 * 16;
    return std::min(tile, dim);
  };
  GemmTiles t;
  t.tile_m = split(m, max_m);
  t.tile_n = split(n, max_n);
  return t;
}

template <class F>
void ParallelGemm(const ModelThreads& threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, F alpha,
                  const F* a, int64_t lda, const F* b, int64_t ldb, F beta, F* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const GemmTiles t = GemmTilesFor(m, n, k);
  const int64_t tiles_m = (m + t.tile_m - 1) / t.tile_m, tiles_n = (n + t.tile_n - 1) / t.tile_n;
  threads.ForChunks(tiles_m * tiles_n, 1, [&](int64_t tile, int64_t) {
    const int64_t m0 = (tile / tiles_n) * t.tile_m, n0 = (tile % tiles_n) * t.tile_n;
    const int64_t mt = std::min(t.tile_m, m - m0), nt = std::min(t.tile_n, n - n0);
    // Row m0 of op(A): row m0 of A, or column m0 of A when transposed.
    const F* a_tile = trans_a ? a + m0 : a + m0 * lda;
    const F* b_tile = trans_b ? b + n0 * ldb : b + n0;
    BlasGemm(trans_a, trans_b, mt, nt, k, alpha, a_tile, lda, b_tile, ldb, beta, c + m0 * ldc + n0, ldc);
  });
}

template void Gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
template void Gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t);
template void ParallelGemm<float>(const ModelThreads&, bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                  int64_t, const float*, int64_t, float, float*, int64_t);
template void ParallelGemm<double>(const ModelThreads&, bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                   int64_t, const double*, int64_t, double, double*, int64_t);

void UseSingleThreadedBlas() { SetBlasThreads(1); }

void SetBlasThreads(int num_threads) {
  ZINF_CHECK(num_threads >= 1);
  if (openblas_get_num_threads() != num_threads) openblas_set_num_threads(num_threads);
}

int BlasThreads() { return openblas_get_num_threads(); }

std::string BlasConfig() {
  std::string cfg = openblas_get_config();
  while (!cfg.empty() && cfg.back() == ' ') cfg.pop_back();
  return cfg;
}

}  // namespace zinf::model
