// Files for the data layer: a read-only memory map (MappedFile) and a
// sequential writer (FileWriter) that resubmits short writes, fsyncs, and
// publishes its file atomically by renaming a temporary into place. Every
// error names the operation, the path, the offset, the length and errno, as
// STYLE.md asks. Thread-safety: a MappedFile's bytes may be read from any
// number of threads; a FileWriter serves one caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "zinf/status.h"

namespace zinf::data {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps the whole file read-only. An empty file maps to an empty span.
  static Result<MappedFile> Open(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_bytes_}; }
  const char* chars() const { return static_cast<const char*>(data_); }
  uint64_t size_bytes() const { return size_bytes_; }
  int64_t mtime_ns() const { return mtime_ns_; }

 private:
  void Reset();
  std::string path_;
  void* data_ = nullptr;
  uint64_t size_bytes_ = 0;
  int64_t mtime_ns_ = 0;
};

// Writes `final_path` through "<final_path>.tmp.<pid>": Commit() fsyncs, renames
// the temporary into place and fsyncs the directory; destroying an
// uncommitted writer removes the temporary, so a reader never sees half a file.
class FileWriter {
 public:
  FileWriter() = default;
  static Result<FileWriter> Create(const std::string& final_path);
  ~FileWriter();
  FileWriter(FileWriter&& other) noexcept;
  FileWriter& operator=(FileWriter&& other) noexcept;
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  // Appends all of `bytes` (short writes are resubmitted).
  Status Write(std::span<const std::byte> bytes);
  Status Write(const void* data, size_t num_bytes) {
    return Write(std::span<const std::byte>(static_cast<const std::byte*>(data), num_bytes));
  }
  // Overwrites bytes already written, at `offset_bytes` from the start.
  Status WriteAt(uint64_t offset_bytes, const void* data, size_t num_bytes);
  Status Commit();

  uint64_t offset_bytes() const { return offset_bytes_; }
  const std::string& path() const { return final_path_; }

 private:
  void Abandon();
  std::string final_path_, tmp_path_;
  int fd_ = -1;
  uint64_t offset_bytes_ = 0;
};

// "op path offset=O len=L: strerror (errno E)".
Status ErrnoStatus(std::string_view op, const std::string& path, uint64_t offset_bytes, uint64_t len_bytes, int err);

}  // namespace zinf::data
