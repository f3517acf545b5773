// The rank-order reduction shared by every communicator, and the inline
// host stream. See communicator.h for the determinism argument.
#include "common/communicator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "common/check.h"

namespace zinf {

int LocalRanksFromEnvironment() {
  for (const char* var :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n > 0 && n <= (1 << 20)) return static_cast<int>(n);
  }
  return 0;
}

int Communicator::local_size() const { return std::max(1, LocalRanksFromEnvironment()); }

void Communicator::Abort(const Status& cause) { SetLocalFailure(cause); }

Status Communicator::Health() { return LocalFailure(); }

Status Communicator::LocalFailure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

void Communicator::SetLocalFailure(const Status& cause) {
  if (cause.ok()) return;
  std::lock_guard<std::mutex> lock(failure_mu_);
  if (failure_.ok()) failure_ = cause;
}

namespace {

// Blocks keep the fp32 accumulators in L1 and let the compiler vectorize the
// inner loops; each element still sees exactly the operation sequence of
// reduce::ReduceElement (widen rank 0, combine ranks 1..n-1 in order, finish
// once), so the result is the one the CUDA kernel computes.
template <typename Codec, ReduceOp kOp>
void ReduceBlocked(const void* const* inputs, int n, void* out, size_t count) {
  using T = typename Codec::Storage;
  constexpr size_t kBlock = 2048;
  float acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t len = std::min(kBlock, count - base);
    const T* in0 = static_cast<const T*>(inputs[0]) + base;
    for (size_t i = 0; i < len; ++i) acc[i] = Codec::Widen(in0[i]);
    for (int r = 1; r < n; ++r) {
      const T* in = static_cast<const T*>(inputs[r]) + base;
      for (size_t i = 0; i < len; ++i) acc[i] = reduce::Combine<kOp>(acc[i], Codec::Widen(in[i]));
    }
    // Every input of this block has been read, so `out` may alias one of them.
    T* o = static_cast<T*>(out) + base;
    for (size_t i = 0; i < len; ++i) o[i] = reduce::Finish<Codec>(acc[i]);
  }
}

template <typename Codec>
void ReduceWithCodec(const void* const* inputs, int n, void* out, size_t count, ReduceOp op) {
  if (op == ReduceOp::kSum)
    ReduceBlocked<Codec, ReduceOp::kSum>(inputs, n, out, count);
  else
    ReduceBlocked<Codec, ReduceOp::kMax>(inputs, n, out, count);
}

// Above HostDevice's and CudaDevice's counters, so ids never collide.
std::atomic<uint64_t> next_inline_stream_id{uint64_t{1} << 63};

class IdentityContext final : public StreamContext {
 public:
  void* Host(const void* ptr) const override { return const_cast<void*>(ptr); }
};

}  // namespace

void ReduceInRankOrder(const void* const* inputs, int n, void* out, size_t count, DType dtype, ReduceOp op) {
  ZINF_CHECK(n >= 1);
  if (count == 0) return;
  switch (dtype) {
    case DType::kFloat32:
      ReduceWithCodec<reduce::Fp32Codec>(inputs, n, out, count, op);
      return;
    case DType::kBFloat16:
      ReduceWithCodec<reduce::Bf16Codec>(inputs, n, out, count, op);
      return;
    case DType::kFloat16:
      ReduceWithCodec<reduce::Fp16Codec>(inputs, n, out, count, op);
      return;
  }
  ZINF_CHECK_MSG(false, "ReduceInRankOrder: unknown dtype");
}

std::string_view CollectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

InlineHostStream::InlineHostStream() : id_(next_inline_stream_id.fetch_add(1)) {}

Status InlineHostStream::Enqueue(StreamTask task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sticky_.ok()) return Status::Ok();  // after an error, later tasks are skipped (as on HostDevice)
  static const IdentityContext context;
  sticky_ = task(context);
  return Status::Ok();
}

Status InlineHostStream::Wait(Event& event) { return event.Synchronize(); }

Status InlineHostStream::Synchronize() {
  std::lock_guard<std::mutex> lock(mu_);
  return sticky_;
}

Status InlineHostStream::sticky_error() { return Synchronize(); }  // nothing is ever queued

}  // namespace zinf
