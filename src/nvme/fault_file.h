// A file that fails on demand, for tests of every error path of the NVMe
// tier (leveldb's ErrorEnv idea). It is a real file on disk; the faults are
// applied through File's hooks, so the I/O engine's own resubmission and
// error handling are what get tested, on the io_uring and posix backends.
// Thread-safe: counters are atomic, the plan is fixed at Open.
#pragma once

#include <atomic>
#include <memory>
#include <optional>

#include "nvme/file.h"

namespace zinf::nvme {

// Attempts in flight per kind, and how many attempts went out while one of
// the other kind was in flight (a read beside a write, or the reverse).
struct KindOverlap {
  std::atomic<int64_t> in_flight[2] = {0, 0};  // IoKind::kRead, IoKind::kWrite
  std::atomic<uint64_t> mixed{0};
};

struct FaultPlan {
  // Fail the Nth attempt (0-based, reads and writes counted together, every
  // resubmission counting as an attempt) with fail_errno.
  std::optional<uint64_t> fail_attempt;
  int fail_errno = EIO;
  // Fail every attempt of this kind at or past this file offset (e.g. a bad
  // sector range).
  std::optional<uint64_t> fail_reads_from;
  // Each attempt transfers at most this many bytes (0 = no limit): short
  // reads and writes. On O_DIRECT files keep it a multiple of 4096.
  uint64_t max_transfer = 0;
  // Writes that reach this offset stop there and then fail with ENOSPC, as
  // on a full disk.
  std::optional<uint64_t> enospc_at;
  // Each completion is held this long before the engine handles it.
  uint32_t delay_us = 0;
  // When set, the faults above apply, and attempts count, only while it is
  // true: a test arms a file once it is past the I/O it wants to succeed.
  std::shared_ptr<std::atomic<bool>> armed;
  // When set, every attempt (armed or not) is counted in it, across the
  // files that share it.
  std::shared_ptr<KindOverlap> overlap;
};

class FaultInjectingFile : public File {
 public:
  static Result<std::shared_ptr<FaultInjectingFile>> Open(const std::string& path, const FileOptions& options,
                                                          const FaultPlan& plan);

  std::optional<int> InjectError(IoKind kind, uint64_t offset, uint64_t len) override;
  uint64_t LimitTransfer(IoKind kind, uint64_t offset, uint64_t len) override;
  uint32_t CompletionDelayMicros(IoKind kind) override;

  uint64_t attempts() const { return attempts_.load(); }
  uint64_t injected_failures() const { return injected_.load(); }

 private:
  FaultInjectingFile(std::string path, int fd, bool direct, const FaultPlan& plan)
      : File(std::move(path), fd, direct), plan_(plan) {}
  FaultPlan plan_;
  std::atomic<uint64_t> attempts_{0};
  std::atomic<uint64_t> injected_{0};
};

}  // namespace zinf::nvme
