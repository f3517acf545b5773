// OpenBLAS, opened the first time a product or a probe asks for it. zinf does
// not link it: OpenBLAS starts its worker threads when it is loaded, and they
// spin (sched_yield) before they sleep: CPU time in every process, which
// `zinf aio` and the engine without a model would pay for nothing
// (docs/figures.md, process start).
#pragma once

#include <cblas.h>

#include "zinf/status.h"

namespace zinf::cpu {

struct OpenBlasLib {
  decltype(&::cblas_sgemm) sgemm = nullptr;
  decltype(&::cblas_dgemm) dgemm = nullptr;
  decltype(&::openblas_set_num_threads) set_num_threads = nullptr;
  decltype(&::openblas_get_num_threads) get_num_threads = nullptr;
  decltype(&::openblas_get_config) get_config = nullptr;
};

// Opens libopenblas.so.0 once per process — the build's OpenBLAS directory
// first, then the loader's search path — and resolves every entry point.
// The error names each place tried and dlerror()'s reason.
Result<const OpenBlasLib*> OpenBlas();

// OpenBlas() for callers that cannot return a Status (the GEMM wrappers):
// aborts with the reason when OpenBLAS cannot be opened. Entry points that
// reach it (GptModel::Create) check OpenBlas() first.
const OpenBlasLib& OpenBlasOrDie();

}  // namespace zinf::cpu
