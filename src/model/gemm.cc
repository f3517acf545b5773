// Gemm: OpenBLAS behind a template, and its fixed tiling over ModelThreads.
#include "model/gemm.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/check.h"
#include "common/float16.h"
#include "cpu/openblas_lib.h"

namespace zinf::model {
namespace {

int Dim(int64_t v) {
  ZINF_CHECK(v >= 0 && v <= std::numeric_limits<int32_t>::max());
  return static_cast<int>(v);
}

CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

void BlasGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cpu::OpenBlasOrDie().sgemm(CblasRowMajor, Trans(ta), Trans(tb), Dim(m), Dim(n), Dim(k), alpha, a, Dim(lda), b,
                             Dim(ldb), beta, c, Dim(ldc));
}

void BlasGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
              const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cpu::OpenBlasOrDie().dgemm(CblasRowMajor, Trans(ta), Trans(tb), Dim(m), Dim(n), Dim(k), alpha, a, Dim(lda), b,
                             Dim(ldb), beta, c, Dim(ldc));
}

// An operand stored rows × cols with leading dimension ld, copied densely
// (leading dimension cols) as the fp32 value of its bf16 rounding (fp32
// elements rounded, bf16 bits widened), by row chunks on `threads` (or the
// calling thread when null).
float Bf16Value(float x) { return RoundToBf16(x); }
float Bf16Value(uint16_t bits) { return Bf16BitsToFloat(bits); }

template <class X>
const float* RoundedCopy(const ModelThreads* threads, const X* x, int64_t rows, int64_t cols, int64_t ld,
                         std::vector<float>& out) {
  if (out.size() < static_cast<size_t>(rows * cols)) out.resize(static_cast<size_t>(rows * cols));
  float* dst = out.data();
  auto round_rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = Bf16Value(x[r * ld + c]);
    }
  };
  if (threads) {
    threads->ForChunks(rows, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(cols, 1)), round_rows);
  } else {
    round_rows(0, rows);
  }
  return dst;
}

// Per-thread copies of A and B for bf16 operands.
struct OperandCopies {
  std::vector<float> a, b;
};
OperandCopies& ThreadOperandCopies() {
  thread_local OperandCopies copies;
  return copies;
}

}  // namespace

float RoundToBf16(float x) { return Bf16BitsToFloat(FloatToBf16Bits(x)); }

template <class F>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, F alpha, const F* a, int64_t lda, const F* b,
          int64_t ldb, F beta, F* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  BlasGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Tiles of C. Each tile repacks its rows of op(A) (k × tile_m) and its
// columns of op(B) (k × tile_n): OpenBLAS packs both operands per call, so
// the more tiles, the more packing (a large share of the GEMM time with
// small tiles on gpt2). Tiles are therefore large — at least 512 × 768
// where the product is that large, and up to 4096 along a dimension long
// enough to still give 16 tiles (the LM head's V) — and split each
// dimension evenly, so a few threads get balanced work (the LM head's dx,
// 1024 × 768 with k = V, becomes two 512-row tiles), at about the speed of
// one OpenBLAS-threaded call (docs/figures.md, the CPU model's matrix
// products).
std::vector<GemmPiece> AlignedGemmPieces(int64_t m, int64_t n, int64_t k, int64_t align, bool split_k) {
  struct Part {
    int64_t at, size;
  };
  // [0, size) as one part, or a whole-multiple part and the remainder.
  const auto parts = [align](int64_t size, bool split) {
    std::vector<Part> p;
    const int64_t whole = size / align * align;
    if (split && size > align && whole != size) {
      p.push_back({0, whole});
      p.push_back({whole, size - whole});
    } else {
      p.push_back({0, size});
    }
    return p;
  };
  std::vector<GemmPiece> pieces;
  for (const Part& pm : parts(m, true)) {
    for (const Part& pn : parts(n, true)) {
      for (const Part& pk : parts(k, split_k)) pieces.push_back({pm.at, pm.size, pn.at, pn.size, pk.at, pk.size});
    }
  }
  return pieces;
}

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

