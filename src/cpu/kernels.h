// The CPU kernels' dispatch table: one entry per SIMD level (scalar twin,
// SSE2, AVX2, AVX-512BW), filled by one translation unit per level compiled
// with that level's flags (kernels_scalar.cc, kernels_sse2.cc, ...). The
// public entry points (adam.h, norm.h, cast.h) split work into blocks over a
// oneTBB arena and call these single-threaded functions on each block; tests
// call every level the CPU supports directly.
//
// Every level gives bit-identical results (the SIMD levels against the scalar
// twin): the same per-element fp32 sequence (adam_math.h), the same
// conversions (float16.h), and for sums of squares the same 16 double lanes.
// One exception: where Adam's arithmetic meets a NaN, the result is NaN on
// every level but its sign and payload may differ (x86 propagates the payload
// of whichever NaN operand the compiler placed first). Casts are exact bit
// functions, NaNs included. Kernels assume the default FP environment;
// DefaultFpEnvironment below establishes it.
//
// Pointers need only their element type's natural alignment; num_elems may be
// zero. Thread-safety: the kernels are pure functions of their arguments;
// concurrent calls on disjoint ranges are safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "math/adam_math.h"
#include "math/norm_math.h"  // kNormBlockElems, kNormLanes, CombineNormLanes
#include "cpu/simd_level.h"
#include "zinf/dtype.h"

namespace zinf::cpu {

// The optional copy of the updated parameter: 16-bit (the compute copy of
// mixed precision) or fp32 (an fp32 compute copy written in the same pass).
enum class ParamCopy : int { kNone = 0, kBf16 = 1, kFp16 = 2, kFp32 = 3 };

// Adam over n elements: params/exp_avg/exp_avg_sq are fp32 and updated in
// place; grads has the table slot's dtype; param_copy (if the slot has one)
// receives the updated parameter (16-bit: rounded to nearest even). Aligned param_copy
// pointers (to the vector width) are written with non-temporal stores.
using AdamKernelFn = void (*)(const math::AdamStepConstants& c, float* params, float* exp_avg, float* exp_avg_sq,
                              const void* grads, void* param_copy, size_t num_elems);
// Sum of squares of num_elems <= kNormBlockElems values, widened to double and
// accumulated in lanes[i % 16] in element order; lanes are overwritten.
using SumSquaresFn = void (*)(const void* data, size_t num_elems, double lanes[math::kNormLanes]);
// Element-wise conversion; src and dst must not overlap.
using CastFn = void (*)(const void* src, void* dst, size_t num_elems);

struct KernelTable {
  SimdLevel level;
  AdamKernelFn adam[3][4];      // [grad DType][ParamCopy]
  SumSquaresFn sum_squares[3];  // [DType]
  CastFn cast[3][3];            // [src DType][dst DType]; same-dtype slots are nullptr
};

// The table for `level`, which must be <= DetectedSimdLevel() (a bug otherwise:
// ZINF_CHECK). Levels not built for this architecture fall back to the next
// lower one that is.
const KernelTable& Kernels(SimdLevel level);

// Sets the calling thread's floating-point environment to IEEE defaults
// (round to nearest even, no flush-to-zero, no denormals-are-zero) for its
// lifetime and restores the previous one after, so a caller that enabled
// FTZ/DAZ (as some frameworks do) does not change the kernels' results.
class DefaultFpEnvironment {
 public:
  DefaultFpEnvironment();
  ~DefaultFpEnvironment();
  DefaultFpEnvironment(const DefaultFpEnvironment&) = delete;
  DefaultFpEnvironment& operator=(const DefaultFpEnvironment&) = delete;

 private:
  unsigned saved_ = 0;
};

// Per-level tables (defined in kernels_<level>.cc).
const KernelTable& ScalarKernels();
#if defined(__x86_64__) || defined(_M_X64)
const KernelTable& Sse2Kernels();
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();
#endif

}  // namespace zinf::cpu
