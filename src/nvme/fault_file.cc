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