namespace {

// ParallelGemm's tiles over the operands as given.
template <class F>
void TiledGemm(const ModelThreads& threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, F alpha,
               const F* a, int64_t lda, const F* b, int64_t ldb, F beta, F* c, int64_t ldc) {
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

}  // namespace

template <class F>
void ParallelGemm(const ModelThreads& threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, F alpha,
                  const F* a, int64_t lda, const F* b, int64_t ldb, F beta, F* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<F, float>) {
    if (threads.matmul_dtype() == DType::kBFloat16 && k > 0) {
      OperandCopies& copies = ThreadOperandCopies();
      // Stored shapes: A is m × k (k × m transposed), B is k × n (n × k).
      const float* ra = RoundedCopy(&threads, a, trans_a ? k : m, trans_a ? m : k, lda, copies.a);
      const float* rb = RoundedCopy(&threads, b, trans_b ? n : k, trans_b ? k : n, ldb, copies.b);
      TiledGemm<float>(threads, trans_a, trans_b, m, n, k, alpha, ra, trans_a ? m : k, rb, trans_b ? k : n, beta, c,
                       ldc);
      return;
    }
  } else {
    ZINF_CHECK(threads.matmul_dtype() == DType::kFloat32);
  }
  TiledGemm<F>(threads, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void ParallelGemmBf16A(const ModelThreads& threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const uint16_t* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                       int64_t ldc) {
  ZINF_CHECK(threads.matmul_dtype() == DType::kBFloat16);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // no operand to read: C scaled by beta, as BLAS does
    TiledGemm<float>(threads, trans_a, trans_b, m, n, k, alpha, nullptr, trans_a ? m : 1, b, ldb, beta, c, ldc);
    return;
  }
  OperandCopies& copies = ThreadOperandCopies();
  const float* wa = RoundedCopy(&threads, a, trans_a ? k : m, trans_a ? m : k, lda, copies.a);
  const float* rb = RoundedCopy(&threads, b, trans_b ? n : k, trans_b ? k : n, ldb, copies.b);
  TiledGemm<float>(threads, trans_a, trans_b, m, n, k, alpha, wa, trans_a ? m : k, rb, trans_b ? k : n, beta, c, ldc);
}

template <class F>
void OperandGemm(DType operands, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, F alpha, const F* a,
                 int64_t lda, const F* b, int64_t ldb, F beta, F* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if constexpr (std::is_same_v<F, float>) {
    if (operands == DType::kBFloat16 && k > 0) {
      OperandCopies& copies = ThreadOperandCopies();
      const float* ra = RoundedCopy(nullptr, a, trans_a ? k : m, trans_a ? m : k, lda, copies.a);
      const float* rb = RoundedCopy(nullptr, b, trans_b ? n : k, trans_b ? k : n, ldb, copies.b);
      BlasGemm(trans_a, trans_b, m, n, k, alpha, ra, trans_a ? m : k, rb, trans_b ? k : n, beta, c, ldc);
      return;
    }
  } else {
    ZINF_CHECK(operands == DType::kFloat32);
  }
  BlasGemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

template void Gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
template void Gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t);
template void ParallelGemm<float>(const ModelThreads&, bool, bool, int64_t, int64_t, int64_t, float, const float*,
                                  int64_t, const float*, int64_t, float, float*, int64_t);
template void ParallelGemm<double>(const ModelThreads&, bool, bool, int64_t, int64_t, int64_t, double, const double*,
                                   int64_t, const double*, int64_t, double, double*, int64_t);
template void OperandGemm<float>(DType, bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                                 const float*, int64_t, float, float*, int64_t);
template void OperandGemm<double>(DType, bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                  const double*, int64_t, double, double*, int64_t);

void UseSingleThreadedBlas() { SetBlasThreads(1); }

void SetBlasThreads(int num_threads) {
  ZINF_CHECK(num_threads >= 1);
  const cpu::OpenBlasLib& blas = cpu::OpenBlasOrDie();
  if (blas.get_num_threads() != num_threads) blas.set_num_threads(num_threads);
}

int BlasThreads() { return cpu::OpenBlasOrDie().get_num_threads(); }

std::string BlasConfig() {
  std::string cfg = cpu::OpenBlasOrDie().get_config();
  while (!cfg.empty() && cfg.back() == ' ') cfg.pop_back();
  return cfg;
}

}  // namespace zinf::model
