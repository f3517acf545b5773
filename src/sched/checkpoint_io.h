// File plumbing of checkpoints: whole writes and reads with errors that name
// path, offset, length and errno, fsync of files and directories, atomic
// small-file replacement, and the XXH3 checksum every tensor slice carries.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nvme/io_engine.h"
#include "sched/checkpoint_tables.h"
#include "zinf/status.h"

namespace zinf::sched::ckpt {

// A file opened for writing (created or truncated) or reading; closed on
// destruction.
class File {
 public:
  static Result<File> Create(const std::string& path);
  static Result<File> OpenRead(const std::string& path);
  File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }
  File& operator=(File&&) = delete;
  ~File();
  // All `bytes` at `offset`, or kIoError naming path, offset, length, errno.
  Status Write(const void* data, uint64_t bytes, uint64_t offset);
  // All `bytes` at `offset`; a short read (truncated file) is kDataLoss.
  Status Read(void* data, uint64_t bytes, uint64_t offset) const;
  Status Sync();
  const std::string& path() const { return path_; }

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
};

Status FsyncDir(const std::string& dir);
// Writes `text` to `path` via `path`.tmp, fsync, rename, fsync of the directory.
Status WriteFileAtomic(const std::string& path, const std::string& text);
Result<std::string> ReadSmallFile(const std::string& path);
uint64_t Checksum(const void* data, uint64_t bytes);  // XXH3-64

// Tensor data moves through the asynchronous I/O engine. Slices start at
// 4 KiB-aligned offsets and their last block is padded to 4 KiB, so the
// files can be read and written with O_DIRECT.
constexpr uint64_t kSliceAlign = 4096;

// How the engine opens its data files (checkpoint shards and swap files).
// Tests replace it to inject faults (nvme::FaultInjectingFile); nullptr
// restores IoEngine::Open. Not for use while an engine is doing I/O.
using FileOpener =
    std::function<Result<std::shared_ptr<nvme::File>>(nvme::IoEngine&, const std::string&, const nvme::FileOptions&)>;
void SetFileOpenerForTesting(FileOpener opener);
// Opens through the test opener when one is set, else through `io`.
Result<std::shared_ptr<nvme::File>> OpenWithHook(nvme::IoEngine& io, const std::string& path,
                                                 const nvme::FileOptions& options);
// A checkpoint data file: created (truncated) for writing or opened for
// reading, with O_DIRECT, or page-cache I/O on a filesystem without O_DIRECT
// (tmpfs; said once at info level). A missing file to read is kDataLoss.
Result<std::shared_ptr<nvme::File>> OpenDataFile(nvme::IoEngine& io, const std::string& path, bool write);

// Streams slices into one file: bytes are copied into `depth` staging
// buffers of `chunk_bytes` that are written asynchronously while the next
// ones fill, so the disk always has work queued. Each slice's XXH3 is taken
// as it streams. Not thread-safe; one writer per file.
class SliceWriter {
 public:
  static Result<std::unique_ptr<SliceWriter>> Create(nvme::IoEngine& io, std::shared_ptr<nvme::File> file,
                                                     uint64_t chunk_bytes = 16ull << 20, int depth = 4);
  ~SliceWriter();  // waits for writes in flight
  // Starts a slice at the next aligned offset and returns that offset.
  uint64_t BeginSlice();
  Status Append(const void* data, uint64_t bytes);
  // Ends the slice (its tail padded to 4 KiB with zeros); returns its XXH3.
  Result<uint64_t> EndSlice();
  // Waits for every write, then fsyncs the file.
  Status Finish();
  uint64_t bytes_written() const { return submitted_; }

 private:
  SliceWriter(nvme::IoEngine& io, std::shared_ptr<nvme::File> file, uint64_t chunk_bytes, int depth);
  Status Flush(bool slice_end);
  nvme::IoEngine& io_;
  std::shared_ptr<nvme::File> file_;
  const uint64_t chunk_;
  std::vector<void*> bufs_;
  std::vector<nvme::IoRequest> inflight_;
  int cur_ = 0;
  uint64_t fill_ = 0;        // bytes in the current buffer
  uint64_t buf_offset_ = 0;  // file offset of the current buffer's first byte
  uint64_t submitted_ = 0;
  void* hash_ = nullptr;  // XXH3 state of the slice being written
  Status error_;
};

