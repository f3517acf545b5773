// Sum of squares for the global gradient norm, reproducible however a buffer
// is sharded: each fixed 64 Ki-element block (kNormBlockElems) gets its own
// double partial, formed by widening every element to double, squaring it
// (exact) and adding it to lane i % 16 in element order, the 16 lanes then
// combined in a fixed pairwise order (kernels.h). Every SIMD level and the
// scalar twin give the same partials, for any thread count. Partials combined
// in block order (CombineBlockPartials) give the same total for any split into
// shards whose boundaries are block multiples, concatenated in shard order.
//
// The non-finite check rides in the same pass: a block's partial is ±inf or
// NaN exactly when the block holds an inf or NaN (a finite block cannot
// overflow: 65536 * FLT_MAX^2 is far below DBL_MAX).
// Thread-safety: concurrent calls are safe.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <span>

#include "cpu/simd_level.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::cpu {

// ceil(num_elems / 65536): the number of partials SumSquaresBlocks writes.
size_t NumNormBlocks(size_t num_elems);

// Writes block_partials[b] = sum of squares of block b of `data` (num_elems
// values of `dtype`) and returns how many blocks hold a non-finite value
// (0: all finite). block_partials.size() must be NumNormBlocks(num_elems)
// (kInvalidArgument otherwise, as for a null data pointer or a level above
// DetectedSimdLevel()). Blocks the caller until done.
Result<size_t> SumSquaresBlocks(tbb::task_arena& arena, const void* data, DType dtype, size_t num_elems,
                                std::span<double> block_partials, SimdLevel level = ActiveSimdLevel());

// The sum of the partials left to right, in block order.
double CombineBlockPartials(std::span<const double> block_partials);

}  // namespace zinf::cpu
