// The CUDA GPT stages' matrix products (gpt_cuda.cc) on cuBLAS and
// cuBLASLt: one handle of each on the stages' stream, with math modes that
// keep the CPU model's rounding (fp32 products without TF32; bf16 products
// accumulate, and split k, in fp32); row-major products as cuBLAS's
// column-major ones (C = op(A) op(B) is Cᵀ = op(B)ᵀ op(A)ᵀ: B is passed
// before A); bf16 products cut into pieces of whole multiples of 8; and
// cuBLASLt's fused epilogues (a bias, a bias gradient, a residual read from
// another buffer), each product's algorithm found once and kept by LtKey.
// bf16 operands arrive rounded already: making them is the stages' work.
// Includes cuBLAS's headers: private to src/exec's CUDA files.
// Thread-safety: one thread at a time (one stream's order).
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "gpu/cublas_lib.h"
#include "zinf/status.h"

namespace zinf::exec {

using gpu::CublasLib;
using gpu::CublasLtLib;

// What cuBLASLt's algorithm for a product depends on. Operands as the
// stages name them (row-major: A, B; C the input added, D the output).
struct LtKey {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  cudaDataType c_type = CUDA_R_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool beta_nonzero = false;
  // Each pointer's alignment in bytes, up to cuBLASLt's default assumption
  // of 256 (the algorithm is chosen for them). a_align and b_align 0: any
  // operands (a shape with no algorithm whatever its operands' alignment).
  uint32_t d_align = 0, c_align = 0, a_align = 0, b_align = 0;
  friend auto operator<=>(const LtKey&, const LtKey&) = default;
};

// One bf16 product through cuBLASLt, row-major as GptCublas::Bf16Products:
// d = a·b + beta · c_in, with `epilogue`: CUBLASLT_EPILOGUE_DEFAULT nothing
// more; CUBLASLT_EPILOGUE_BIAS adds the fp32 `bias` (one value a column of d)
// to every row; CUBLASLT_EPILOGUE_BGRADA writes into `bias` the sums over k
// of B's columns, the bias gradient of a linear layer's weight-gradient
// product (dW = Xᵀ dY, db = Σ rows of dY), as cuBLASLt sees the product
// (column-major, the operands swapped: its A is our B).
struct LtProduct {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  float beta = 0;
  void* d = nullptr;
  cudaDataType d_type = CUDA_R_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const float* bias = nullptr;
  const void* c_in = nullptr;  // d itself when the sum is in place
};

class GptCublas {
 public:
  GptCublas() = default;
  GptCublas(const GptCublas&) = delete;
  GptCublas& operator=(const GptCublas&) = delete;
  ~GptCublas();

  // Opens cuBLAS on `stream` (a cudaStream_t), for bf16 operands
  // (`bf16_products`) or fp32 ones; with bf16 operands also cuBLASLt, where
  // its library and a handle are to be had (else has_lt() is false, and the
  // stages run biases and residual adds as kernels beside the products).
  Status Init(void* stream, bool bf16_products);
  bool has_lt() const { return lt_handle_ != nullptr; }

  // `count` row-major products C_i = alpha·op(A_i)·op(B_i) + beta·C_i, of
  // fp32 operands and result, operand i at a + i·sa, b + i·sb, c + i·sc.
  Status Fp32Products(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                      int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta, float* c, int64_t ldc,
                      int64_t sc, int64_t count);
  // The same of bf16 operands with fp32 accumulation, into C of `c_type`
  // (fp32, or bf16 rounded to nearest even as each sum is written). A single
  // product whose sizes are not multiples of 8 (the GPT-2 LM head's V =
  // 50257) runs as pieces of whole multiples and remainders
  // (model::AlignedGemmPieces): cuBLAS's fast bf16 kernels need them. k is
  // cut only into an fp32 result (a bf16 one would round between the parts).
  Status Bf16Products(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a16, int64_t lda,
                      int64_t sa, const void* b16, int64_t ldb, int64_t sb, float beta, void* c, int64_t ldc,
                      int64_t sc, int64_t count, cudaDataType c_type);

  // Whether cuBLASLt may fuse `p` (before its operands are rounded): it is
  // open, the sizes are multiples of 8, the bias is 16-byte aligned (the
  // epilogue reads it in vectors), and the shape is not one it was found to
  // have no algorithm for.
  bool LtMayFuse(const LtProduct& p) const;
  // Runs `p` on its bf16 operands. False where cuBLASLt has no algorithm for
  // it or refuses it before any launch: remembered for the shape, whose
  // later products LtMayFuse turns away, so the caller runs the product and
  // the bias kernel apart from then on.
  Result<bool> LtRun(const LtProduct& p, const void* a16, const void* b16);

 private:
  LtKey ShapeKey(const LtProduct& p) const;

  void* stream_ = nullptr;
  const CublasLib* blas_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  const CublasLtLib* lt_ = nullptr;
  cublasLtHandle_t lt_handle_ = nullptr;
  // Each product's algorithm (none: cuBLASLt has no algorithm for it).
  std::map<LtKey, std::optional<cublasLtMatmulAlgo_t>> lt_algos_;
};

}  // namespace zinf::exec
