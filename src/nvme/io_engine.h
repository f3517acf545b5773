// The asynchronous I/O engine that moves tensors between NVMe and pinned host
// memory. io_uring (liburing) by default; a pread/pwrite thread pool with the
// same API when io_uring cannot be set up (old kernel, seccomp, EPERM) or is
// disabled with ZINF_NO_IO_URING=1 — the reason is logged once.
//
// A request is one or more (file, offset, buffer, length) operations. Each is
// split into blocks of `block_size` that are spread over `rings` worker
// threads (intra-op parallelism); each ring keeps up to `queue_depth` blocks
// in flight and submits them in batches. Short reads and writes are
// resubmitted for the remainder. A request completes — its waiters wake and
// its callback runs — only when every block has finished; on failure its
// status names op, path, offset, length and errno of the first failing block
// (and the engine does not report any byte it did not transfer).
//
// Files opened O_DIRECT need offset, length and buffer aligned to 4 KiB; a
// violation is kInvalidArgument saying which, never a silent fallback.
//
// Buffers may be registered once (RegisterBuffer) and reused: I/O inside a
// registered buffer uses io_uring's fixed-buffer ops. Thread-safety: every
// method may be called from any thread. Callbacks run on an I/O thread before
// the request's waiters wake (when Wait() returns, the callback has run):
// keep them short and never wait on a request from one.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nvme/file.h"
#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::nvme {

enum class IoBackend { kAuto, kUring, kPosix };

struct IoEngineOptions {
  IoBackend backend = IoBackend::kAuto;
  uint64_t block_size = 1 << 20;  // bytes per block; a multiple of 4 KiB
  unsigned queue_depth = 32;      // blocks in flight per ring
  unsigned rings = 1;             // worker threads, one io_uring each
  bool fixed_buffers = true;      // use registered buffers for I/O inside them
  bool fixed_files = true;        // register files opened through IoEngine::Open
  bool sqpoll = false;            // kernel SQ polling thread per ring (costs a core each)
  unsigned sqpoll_idle_ms = 50;
  bool single_submit = false;  // one io_uring_submit per block instead of one per batch (the
                               // kernel then neither plugs nor merges neighbouring blocks)
};

// The engine settings of a config: aio.block_size, aio.queue_depth,
// aio.single_submit, aio.io_backend ("posix" forces the thread pool), rings =
// zinf.aio.rings or else aio.intra_op_parallelism, zinf.aio.fixed_buffers and
// zinf.aio.sqpoll. (aio.overlap_events needs no setting: reaping and
// submission always overlap here.)
IoEngineOptions IoEngineOptionsFromConfig(const Config& config);

// One operation of a request.
struct IoOp {
  IoKind kind = IoKind::kRead;
  std::shared_ptr<File> file;
  uint64_t offset = 0;
  void* buffer = nullptr;
  uint64_t length = 0;
};

using IoCallback = std::function<void(const Status&)>;
// Runs once when all blocks are done, before waiters wake; may replace the
// status (the swap store verifies checksums here).
using IoFinalizer = std::function<Status(Status)>;

namespace internal {
struct RequestState;
}

// A handle to a submitted request. Copyable; an empty handle is invalid.
class IoRequest {
 public:
  IoRequest() = default;
  bool valid() const { return state_ != nullptr; }
  bool Done() const;    // non-blocking
  Status Wait() const;  // blocks until every block of the request finished
  uint64_t bytes_transferred() const;

 private:
  friend class IoEngine;
  explicit IoRequest(std::shared_ptr<internal::RequestState> s) : state_(std::move(s)) {}
  std::shared_ptr<internal::RequestState> state_;
};

struct IoEngineStats {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t blocks = 0;           // block attempts issued
  uint64_t short_resubmits = 0;  // short transfers resubmitted for the remainder
  uint64_t retries = 0;          // EAGAIN/EINTR retries
  uint64_t failed_requests = 0;
  // io_uring: submissions that carried blocks (one per block with
  // single_submit; a batch of up to queue_depth otherwise, which the kernel
  // plugs and may merge into larger device requests). 0 on posix.
  uint64_t submit_batches = 0;
  // Time with at least one request in flight (the engine's utilization,
  // as fio counts a disk's), over the busy stretches that have ended.
  double busy_seconds = 0;
};

// A stretch of time with at least one request in flight.
struct IoBusyInterval {
  std::chrono::steady_clock::time_point begin, end;
};

class IoEngine {
 public:
  static Result<std::unique_ptr<IoEngine>> Create(const IoEngineOptions& options);
  ~IoEngine();  // waits for every request in flight
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  const IoEngineOptions& options() const;
  // The busy stretches that ended since the last call, oldest first (the
  // newest 4096 are kept between calls).
  std::vector<IoBusyInterval> TakeBusyIntervals();
  // "io_uring" or "posix".
  std::string backend_name() const;
  // Why io_uring is not used ("" when it is).
  const std::string& fallback_reason() const;

  // Opens a file and, with fixed_files, registers it with every ring. The
  // file may be used with other engines too (then unregistered there).
  Result<std::shared_ptr<File>> Open(const std::string& path, const FileOptions& options);

  // Registers [addr, addr+bytes) for fixed-buffer I/O: 4 KiB aligned; a
  // buffer over 1 GiB (io_uring's limit per slot) takes one slot per GiB, and
  // an I/O block that crosses a GiB boundary of it runs as a plain read or
  // write. No-op success on the posix backend or with fixed_buffers off.
  // Unregister (by the address registered) only with no I/O in flight on it.
  Status RegisterBuffer(void* addr, uint64_t bytes);
  Status UnregisterBuffer(void* addr);

  // `ring` >= 0 sends every block of the request to that ring (like one fio
  // job per ring); -1 spreads blocks over all rings.
  IoRequest Submit(std::vector<IoOp> ops, IoCallback callback = nullptr, IoFinalizer finalizer = nullptr,
                   int ring = -1);
  unsigned num_rings() const;
  IoRequest Read(std::shared_ptr<File> file, uint64_t offset, void* buffer, uint64_t length,
                 IoCallback callback = nullptr);
  IoRequest Write(std::shared_ptr<File> file, uint64_t offset, const void* buffer, uint64_t length,
                  IoCallback callback = nullptr);
  Status ReadSync(std::shared_ptr<File> file, uint64_t offset, void* buffer, uint64_t length);
  Status WriteSync(std::shared_ptr<File> file, uint64_t offset, const void* buffer, uint64_t length);

  IoEngineStats stats() const;
  // Whether [addr, addr+bytes) lies inside a registered buffer (I/O there uses fixed-buffer ops).
  bool IsRegistered(const void* addr, uint64_t bytes) const;

  class Impl;

 private:
  explicit IoEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

namespace testing {
// Fault injection for tests: on whichever io_uring ring of this process next
// submits blocks, the submission after `after` successful ones fails with
// -err before it reaches the kernel, as a ring that broke would. That ring
// then takes no more requests (see the io_uring worker in io_engine.cc).
void FailUringSubmit(int err, int after = 0);
}  // namespace testing

}  // namespace zinf::nvme
