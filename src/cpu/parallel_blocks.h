// Splits [0, num_elems) into kNormBlockElems (64 Ki) element blocks and runs
// fn(begin_elem, end_elem) over runs of whole blocks on a caller-sized oneTBB
// arena, with the IEEE default FP environment set in each task (oneTBB would
// otherwise apply the FP settings of the thread that created the arena). Every
// task touches at least kMinTaskBytes, so scheduling costs vanish against the
// memory traffic, and task boundaries are block multiples, so per-block results
// never depend on how many threads ran or how the range was split. Blocks
// until fn has run over the whole range. Thread-safety: as safe as fn on
// disjoint ranges.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cstddef>

#include "cpu/kernels.h"

namespace zinf::cpu {

inline constexpr size_t kMinTaskBytes = size_t{256} * 1024;

inline size_t NumBlocks(size_t num_elems) { return (num_elems + math::kNormBlockElems - 1) / math::kNormBlockElems; }

// bytes_per_elem: what the kernel reads plus writes per element.
template <class Fn>
void ParallelForBlocks(tbb::task_arena& arena, size_t num_elems, size_t bytes_per_elem, const Fn& fn) {
  const size_t num_blocks = NumBlocks(num_elems);
  if (num_blocks == 0) return;
  const size_t block_bytes = math::kNormBlockElems * bytes_per_elem;
  const size_t grain_blocks = std::max<size_t>(1, (kMinTaskBytes + block_bytes - 1) / block_bytes);
  const tbb::blocked_range<size_t> blocks(0, num_blocks, grain_blocks);
  arena.execute([&] {
    tbb::parallel_for(blocks, [&](const tbb::blocked_range<size_t>& r) {
      DefaultFpEnvironment fp_env;
      fn(r.begin() * math::kNormBlockElems, std::min(num_elems, r.end() * math::kNormBlockElems));
    });
  });
}

}  // namespace zinf::cpu
