// Matrix products for the model: row-major C = alpha · op(A) · op(B) + beta · C
// (op = identity or transpose; m × k times k × n), through OpenBLAS
// (cblas_sgemm for float, cblas_dgemm for double, so the double-precision
// tests run the same code), opened on first use (cpu/openblas_lib.h).
//
// Threading: the model drives OpenBLAS single-threaded and parallelises on
// its own pool. ParallelGemm cuts C into tiles whose shape depends only on
// (m, n, k), runs one single-threaded BLAS call per tile on ModelThreads,
// and so gives the same bits for any thread count (each element of C is
// computed by the same call on the same operands). OpenBLAS's own threads
// would not give that: with OpenBLAS 0.3.21 (Debian 12, SkylakeX kernels),
// cblas_sgemm on 2 threads does not give 1 thread's bits on the LM head's dx
// (1024 × 768, k = 50257; docs/figures.md, the CPU model's matrix products),
// while ParallelGemm's tiles gave the bits of one single-threaded call on
// every gpt2 shape. It also keeps a single pool: no OpenBLAS threads spin
// beside the arena's. UseSingleThreadedBlas()
// sets OpenBLAS's process-wide thread count to 1 (openblas_set_num_threads):
// GptModel calls it when created; the bench's sgemm reference sets it to
// the thread count for its own measurement and back.
//
// Precision: ParallelGemm and OperandGemm follow ModelThreads::matmul_dtype().
// kBFloat16 rounds every element of A and B to bf16 (to nearest even, the
// rounding of every 16-bit store in zinf: common/float16.h) into a copy, then
// runs the same fp32 product on the copies: bf16 × bf16 products are exact
// in fp32, so this is what tensor cores compute with fp32 accumulation, up
// to the order of the sums. The copies live in per-thread buffers that grow
// to the largest operand seen. Only F = float takes kBFloat16.
//
// Thread-safety: Gemm, ParallelGemm and OperandGemm may run concurrently on disjoint
// outputs. SetBlasThreads/UseSingleThreadedBlas change process state: call
// them when no BLAS call is running.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/parallel.h"

namespace zinf::model {

// One BLAS call on the calling thread. Dimensions must fit in int32.
template <class F>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, F alpha, const F* a, int64_t lda, const F* b,
          int64_t ldb, F beta, F* c, int64_t ldc);

// The same product, tiled over `threads` (see above). Requires BLAS to be
// single-threaded (BlasThreads() == 1) to avoid oversubscription.
template <class F>
void ParallelGemm(const ModelThreads& threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, F alpha,
                  const F* a, int64_t lda, const F* b, int64_t ldb, F beta, F* c, int64_t ldc);

// ParallelGemm<float> with bf16 products (threads.matmul_dtype() must be
// kBFloat16) where A is given as bf16 bits, stored as an fp32 A would be:
// the product ParallelGemm gives for an A of those values.
void ParallelGemmBf16A(const ModelThreads& threads, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const uint16_t* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                       int64_t ldc);

// Gemm on the calling thread with the operands at `operands` precision
// (kFloat32: Gemm itself; kBFloat16: see above).
template <class F>
void OperandGemm(DType operands, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, F alpha, const F* a,
                 int64_t lda, const F* b, int64_t ldb, F beta, F* c, int64_t ldc);

// x rounded to bf16 (to nearest even) and widened back: the value a bf16
// operand carries.
float RoundToBf16(float x);

// The tile shape ParallelGemm uses for an (m, n, k) product.
struct GemmTiles {
  int64_t tile_m = 0, tile_n = 0;
};
GemmTiles GemmTilesFor(int64_t m, int64_t n, int64_t k);

// A product cut where its sizes are not multiples of `align`, for a GPU
// library whose fast kernels need them (cuBLAS on bf16 operands: at the
// GPT-2 vocabulary, 50257, the LM head's products ran far below their speed
// at aligned sizes; docs/figures.md, on the H100): each of m, n (and k, with
// split_k) larger than align and not a multiple of it becomes a part of
// whole multiples and a remainder below align. The pieces cover C once per k part; a product of
// aligned sizes is one piece. With k split, a (m, n) block's second k part
// adds onto the first (beta 1), so the caller's beta goes to k0 == 0 only;
// offsets are in elements of row-major storage, as Gemm's arguments.
struct GemmPiece {
  int64_t m0 = 0, m = 0, n0 = 0, n = 0, k0 = 0, k = 0;
  int64_t AOffset(bool trans_a, int64_t lda) const { return trans_a ? k0 * lda + m0 : m0 * lda + k0; }
  int64_t BOffset(bool trans_b, int64_t ldb) const { return trans_b ? n0 * ldb + k0 : k0 * ldb + n0; }
  int64_t COffset(int64_t ldc) const { return m0 * ldc + n0; }
};
std::vector<GemmPiece> AlignedGemmPieces(int64_t m, int64_t n, int64_t k, int64_t align, bool split_k);

void UseSingleThreadedBlas();
void SetBlasThreads(int num_threads);
int BlasThreads();
// OpenBLAS's build string, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64".
std::string BlasConfig();

}  // namespace zinf::model
