// The CUDA twin of ReduceInRankOrder (common/communicator.h): the ordered
// sum/max of NcclComm's deterministic reduce-scatter, on the GPU, with the
// same per-element functions as the host, so both give the same bits.
// No CUDA header leaks from here. Thread-safe (enqueues only).
#pragma once

#include <cstddef>

#include "common/communicator.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::gpu {

// Enqueues on `cuda_stream` (a cudaStream_t) the reduction of n inputs, in
// rank order, into `out` (`count` elements of `dtype`, device memory):
// input r is `self` for r == self_rank, else the slot of `staging` holding
// `count` elements at index (r < self_rank ? r : r - 1) — the layout an
// all-to-all leaves when a rank does not send to itself. `out` may be `self`.
// Errors: a launch failure (kInternal naming the kernel and device).
Status LaunchReduceInRankOrder(const void* staging, const void* self, int self_rank, int n, void* out, size_t count,
                               DType dtype, ReduceOp op, void* cuda_stream);

}  // namespace zinf::gpu
