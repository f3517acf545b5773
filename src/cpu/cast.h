// Element-wise conversion between fp32, bf16 and fp16 (round to nearest even,
// subnormals kept, NaN stays NaN; see float16.h for the exact rules), over a
// caller-sized oneTBB arena in 64 Ki-element blocks. Every SIMD level gives
// the bits of the scalar twin. Destinations aligned to the vector width are
// written with non-temporal stores: a cast's output is not read back soon
// (it is copied to the device or written to disk). Blocks until done.
// Thread-safety: concurrent calls are safe on disjoint buffers.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstddef>

#include "cpu/simd_level.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::cpu {

// dst[i] = convert(src[i]) for i < num_elems; equal dtypes copy. kInvalidArgument
// for null or overlapping buffers or a level above DetectedSimdLevel().
Status Cast(tbb::task_arena& arena, const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t num_elems,
            SimdLevel level = ActiveSimdLevel());

}  // namespace zinf::cpu
