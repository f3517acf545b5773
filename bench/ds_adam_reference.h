// A reference CPU Adam of DeepSpeed cpu_adam's shape, for `zinf bench adam`
// to measure zinf's kernel against in the same run (issue #39). It is our own
// re-implementation of the kernel's published structure (DeepSpeed
// csrc/adam/cpu_adam_impl.cpp, csrc/includes/cpu_adam.h and simd.h), not
// DeepSpeed's code: fp32 gradient, parameters and state; vectors of 16
// (AVX-512) or 8 (AVX2) floats handled "span" 8 at a time (load 8 vectors of
// each stream, update them with FMA, store 8 of each), then spans of 4 and 1,
// then a scalar tail; the blocks of each 128 Mi-element tile split statically
// over the threads, as `#pragma omp parallel for` does. In the mixed form the
// 16-bit parameter copy is a second pass over the fp32 parameters (read 4,
// write 2 bytes per element), split the same way: ZeRO-Offload hands cpu_adam
// fp32 gradients and produces the 16-bit copy separately, so that form moves
// 28 + 6 = 34 bytes per parameter in two passes, where zinf moves 28 in one.
// Results agree with zinf's AdamStep to rounding (FMA, other grouping), not
// bit for bit. Thread-safety: one call at a time per set of arrays.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cpu/adam.h"
#include "cpu/simd_level.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::bench {

// Elements per outer tile (DeepSpeed simd.h: TILE = 128 * 1024 * 1024).
inline constexpr size_t kDsTileElems = size_t{128} << 20;

// The per-step constants: zinf's (adam_math.h: betas, eps, grad_scale,
// inv_sqrt_bc2, weight_decay and the decay mode; the reference skips the
// gradient multiply when grad_scale is 1), plus the two DeepSpeed folds.
struct DsAdamConstants {
  math::AdamStepConstants base;
  float neg_step_size = -1e-3f;  // -lr / (1 - beta1^t): p = fma(m / d, neg_step_size, p)
  float decay_term = 0.0f;       // AdamW: -lr * weight_decay, p = fma(p, decay_term, p)
};

// ZINF_CHECKs that the options are valid (MakeAdamStepConstants).
DsAdamConstants MakeDsAdamConstants(const cpu::AdamOptions& options, int64_t step, double grad_scale);

// The reference's two passes at one SIMD level.
struct DsAdamKernels {
  std::string name;  // "avx512", "avx2" or "scalar"
  size_t floats_per_vector = 1;
  // One Adam pass over b (grad_dtype must be fp32; param_copy is ignored).
  void (*adam)(tbb::task_arena& arena, const DsAdamConstants& c, const cpu::AdamBuffers& b) = nullptr;
  // fp32 params -> b.param_copy as b.param_copy_dtype (round to nearest even).
  void (*copy)(tbb::task_arena& arena, const cpu::AdamBuffers& b) = nullptr;
};

// The widest kernels usable at `level`: AVX-512 at kAvx512, AVX2 (with FMA
// and F16C, as DeepSpeed's AVX256 build needs) at kAvx2, else scalar.
DsAdamKernels DsAdamKernelsFor(cpu::SimdLevel level);

// One full step: the Adam pass, then the copy pass when b.param_copy is set.
void DsAdamStep(tbb::task_arena& arena, const DsAdamKernels& k, const DsAdamConstants& c, const cpu::AdamBuffers& b);

// Bytes one step moves per parameter: 28, plus 6 for the copy pass.
size_t DsAdamBytesPerParam(bool with_copy);

// One line for a benchmark's header: what the reference is and does.
std::string DsAdamDescription(const DsAdamKernels& k, bool with_copy);

// Runs zinf's AdamStep (gradient in grad_dtype, the copy fused when
// with_copy) and the reference (the same gradients as fp32, then its copy
// pass) once each from the same state on a small problem that has every tail;
// kInternal names the first element whose parameter, m or v differs by more
// than 1e-5 relative (the copy: more than one 16-bit rounding step).
// Runs on a oneTBB arena of `threads`.
Status DsAdamSelfCheck(int threads, const DsAdamKernels& k, const cpu::AdamOptions& options, double grad_scale,
                       DType grad_dtype, bool with_copy, DType copy_dtype, cpu::SimdLevel level);

}  // namespace zinf::bench