// Reads slices in chunks with read-ahead and verifies each one's XXH3.
class SliceReader {
 public:
  static Result<std::unique_ptr<SliceReader>> Create(nvme::IoEngine& io, uint64_t chunk_bytes = 16ull << 20,
                                                     int depth = 8);
  ~SliceReader();
  // Passes [offset, offset + bytes) of `file` to `sink` chunk by chunk, in
  // order (data, position in the slice, length), then checks the slice's
  // XXH3 against `xxh3`: a mismatch is kDataLoss naming `what`, the path
  // and the offset. The sink sees bytes before they are verified: on an
  // error, discard what it stored.
  Status Read(const std::shared_ptr<nvme::File>& file, uint64_t offset, uint64_t bytes, uint64_t xxh3,
              const std::string& what, const std::function<void(const void*, uint64_t, uint64_t)>& sink);
  // Several slices, their chunks read ahead across slice boundaries (the
  // disk stays busy from one slice to the next). Stops at the first error.
  struct Job {
    std::shared_ptr<nvme::File> file;
    uint64_t offset = 0, bytes = 0, xxh3 = 0;
    std::string what;
    std::function<void(const void*, uint64_t, uint64_t)> sink;
  };
  Status ReadAll(std::vector<Job>& jobs);
  uint64_t bytes_read() const { return read_; }

 private:
  SliceReader(nvme::IoEngine& io, uint64_t chunk_bytes, int depth);
  nvme::IoEngine& io_;
  const uint64_t chunk_;
  std::vector<void*> bufs_;
  uint64_t read_ = 0;
};

// A saved checkpoint, read slice by slice. Format: step-N/manifest.json
// (format, world size, stage, counters, loss-scale state, units with their
// tensors' names, shapes and offsets, the config, the client's JSON) and, per
// saving rank R, rank-R.json (its slices: unit, kind, element range, file
// offset, XXH3) with the data in rank-R.bin.
class CheckpointReader {
 public:
  static constexpr int kFormat = kCheckpointFormat;
  static constexpr const char* const* kKindNames = kStateKindNames;

  // `path` is a step-N directory, or a directory whose `latest` names one.
  // kNotFound when neither; kDataLoss for a damaged manifest or table (see
  // checkpoint_tables.h), a missing data file, a slice that ends beyond its
  // data file, or a unit of the manifest whose master slices do not hold
  // every one of its elements (so a unit's size is bounded by the files).
  static Result<std::unique_ptr<CheckpointReader>> Open(nvme::IoEngine& io, const std::string& path);
  const std::string& dir() const { return dir_; }
  const nlohmann::json& manifest() const { return tables_.manifest; }
  // The manifest's units, checked: a name and an element count each.
  const std::vector<ManifestUnit>& units() const { return tables_.units; }

  // Elements [first, first + count) of unit `unit` (of `unit_elems`
  // elements) for state `kind` (0 master, 1 m, 2 v) into `dst`, from every
  // slice overlapping them, each slice read and verified in full. kDataLoss
  // for a checksum mismatch, a truncated file, or elements no slice covers
  // (a slice listed twice covers its elements once).
  Status ReadRange(const std::string& unit, int kind, int64_t unit_elems, int64_t first, int64_t count, float* dst);
  // Several ranges at once, read ahead across slices.
  struct Range {
    std::string unit;
    int kind = 0;
    int64_t unit_elems = 0, first = 0, count = 0;
    float* dst = nullptr;
  };
  Status ReadRanges(const std::vector<Range>& ranges);
  uint64_t bytes_read() const { return reader_->bytes_read(); }

 private:
  CheckpointReader(nvme::IoEngine& io) : io_(io) {}
  Status CheckDataFiles() const;
  nvme::IoEngine& io_;
  std::string dir_;
  CheckpointTables tables_;
  std::vector<std::string> paths_;  // the data files, per tables_.files
  std::vector<std::shared_ptr<nvme::File>> files_;
  std::unique_ptr<SliceReader> reader_;
};

}  // namespace zinf::sched::ckpt
