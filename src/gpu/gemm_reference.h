// The reference product of `zinf bench model --device cuda`: the model's
// largest matrix product (the LM head) issued once more on its own through
// cuBLAS, as the CUDA model issues its products — fp32 operands with
// pedantic math (no TF32), or bf16 operands with fp32 accumulation — and
// timed with CUDA events on the stream. The model's TFLOP/s are then set
// against what the library reaches on the same shape in the same run.
#pragma once

#include <cstdint>

#include "zinf/status.h"

namespace zinf::gpu {

// Row-major C[m, n] = A[m, k] · B[n, k]ᵀ on `stream` (a cudaStream_t), the
// operands device memory of bf16 (`bf16`) or fp32 elements, C fp32. Seconds
// per product: the median of `reps` timed products after one warm-up.
Result<double> TimeCublasProduct(void* stream, int64_t m, int64_t n, int64_t k, bool bf16, const void* a, const void* b,
                                 float* c, int reps);

}  // namespace zinf::gpu
