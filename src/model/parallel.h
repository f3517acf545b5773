// ModelThreads: the one thread pool the model's CPU kernels run on — a
// oneTBB arena of a caller-given size. Matrix products are OpenBLAS calls
// made single-threaded from inside the arena's tasks (see gemm.h), so
// OpenBLAS never starts threads of its own next to it.
//
// Work is split into chunks whose boundaries depend only on the problem
// (never on the thread count), and every chunk is computed by one thread in
// a fixed order, so results are bit-identical for any number of threads.
// Each chunk runs in the default FP environment (no FTZ/DAZ).
//
// It also carries the precision of the model's matrix products (gemm.h):
// fp32, or bf16 operands with fp32 accumulation, so every product a kernel
// makes on this pool follows one setting.
//
// Thread-safety: ForChunks may be called from several threads at once (the
// arena serves them all); the object itself is immutable after construction.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "common/check.h"
#include "cpu/kernels.h"
#include "zinf/dtype.h"

namespace zinf::model {

class ModelThreads {
 public:
  // num_threads >= 1; 1 runs everything on the calling thread. matmul:
  // kFloat32 or kBFloat16 (see gemm.h).
  explicit ModelThreads(int num_threads, DType matmul = DType::kFloat32) : num_threads_(num_threads), matmul_(matmul) {
    ZINF_CHECK(num_threads >= 1);
    ZINF_CHECK(matmul == DType::kFloat32 || matmul == DType::kBFloat16);
    if (num_threads > 1) arena_ = std::make_unique<tbb::task_arena>(num_threads);
  }
  int num_threads() const { return num_threads_; }
  DType matmul_dtype() const { return matmul_; }

  // Calls fn(begin, end) for the chunks [i·grain, min(n, (i+1)·grain)) of
  // [0, n), in parallel; blocks until all have run.
  template <class Fn>
  void ForChunks(int64_t n, int64_t grain, const Fn& fn) const {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    const int64_t num_chunks = (n + grain - 1) / grain;
    auto run = [&](int64_t chunk_begin, int64_t chunk_end) {
      cpu::DefaultFpEnvironment fp_env;
      for (int64_t i = chunk_begin; i < chunk_end; ++i) fn(i * grain, std::min(n, (i + 1) * grain));
    };
    if (!arena_ || num_chunks == 1) {
      run(0, num_chunks);
      return;
    }
    arena_->execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<int64_t>(0, num_chunks, 1),
          [&](const tbb::blocked_range<int64_t>& r) { run(r.begin(), r.end()); }, tbb::simple_partitioner());
    });
  }

 private:
  int num_threads_;
  DType matmul_;
  std::unique_ptr<tbb::task_arena> arena_;
};

}  // namespace zinf::model
