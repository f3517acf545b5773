// cuBLAS, opened the first time a CUDA model asks for it. zinf does not link
// it: loading libcublas pulls in libcublasLt, whose static initialisers cost
// every process about 0.13 s of CPU and 210 MB of resident memory on start,
// which `zinf aio`, `zinf plan` and every HostDevice run would pay for nothing.
#pragma once

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
  decltype(&::cublasGetStatusName) status_name = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
};

// Opens libcublas.so.<major of the headers built against> once per process
// (the loader's search path first, then the toolkit's library directory
// found at build time) and resolves every entry point. The error names the
// library, each place tried and dlerror()'s reason, or the missing symbol.
Result<const CublasLib*> Cublas();

}  // namespace zinf::gpu
