#include "cpu/collective_call.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <new>

namespace zinf::cpu {

std::string DescribeArgs(const CallInfo& c) {
  if (c.kind == CollectiveKind::kBarrier) return "";
  std::string s = " (" + std::string(DTypeName(c.dtype)) + ", " + std::to_string(c.count) + " elements";
  if (c.reduces() && c.op != ReduceOp::kSum) s += ", " + std::string(ReduceOpName(c.op));
  if (c.kind == CollectiveKind::kBroadcast) s += ", root " + std::to_string(c.root);
  return s + ")";
}

std::string Describe(const CallInfo& c) {
  return std::string(CollectiveName(c.kind)) + " #" + std::to_string(c.seq) + DescribeArgs(c);
}

std::string FormatSeconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", seconds);
  return buf;
}

Status ValidateCall(const CallInfo& c, const void* send, const void* recv, int size) {
  const std::string name(CollectiveName(c.kind));
  if (static_cast<unsigned>(c.dtype) > static_cast<unsigned>(DType::kFloat16))
    return InvalidArgument(name + ": unknown dtype " + std::to_string(static_cast<int>(c.dtype)));
  if (c.reduces() && c.op != ReduceOp::kSum && c.op != ReduceOp::kMax)
    return InvalidArgument(name + ": unknown reduce op " + std::to_string(static_cast<int>(c.op)));
  if (c.kind == CollectiveKind::kBroadcast && (c.root < 0 || c.root >= size))
    return InvalidArgument(name + ": root " + std::to_string(c.root) + " is not a rank of this " +
                           std::to_string(size) + "-rank communicator");
  const size_t elem = DTypeSizeBytes(c.dtype);
  if (c.count > SIZE_MAX / elem / static_cast<size_t>(size))
    return InvalidArgument(name + ": " + std::to_string(c.count) + " elements overflow a byte count");
  if (c.kind != CollectiveKind::kBarrier && c.count > 0 && (!send || !recv))
    return InvalidArgument(name + DescribeArgs(c) + ": null buffer");
  return Status::Ok();
}

WireCall WireCall::From(const CallInfo& c) {
  return WireCall{c.seq,
                  c.count,
                  static_cast<int32_t>(c.kind),
                  static_cast<int32_t>(c.dtype),
                  c.reduces() ? static_cast<int32_t>(c.op) : 0,
                  c.root};
}

CallInfo WireCall::ToInfo() const {
  CallInfo c;
  c.seq = seq;
  c.count = count;
  c.kind = static_cast<CollectiveKind>(kind);
  c.dtype = static_cast<DType>(dtype);
  c.op = static_cast<ReduceOp>(op);
  c.root = root;
  return c;
}

Status CompareCalls(const CallInfo& mine, const std::vector<WireCall>& calls) {
  for (size_t p = 1; p < calls.size(); ++p) {
    if (calls[p] == calls[0]) continue;
    const CallInfo a = calls[0].ToInfo(), b = calls[p].ToInfo();
    return InvalidArgument(Describe(mine) + ": the ranks disagree (checking mode): rank 0 called " + Describe(a) +
                           ", rank " + std::to_string(p) + " called " + Describe(b));
  }
  return Status::Ok();
}

Result<StagingPool::Buffer> StagingPool::Acquire(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->bytes >= bytes && (best == free_.end() || it->bytes < best->bytes)) best = it;
    if (best != free_.end()) {
      Buffer b = std::move(*best);
      free_.erase(best);
      return b;
    }
  }
  Buffer b;
  b.data.reset(new (std::nothrow) std::byte[std::max<size_t>(bytes, 1)]);
  if (!b.data) return OutOfMemory("staging buffer of " + std::to_string(bytes) + " bytes");
  b.bytes = bytes;
  return b;
}

void StagingPool::Release(Buffer b) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(std::move(b));
  if (free_.size() > kMaxFree) {  // drop the smallest
    auto smallest = std::min_element(free_.begin(), free_.end(),
                                     [](const Buffer& x, const Buffer& y) { return x.bytes < y.bytes; });
    free_.erase(smallest);
  }
}

}  // namespace zinf::cpu
