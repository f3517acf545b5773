// FaultInjectingFile: opens like File, then perturbs attempts per its plan.
#include "nvme/fault_file.h"

#include <unistd.h>

#include <cerrno>

namespace zinf::nvme {

Result<std::shared_ptr<FaultInjectingFile>> FaultInjectingFile::Open(const std::string& path,
                                                                     const FileOptions& options,
                                                                     const FaultPlan& plan) {
  // Open through File to share its flag handling and error messages, then
  // take over the descriptor.
  ZINF_ASSIGN_OR_RETURN(auto plain, File::Open(path, options));
  int fd = ::dup(plain->fd());
  if (fd < 0) return IoError("dup " + path + ": errno " + std::to_string(errno));
  return std::shared_ptr<FaultInjectingFile>(new FaultInjectingFile(path, fd, options.direct, plan));
}

std::optional<int> FaultInjectingFile::InjectError(IoKind kind, uint64_t offset, uint64_t len) {
  if (plan_.overlap) {  // an attempt starts (an injected error completes it at once, through the hook below)
    const int k = kind == IoKind::kRead ? 0 : 1;
    plan_.overlap->in_flight[k].fetch_add(1);
    if (plan_.overlap->in_flight[1 - k].load() > 0) plan_.overlap->mixed.fetch_add(1);
  }
  if (plan_.armed && !plan_.armed->load()) return std::nullopt;
  uint64_t n = attempts_.fetch_add(1);
  std::optional<int> err;
  if (plan_.fail_attempt && n == *plan_.fail_attempt) err = plan_.fail_errno;
  if (kind == IoKind::kRead && plan_.fail_reads_from && offset + len > *plan_.fail_reads_from &&
      offset >= *plan_.fail_reads_from)
    err = plan_.fail_errno;
  if (kind == IoKind::kWrite && plan_.enospc_at && offset >= *plan_.enospc_at) err = ENOSPC;
  if (err) injected_.fetch_add(1);
  return err;
}

uint32_t FaultInjectingFile::CompletionDelayMicros(IoKind kind) {
  if (!plan_.overlap) return plan_.delay_us;
  // Held here, so that the attempt counts as in flight until it is handled.
  if (plan_.delay_us > 0) ::usleep(plan_.delay_us);
  plan_.overlap->in_flight[kind == IoKind::kRead ? 0 : 1].fetch_sub(1);
  return 0;
}

uint64_t FaultInjectingFile::LimitTransfer(IoKind kind, uint64_t offset, uint64_t len) {
  if (plan_.armed && !plan_.armed->load()) return len;
  uint64_t limit = len;
  if (plan_.max_transfer && limit > plan_.max_transfer) limit = plan_.max_transfer;
  // A write that crosses the ENOSPC line stops at it (the next attempt fails).
  if (kind == IoKind::kWrite && plan_.enospc_at && offset < *plan_.enospc_at && offset + limit > *plan_.enospc_at)
    limit = *plan_.enospc_at - offset;
  return limit;
}

}  // namespace zinf::nvme
