#include "gpu/gemm_reference.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu/cublas_lib.h"
#include "gpu/cuda_check.h"

namespace zinf::gpu {
namespace {

Status CublasFailed(const CublasLib& lib, cublasStatus_t st, const char* what) {
  return Internal(std::string("cuBLAS ") + what + ": " + lib.status_name(st) + " (" + lib.status_string(st) + ")");
}

// Events and a handle that are released on every path.
struct Resources {
  const CublasLib* lib = nullptr;
  cublasHandle_t handle = nullptr;
  std::vector<cudaEvent_t> events;
  ~Resources() {
    for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
    if (handle) (void)lib->destroy(handle);
  }
};

}  // namespace

Result<double> TimeCublasProduct(void* stream, int64_t m, int64_t n, int64_t k, bool bf16, const void* a, const void* b,
                                 float* c, int reps) {
  if (m <= 0 || n <= 0 || k <= 0 || reps < 1) {
    return InvalidArgument("TimeCublasProduct: m, n, k and reps must be positive");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  Resources r;
  ZINF_ASSIGN_OR_RETURN(r.lib, Cublas());
  const CublasLib& lib = *r.lib;
  if (cublasStatus_t st = lib.create(&r.handle); st != CUBLAS_STATUS_SUCCESS) {
    r.handle = nullptr;
    return CublasFailed(lib, st, "cublasCreate");
  }
  if (cublasStatus_t st = lib.set_stream(r.handle, s); st != CUBLAS_STATUS_SUCCESS) {
    return CublasFailed(lib, st, "cublasSetStream");
  }
  if (cublasStatus_t st = lib.set_math_mode(r.handle, bf16 ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH);
      st != CUBLAS_STATUS_SUCCESS) {
    return CublasFailed(lib, st, "cublasSetMathMode");
  }
  // Row-major C = A·Bᵀ is column-major Cᵀ = B·Aᵀ: B transposed, A as is.
  const float one = 1.0f, zero = 0.0f;
  auto product = [&]() -> Status {
    const cublasStatus_t st =
        bf16 ? lib.gemm_ex(r.handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                           static_cast<int>(k), &one, b, CUDA_R_16BF, static_cast<int>(k), a, CUDA_R_16BF,
                           static_cast<int>(k), &zero, c, CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT)
             : lib.sgemm(r.handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                         static_cast<int>(k), &one, static_cast<const float*>(b), static_cast<int>(k),
                         static_cast<const float*>(a), static_cast<int>(k), &zero, c, static_cast<int>(n));
    if (st != CUBLAS_STATUS_SUCCESS)
      return CublasFailed(lib, st, bf16 ? "cublasGemmEx (bf16, fp32 sums)" : "cublasSgemm");
    return Status::Ok();
  };
  for (int i = 0; i < 2 * reps; ++i) {
    cudaEvent_t e = nullptr;
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    r.events.push_back(e);
  }
  ZINF_RETURN_IF_ERROR(product());  // warm-up: the library picks and loads its kernel
  for (int i = 0; i < reps; ++i) {
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.events[2 * i], s));
    ZINF_RETURN_IF_ERROR(product());
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.events[2 * i + 1], s));
  }
  ZINF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(r.events.back()));
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, r.events[2 * i], r.events[2 * i + 1]));
    seconds.push_back(ms / 1e3);
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace zinf::gpu
