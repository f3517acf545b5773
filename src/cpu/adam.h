// The CPU Adam/AdamW step of ZeRO-Offload: fp32 master parameters with fp32
// m and v, gradients in fp32, bf16 or fp16, and optionally the updated
// parameter written as bf16/fp16 into a second buffer in the same pass. The
// per-element operation sequence is documented in adam_math.h; it is the same
// on every SIMD level, on the scalar twin and on the CUDA kernels, so where
// the optimizer runs never changes the result. The step counter is the
// caller's (1 for the first step).
//
// Work is split into 64 Ki-element blocks over a oneTBB arena that the caller
// sizes (one arena per rank, leaving cores for I/O completion); results do not
// depend on the thread count. AdamStep blocks until the update is complete.
// Thread-safety: concurrent calls are safe on disjoint buffers.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <cstdint>

#include "math/adam_math.h"
#include "cpu/simd_level.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::cpu {

enum class AdamMode {
  kAdam,   // L2: weight_decay * param is added to the gradient
  kAdamW,  // decoupled: param *= 1 - lr * weight_decay (Loshchilov & Hutter)
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  AdamMode mode = AdamMode::kAdamW;
  bool bias_correction = true;
};

// The fp32 constants of step `step` (>= 1), computed in double and rounded
// once; grad_scale folds 1/loss_scale and the clipping coefficient. Errors
// (kInvalidArgument) name the bad option: lr or weight_decay negative or not
// finite, a beta outside [0, 1), eps <= 0, step < 1, grad_scale < 0 or not finite.
Result<math::AdamStepConstants> MakeAdamStepConstants(const AdamOptions& options, int64_t step, double grad_scale);

// The buffers of one call, num_elems elements each; none may overlap another.
struct AdamBuffers {
  float* params = nullptr;      // fp32 master parameters, updated in place
  float* exp_avg = nullptr;     // m, updated in place
  float* exp_avg_sq = nullptr;  // v, updated in place
  const void* grads = nullptr;  // grad_dtype elements
  DType grad_dtype = DType::kFloat32;
  void* param_copy = nullptr;                 // optional: receives the updated parameter as param_copy_dtype
  DType param_copy_dtype = DType::kBFloat16;  // kBFloat16, kFloat16, or kFloat32 (an exact copy)
  size_t num_elems = 0;
};

// One optimizer step over `buffers` with the kernels of `level`, which must be
// <= DetectedSimdLevel(). kInvalidArgument for bad options, null or
// overlapping buffers or an unsupported level.
Status AdamStep(tbb::task_arena& arena, const AdamOptions& options, int64_t step, double grad_scale,
                const AdamBuffers& buffers, SimdLevel level = ActiveSimdLevel());

// The same with precomputed constants (the engine computes them once per step
// for all sub-groups).
Status AdamStep(tbb::task_arena& arena, const math::AdamStepConstants& constants, const AdamBuffers& buffers,
                SimdLevel level = ActiveSimdLevel());

}  // namespace zinf::cpu
