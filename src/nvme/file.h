// A file opened for the I/O engine: path, descriptor, O_DIRECT or buffered.
//
// The virtual hooks are the seam for fault injection (leveldb's ErrorEnv
// idea): the engine consults them for every block it issues, on either
// backend, so a FaultInjectingFile exercises the engine's real resubmission
// and error paths. A plain File's hooks do nothing. Hooks are called from I/O
// threads and must be thread-safe; everything else is immutable after Open.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "zinf/status.h"

namespace zinf::nvme {

enum class IoKind { kRead, kWrite };

// O_DIRECT requires offset, length and buffer address aligned to this.
inline constexpr uint64_t kDirectAlignment = 4096;

struct FileOptions {
  bool direct = true;     // O_DIRECT; false = page-cache I/O
  bool writable = true;   // O_RDWR, else O_RDONLY
  bool create = false;    // O_CREAT (0644)
  bool truncate = false;  // O_TRUNC
};

class File {
 public:
  // Opens `path`. A filesystem without O_DIRECT support, a directory, or a
  // missing file is an error naming the path and errno.
  static Result<std::shared_ptr<File>> Open(const std::string& path, const FileOptions& options);
  virtual ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  bool direct() const { return direct_; }
  // Unique for the process lifetime (file descriptors are reused; ids are not).
  uint64_t id() const { return id_; }

  // Current size in bytes (fstat).
  Result<uint64_t> Size() const;

  // Set by the IoEngine that registered this file with its rings: the slot
  // to use with IOSQE_FIXED_FILE, and what to run before the fd is closed.
  void SetFixedRegistration(const void* owner, int slot, std::function<void()> release);
  int FixedSlotFor(const void* owner) const { return owner == fixed_owner_ ? fixed_slot_ : -1; }

  // --- fault hooks, consulted per block attempt -------------------------
  // An errno to fail this attempt with instead of issuing it; nullopt = issue.
  virtual std::optional<int> InjectError(IoKind kind, uint64_t offset, uint64_t len) { return std::nullopt; }
  // How many of `len` bytes this attempt may transfer (forces short ops); 0 < result <= len.
  virtual uint64_t LimitTransfer(IoKind kind, uint64_t offset, uint64_t len) { return len; }
  // Called as an attempt of `kind` completes: microseconds to hold the
  // completion before handling it.
  virtual uint32_t CompletionDelayMicros(IoKind kind) { return 0; }

 protected:
  File(std::string path, int fd, bool direct);

 private:
  std::string path_;
  int fd_;
  bool direct_;
  uint64_t id_;
  const void* fixed_owner_ = nullptr;
  int fixed_slot_ = -1;
  std::function<void()> fixed_release_;
};

namespace internal {
// Replaces open(2) for File::Open, so tests can simulate filesystems that
// refuse O_DIRECT; nullptr restores the real one. Not thread-safe.
using OpenFunction = int (*)(const char* path, int flags, unsigned mode);
void SetOpenFunctionForTesting(OpenFunction fn);
}  // namespace internal

// "pread /path offset=8388608 len=1048576: Input/output error (errno 5)"
std::string DescribeIoFailure(IoKind kind, const std::string& path, uint64_t offset, uint64_t len, int err);

}  // namespace zinf::nvme
