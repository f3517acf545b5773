// File plumbing of checkpoints: whole writes and reads with errors that name
// path, offset, length and errno, fsync of files and directories, atomic
// small-file replacement, and the XXH3 checksum every tensor slice carries.
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>

#include "zinf/status.h"

namespace zinf::ckpt {

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

}  // namespace zinf::ckpt
