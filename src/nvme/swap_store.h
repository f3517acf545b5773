// The swap store: where tensors live on NVMe. A tensor id maps to extents in
// swap files, one file per directory; with several directories (nvme_path as
// a list) consecutive extents alternate between them, so two drives add
// their bandwidth without RAID-0.
//
// Space is reserved up front (fallocate); not enough space is an error before
// anything is written, stating bytes needed and available per path. A tensor
// can be read only after it was written in full: an unwritten (fallocated)
// extent reads back as zeros at memory speed and would fake every bandwidth
// figure, and a tensor whose last write failed is refused as kDataLoss.
// Optional XXH3 checksums per extent are verified on read (a mismatch is
// kDataLoss naming tensor, path and offset). Swap files are removed on clean
// shutdown; files left by a crashed run are found and reported at Create,
// never reused.
//
// Buffers must be 4 KiB aligned and hold PaddedBytes(id) bytes. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "nvme/io_engine.h"

namespace zinf::nvme {

using TensorId = uint64_t;

struct SwapStoreOptions {
  std::vector<std::string> dirs;    // one or more directories
  uint64_t capacity_bytes = 0;      // reserved up front, split evenly across dirs
  uint64_t extent_bytes = 1 << 20;  // striping unit; a multiple of 4096
  bool checksums = false;           // XXH3 per extent
  bool direct = true;               // O_DIRECT
  // How swap files are opened; default IoEngine::Open. Tests pass a factory
  // of FaultInjectingFiles here.
  std::function<Result<std::shared_ptr<File>>(const std::string&, const FileOptions&)> open_file;
};

struct StaleSwapFile {
  std::string path;
  uint64_t bytes;
  int pid;  // the process that created it
};

class SwapStore {
 public:
  static Result<std::unique_ptr<SwapStore>> Create(IoEngine& engine, const SwapStoreOptions& options);
  ~SwapStore();  // removes the swap files; requests must have completed
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // Raises the space reserved to `capacity_bytes` in all (split evenly
  // across the directories, whole extents), checking free space first, for
  // a store whose tensors are known one by one; never shrinks.
  Status Reserve(uint64_t capacity_bytes);
  // Reserves extents for a tensor of `bytes` (kept at 4 KiB granularity).
  Status Allocate(TensorId id, uint64_t bytes);
  // The tensor's size rounded up to 4 KiB: what a buffer must hold.
  Result<uint64_t> PaddedBytes(TensorId id) const;

  // Writes the whole tensor from `buffer`; afterwards it can be read.
  IoRequest Write(TensorId id, const void* buffer, IoCallback callback = nullptr);
  // Reads the whole tensor into `buffer`; fails unless written in full.
  IoRequest Read(TensorId id, void* buffer, IoCallback callback = nullptr);

  // Bytes needed per directory for `capacity` bytes of tensors.
  uint64_t bytes_reserved() const { return reserved_per_dir_ * files_.size(); }
  uint64_t bytes_allocated() const;
  std::vector<std::string> file_paths() const;
  // Swap files from runs that did not shut down cleanly, found at Create.
  const std::vector<StaleSwapFile>& stale_files() const { return stale_; }

  // Scans `dirs` for swap files whose creating process is gone.
  static std::vector<StaleSwapFile> FindStale(const std::vector<std::string>& dirs);

 private:
  struct Extent {
    uint32_t file;
    uint64_t offset;
    uint64_t bytes;
  };
  enum class State { kEmpty, kWriting, kWritten, kFailed };
  struct Tensor {
    uint64_t bytes = 0;
    uint64_t padded = 0;
    std::vector<Extent> extents;
    std::vector<uint64_t> checksums;  // per extent, of the last completed write
    State state = State::kEmpty;
    std::string failure;  // why kFailed
  };

  SwapStore(IoEngine& engine, const SwapStoreOptions& options) : engine_(engine), options_(options) {}
  IoRequest Failed(Status st, IoCallback callback);
  uint64_t PerDir(uint64_t capacity_bytes) const;
  Status CheckSpace(uint64_t per_dir) const;

  IoEngine& engine_;
  SwapStoreOptions options_;
  std::vector<std::shared_ptr<File>> files_;
  std::vector<std::string> paths_;
  uint64_t reserved_per_dir_ = 0;
  std::vector<StaleSwapFile> stale_;

  mutable std::mutex mu_;
  std::vector<uint64_t> next_offset_;  // bump allocator per file
  uint32_t next_first_file_ = 0;
  std::unordered_map<TensorId, Tensor> tensors_;
};

}  // namespace zinf::nvme
