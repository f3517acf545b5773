// The memory bound for the CPU Adam: the fastest of several streaming kernels
// that move exactly Adam's bytes — params, exp_avg and exp_avg_sq read and
// written (fp32), the gradient read (fp32 or 16-bit), optionally a 16-bit
// parameter copy written — over the very arrays the optimizer uses, with the
// same threads. Its arithmetic is one multiply-add per stream, so nothing but
// memory can limit it. Variants: vector width (the SIMD level given, or
// narrower), unrolling (1 or 4 vectors per iteration) and partitioning
// (oneTBB's automatic 64 Ki-element tasks, or one contiguous chunk per thread
// on cache-line boundaries); each variant is timed, and the bound is the
// fastest median. Thread-safety: one call at a time per set of arrays.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <string>
#include <vector>

#include "cpu/adam.h"
#include "cpu/simd_level.h"
#include "zinf/dtype.h"

namespace zinf::bench {

// The kernels take Adam's own buffers (cpu/adam.h): the copy, when present,
// is 16-bit whatever its dtype, so only its size matters.
// One variant of the streaming kernel.
struct StreamVariant {
  std::string name;                                                             // e.g. "avx512 x4 static"
  double (*time)(tbb::task_arena& arena, const cpu::AdamBuffers& a) = nullptr;  // seconds for one pass
};

// The variants usable at `level` (which caps the vector width).
std::vector<StreamVariant> StreamVariants(cpu::SimdLevel level);

// Bytes one pass moves: 24 + gradient bytes (+ 2 for the copy) per element.
double StreamBytes(const cpu::AdamBuffers& a);

}  // namespace zinf::bench
