// cuBLAS, opened the first time a CUDA model asks for it. zinf does not link
// it: loading libcublas pulls in libcublasLt, whose static initialisers cost
// every process CPU time and resident memory on start (docs/figures.md,
// process start), which `zinf aio`, `zinf plan` and every HostDevice run
// would pay for nothing.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "zinf/status.h"

namespace zinf::gpu {

// The cuBLAS entry points zinf calls (the _v2 symbols cublas_v2.h maps to).
struct CublasLib {
  decltype(&::cublasCreate) create = nullptr;
  decltype(&::cublasDestroy) destroy = nullptr;
  decltype(&::cublasSetStream) set_stream = nullptr;
  decltype(&::cublasSetMathMode) set_math_mode = nullptr;
  decltype(&::cublasSgemm) sgemm = nullptr;
  decltype(&::cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  // C++ sees two cublasGemmEx overloads (the other takes a cudaDataType
  // compute type and is an inline wrapper): these are the library's own.
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                      const void*, cudaDataType, int, const void*, cudaDataType, int, const void*,
                                      void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  using GemmStridedBatchedExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                                    const void*, const void*, cudaDataType, int, long long, const void*,
                                                    cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                                    long long, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmExFn gemm_ex = nullptr;
  GemmStridedBatchedExFn gemm_strided_batched_ex = nullptr;
  decltype(&::cublasGetStatusName) status_name = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
};

// The cuBLASLt entry points zinf calls: products with a fused epilogue (a
// bias added, a bias gradient summed) where cuBLAS's GEMM API has none.
struct CublasLtLib {
  decltype(&::cublasLtCreate) create = nullptr;
  decltype(&::cublasLtDestroy) destroy = nullptr;
  decltype(&::cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&::cublasLtMatmul) matmul = nullptr;
  decltype(&::cublasLtGetStatusName) status_name = nullptr;
  decltype(&::cublasLtGetStatusString) status_string = nullptr;
};

// Opens libcublas.so.<major of the headers built against> once per process
// (the loader's search path first, then the toolkit's library directory
// found at build time) and resolves every entry point. The error names the
// library, each place tried and dlerror()'s reason, or the missing symbol.
Result<const CublasLib*> Cublas();
// libcublasLt.so.<major> likewise (libcublas loads it too: no further cost).
Result<const CublasLtLib*> CublasLt();

}  // namespace zinf::gpu
