// Block-parallel sum of squares: each task runs the level's kernel over whole
// blocks and combines each block's 16 lanes in the fixed order.
#include "cpu/norm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "cpu/kernel_args.h"
#include "cpu/kernels.h"
#include "cpu/parallel_blocks.h"

namespace zinf::cpu {

size_t NumNormBlocks(size_t num_elems) { return cpu::NumBlocks(num_elems); }

Result<size_t> SumSquaresBlocks(tbb::task_arena& arena, const void* data, DType dtype, size_t num_elems,
                                std::span<double> block_partials, SimdLevel level) {
  ZINF_RETURN_IF_ERROR(cpu::CheckSimdLevel(level));
  ZINF_RETURN_IF_ERROR(cpu::CheckDType(dtype, "sum of squares"));
  const size_t num_blocks = NumNormBlocks(num_elems);
  if (block_partials.size() != num_blocks) {
    return InvalidArgument("sum of squares: " + std::to_string(block_partials.size()) + " partials for " +
                           std::to_string(num_elems) + " elements; expected " + std::to_string(num_blocks));
  }
  if (num_elems > 0 && !data) return InvalidArgument("sum of squares: data is null");
  const cpu::SumSquaresFn kernel = cpu::Kernels(level).sum_squares[static_cast<int>(dtype)];
  const size_t elem_bytes = DTypeSizeBytes(dtype);
  std::atomic<size_t> non_finite{0};
  cpu::ParallelForBlocks(arena, num_elems, elem_bytes, [&](size_t begin, size_t end) {
    size_t local_non_finite = 0;
    for (size_t b0 = begin; b0 < end; b0 += math::kNormBlockElems) {
      const size_t b1 = std::min(end, b0 + math::kNormBlockElems);
      double lanes[math::kNormLanes];
      kernel(static_cast<const unsigned char*>(data) + b0 * elem_bytes, b1 - b0, lanes);
      const double partial = math::CombineNormLanes(lanes);
      block_partials[b0 / math::kNormBlockElems] = partial;
      if (!std::isfinite(partial)) ++local_non_finite;
    }
    if (local_non_finite) non_finite.fetch_add(local_non_finite, std::memory_order_relaxed);
  });
  return non_finite.load();
}

double CombineBlockPartials(std::span<const double> block_partials) {
  double sum = 0.0;
  for (double p : block_partials) sum += p;
  return sum;
}

}  // namespace zinf::cpu
