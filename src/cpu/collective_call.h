// What the host communicators built from point-to-point or transport
// operations (MpiComm, TransportComm) share: the description of one
// collective call as errors name it, its fixed-size form for checking mode,
// and a pool of staging buffers for the all-to-all of a reduction.
//
// Thread-safety: CallInfo and WireCall are values; StagingPool may be used
// from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/communicator.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::cpu {

// One collective as the communicator numbered it.
struct CallInfo {
  CollectiveKind kind = CollectiveKind::kBarrier;
  uint64_t seq = 0;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = -1;

  bool reduces() const { return kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kAllReduce; }
};

// "(fp32, 1048576 elements)", "(bf16, 8 elements, max)", "(fp32, 3 elements, root 1)"; "" for a barrier.
std::string DescribeArgs(const CallInfo& c);

// "all_reduce #17 (fp32, 1048576 elements)".
std::string Describe(const CallInfo& c);

// "300.0 s".
std::string FormatSeconds(double seconds);

// Checks a call's arguments as every host communicator does: dtype and op
// known, root a rank, byte counts that fit, buffers present.
Status ValidateCall(const CallInfo& c, const void* send, const void* recv, int size);

// What ranks exchange in checking mode. Fixed-size, host byte order (the
// ranks of one job run the same binary).
struct WireCall {
  uint64_t seq;
  uint64_t count;
  int32_t kind;
  int32_t dtype;
  int32_t op;
  int32_t root;

  static WireCall From(const CallInfo& c);
  CallInfo ToInfo() const;
  bool operator==(const WireCall&) const = default;
};
static_assert(sizeof(WireCall) == 32);

// Checking mode's verdict over every rank's call (calls[r] from rank r):
// OK, or kInvalidArgument naming rank 0's call and the first that differs.
Status CompareCalls(const CallInfo& mine, const std::vector<WireCall>& calls);

// Staging buffers for the all-to-all, kept for reuse so a steady stream of
// same-size collectives does not fault in fresh pages every time.
class StagingPool {
 public:
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    size_t bytes = 0;
  };

  Result<Buffer> Acquire(size_t bytes);
  void Release(Buffer b);

 private:
  static constexpr size_t kMaxFree = 4;
  std::mutex mu_;
  std::vector<Buffer> free_;
};

}  // namespace zinf::cpu
