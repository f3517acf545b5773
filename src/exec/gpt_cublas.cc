// GptCublas: see gpt_cublas.h.
#include "exec/gpt_cublas.h"

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "model/gemm.h"

namespace zinf::exec {

using gpu::Cublas;
using gpu::CublasLt;

namespace {

Status CublasError(const CublasLib& lib, cublasStatus_t st, const char* what) {
  return Internal(std::string("cuBLAS ") + what + ": " + lib.status_name(st) + " (" + lib.status_string(st) + ")");
}
#define ZINF_CUBLAS_RETURN_IF_ERROR(stmt, what)                                                      \
  do {                                                                                               \
    const cublasStatus_t zinf_cublas_st_ = (stmt);                                                   \
    if (zinf_cublas_st_ != CUBLAS_STATUS_SUCCESS) return CublasError(*blas_, zinf_cublas_st_, what); \
  } while (0)

// A pointer's alignment in bytes, up to 256.
uint32_t AlignmentOf(const void* p) {
  uint32_t bytes = 256;
  while (bytes > 1 && reinterpret_cast<uintptr_t>(p) % bytes != 0) bytes /= 2;
  return bytes;
}

}  // namespace

GptCublas::~GptCublas() {
  if (handle_) blas_->destroy(handle_);
  if (lt_handle_) lt_->destroy(lt_handle_);
}

Status GptCublas::Init(void* stream, bool bf16_products) {
  stream_ = stream;
  ZINF_ASSIGN_OR_RETURN(blas_, Cublas());
  ZINF_CUBLAS_RETURN_IF_ERROR(blas_->create(&handle_), "cublasCreate");
  ZINF_CUBLAS_RETURN_IF_ERROR(blas_->set_stream(handle_, static_cast<cudaStream_t>(stream_)), "cublasSetStream");
  // fp32 products: no TF32 (the CPU path computes in fp32). bf16 operands:
  // the products name their compute type themselves (Bf16Products), and a
  // product with a bf16 result adds in fp32 throughout: cuBLAS may not round
  // a split-k partial to the output's type.
  const cublasMath_t math =
      bf16_products ? static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
                    : CUBLAS_PEDANTIC_MATH;
  ZINF_CUBLAS_RETURN_IF_ERROR(blas_->set_math_mode(handle_, math), "cublasSetMathMode");
  if (!bf16_products) return Status::Ok();
  Result<const CublasLtLib*> lt = CublasLt();
  if (!lt.ok()) ZINF_LOG_DEBUG("gpt model on CUDA: no fused biases: {}", lt.status().ToString());
  cublasStatus_t st = CUBLAS_STATUS_NOT_INITIALIZED;
  if (lt.ok() && (st = (*lt)->create(&lt_handle_)) != CUBLAS_STATUS_SUCCESS) {
    lt_handle_ = nullptr;
    ZINF_LOG_DEBUG("gpt model on CUDA: no fused biases: cublasLtCreate: {}", (*lt)->status_name(st));
  }
  if (lt_handle_) lt_ = *lt;
  return Status::Ok();
}

Status GptCublas::Fp32Products(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                               int64_t lda, int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta, float* c,
                               int64_t ldc, int64_t sc, int64_t count) {
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (count == 1) {
    ZINF_CUBLAS_RETURN_IF_ERROR(
        blas_->sgemm(handle_, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                     static_cast<int>(ldb), a, static_cast<int>(lda), &beta, c, static_cast<int>(ldc)),
        "cublasSgemm");
    return Status::Ok();
  }
  ZINF_CUBLAS_RETURN_IF_ERROR(
      blas_->sgemm_strided_batched(handle_, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                                   &alpha, b, static_cast<int>(ldb), sb, a, static_cast<int>(lda), sa, &beta, c,
                                   static_cast<int>(ldc), sc, static_cast<int>(count)),
      "cublasSgemmStridedBatched");
  return Status::Ok();
}

Status GptCublas::Bf16Products(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a16,
                               int64_t lda, int64_t sa, const void* b16, int64_t ldb, int64_t sb, float beta, void* c,
                               int64_t ldc, int64_t sc, int64_t count, cudaDataType c_type) {
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const std::vector<model::GemmPiece> pieces = count == 1 ? model::AlignedGemmPieces(m, n, k, 8, c_type == CUDA_R_32F)
                                                          : std::vector<model::GemmPiece>{{0, m, 0, n, 0, k}};
  const size_t c_size = c_type == CUDA_R_32F ? 4 : 2;
  for (const model::GemmPiece& p : pieces) {
    const float piece_beta = p.k0 == 0 ? beta : 1.0f;
    ZINF_CUBLAS_RETURN_IF_ERROR(
        blas_->gemm_strided_batched_ex(
            handle_, op_b, op_a, static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k), &alpha,
            static_cast<const uint16_t*>(b16) + p.BOffset(tb, ldb), CUDA_R_16BF, static_cast<int>(ldb), sb,
            static_cast<const uint16_t*>(a16) + p.AOffset(ta, lda), CUDA_R_16BF, static_cast<int>(lda), sa, &piece_beta,
            static_cast<char*>(c) + p.COffset(ldc) * c_size, c_type, static_cast<int>(ldc), sc, static_cast<int>(count),
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx (bf16 operands, fp32 accumulation)");
  }
  return Status::Ok();
}

LtKey GptCublas::ShapeKey(const LtProduct& p) const {
  return LtKey{.ta = p.ta,
               .tb = p.tb,
               .m = p.m,
               .n = p.n,
               .k = p.k,
               .lda = p.lda,
               .ldb = p.ldb,
               .ldc = p.ldc,
               .c_type = p.d_type,
               .epilogue = p.epilogue,
               .beta_nonzero = p.beta != 0.0f,
               .d_align = AlignmentOf(p.d),
               .c_align = AlignmentOf(p.c_in)};
}

bool GptCublas::LtMayFuse(const LtProduct& p) const {
  const bool with_bias = p.epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  if (!lt_handle_ || p.m % 8 != 0 || p.n % 8 != 0 || p.k % 8 != 0 ||
      (with_bias && reinterpret_cast<uintptr_t>(p.bias) % 16 != 0)) {
    return false;
  }
  const auto known = lt_algos_.find(ShapeKey(p));
  return known == lt_algos_.end() || known->second.has_value();
}

Result<bool> GptCublas::LtRun(const LtProduct& p, const void* a16, const void* b16) {
  const LtKey shape = ShapeKey(p);
  LtKey key = shape;
  key.a_align = AlignmentOf(a16);
  key.b_align = AlignmentOf(b16);
  const bool with_bias = p.epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  const CublasLtLib& lt = *lt_;
  // Descriptors for this call, destroyed on every path.
  struct Descs {
    const CublasLtLib& lt;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    ~Descs() {
      if (op) lt.desc_destroy(op);
      for (cublasLtMatrixLayout_t l : {a, b, c}) {
        if (l) lt.layout_destroy(l);
      }
    }
  } d{lt};
  const auto check = [&](cublasStatus_t st, const char* what) -> Status {
    if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
    return Internal(std::string("cuBLASLt ") + what + ": " + lt.status_name(st) + " (" + lt.status_string(st) + ")");
  };
  ZINF_RETURN_IF_ERROR(check(lt.desc_create(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"));
  // Column-major: D[n, m] = op(B)[n, k] · op(A)[k, m], as Bf16Products calls cuBLAS.
  const cublasOperation_t op_a = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t bias_type = CUDA_R_32F;
  const void* bias_ptr = p.bias;
  ZINF_RETURN_IF_ERROR(check(lt.desc_set(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "TRANSA"));
  ZINF_RETURN_IF_ERROR(check(lt.desc_set(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "TRANSB"));
  ZINF_RETURN_IF_ERROR(
      check(lt.desc_set(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof(p.epilogue)), "EPILOGUE"));
  if (with_bias) {
    ZINF_RETURN_IF_ERROR(
        check(lt.desc_set(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)), "BIAS_POINTER"));
    ZINF_RETURN_IF_ERROR(
        check(lt.desc_set(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)), "BIAS_DATA_TYPE"));
  }
  // Each operand as stored: our B is cuBLASLt's A, our A its B.
  ZINF_RETURN_IF_ERROR(check(lt.layout_create(&d.a, CUDA_R_16BF, static_cast<uint64_t>(p.tb ? p.k : p.n),
                                              static_cast<uint64_t>(p.tb ? p.n : p.k), p.ldb),
                             "cublasLtMatrixLayoutCreate (A)"));
  ZINF_RETURN_IF_ERROR(check(lt.layout_create(&d.b, CUDA_R_16BF, static_cast<uint64_t>(p.ta ? p.m : p.k),
                                              static_cast<uint64_t>(p.ta ? p.k : p.m), p.lda),
                             "cublasLtMatrixLayoutCreate (B)"));
  ZINF_RETURN_IF_ERROR(
      check(lt.layout_create(&d.c, p.d_type, static_cast<uint64_t>(p.n), static_cast<uint64_t>(p.m), p.ldc),
            "cublasLtMatrixLayoutCreate (C)"));
  auto found = lt_algos_.find(key);
  if (found == lt_algos_.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    ZINF_RETURN_IF_ERROR(check(lt.pref_create(&pref), "cublasLtMatmulPreferenceCreate"));
    const uint64_t workspace = 0;  // none: the arena holds every byte the model uses
    // Split-k partials only in fp32, as the cuBLAS handle's math mode asks.
    const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasStatus_t st = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions, sizeof(reductions));
    }
    // cuBLASLt's A is our B (b16), its B our A (a16); its C is c_in, its D d.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.b_align},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.a_align},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.c_align},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.d_align}};
    for (const auto& [attr, bytes] : alignments) {
      if (st == CUBLAS_STATUS_SUCCESS) st = lt.pref_set(pref, attr, &bytes, sizeof(bytes));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = lt.heuristic(lt_handle_, d.op, d.a, d.b, d.c, d.c, pref, 1, &result, &returned);
    }
    lt.pref_destroy(pref);
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      algo = result.algo;
    } else {  // the shape, layout or alignment is not one cuBLASLt fuses: the kernels apart, from now on
      ZINF_LOG_DEBUG(
          "gpt model on CUDA: cuBLASLt has no algorithm for a {} x {} x {} product with epilogue {} ({}, "
          "{} found); the bias runs as its own kernel",
          p.m, p.n, p.k, static_cast<int>(p.epilogue), lt.status_name(st), returned);
      lt_algos_.emplace(shape, std::nullopt);  // whatever the operands' alignment
    }
    found = lt_algos_.emplace(key, algo).first;
  }
  if (!found->second) return false;
  const float alpha = 1.0f;
  const cublasStatus_t st = lt.matmul(lt_handle_, d.op, &alpha, b16, d.a, a16, d.b, &p.beta, p.c_in, d.c, p.d, d.c,
                                      &*found->second, nullptr, 0, static_cast<cudaStream_t>(stream_));
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {  // refused before any launch
    ZINF_LOG_DEBUG("gpt model on CUDA: cublasLtMatmul refused a {} x {} x {} product with epilogue {} ({})", p.m, p.n,
                   p.k, static_cast<int>(p.epilogue), lt.status_name(st));
    found->second.reset();
    lt_algos_.emplace(shape, std::nullopt);
    return false;
  }
  ZINF_RETURN_IF_ERROR(check(st, "cublasLtMatmul"));
  return true;
}

}  // namespace zinf::exec
