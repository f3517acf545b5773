#include "data/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace zinf::data {

Status ErrnoStatus(std::string_view op, const std::string& path, uint64_t offset_bytes, uint64_t len_bytes, int err) {
  std::string msg = std::string(op) + " " + path + " offset=" + std::to_string(offset_bytes) +
                    " len=" + std::to_string(len_bytes) + ": " + std::strerror(err) + " (errno " + std::to_string(err) +
                    ")";
  if (err == ENOENT) return NotFound(std::move(msg));
  return IoError(std::move(msg));
}

// ---- MappedFile ----------------------------------------------------------------

Result<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("open", path, 0, 0, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus("fstat", path, 0, 0, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is not a regular file");
  }
  MappedFile f;
  f.path_ = path;
  f.size_bytes_ = static_cast<uint64_t>(st.st_size);
  f.mtime_ns_ = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  if (f.size_bytes_ > 0) {
    void* p = ::mmap(nullptr, f.size_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus("mmap", path, 0, f.size_bytes_, err);
    }
    f.data_ = p;
  }
  ::close(fd);  // the mapping keeps the file
  return f;
}

MappedFile::~MappedFile() { Reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    mtime_ns_ = other.mtime_ns_;
  }
  return *this;
}

void MappedFile::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_bytes_);
  data_ = nullptr;
  size_bytes_ = 0;
}

// ---- FileWriter ----------------------------------------------------------------

Result<FileWriter> FileWriter::Create(const std::string& final_path) {
  FileWriter w;
  w.final_path_ = final_path;
  w.tmp_path_ = final_path + ".tmp." + std::to_string(::getpid());
  w.fd_ = ::open(w.tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) return ErrnoStatus("open", w.tmp_path_, 0, 0, errno);
  return w;
}

FileWriter::~FileWriter() { Abandon(); }

FileWriter::FileWriter(FileWriter&& other) noexcept { *this = std::move(other); }

FileWriter& FileWriter::operator=(FileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    final_path_ = std::move(other.final_path_);
    tmp_path_ = std::move(other.tmp_path_);
    fd_ = std::exchange(other.fd_, -1);
    offset_bytes_ = other.offset_bytes_;
  }
  return *this;
}

void FileWriter::Abandon() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
    fd_ = -1;
  }
}

Status FileWriter::Write(std::span<const std::byte> bytes) {
  ZINF_RETURN_IF_ERROR(WriteAt(offset_bytes_, bytes.data(), bytes.size()));
  offset_bytes_ += bytes.size();
  return Status::Ok();
}

Status FileWriter::WriteAt(uint64_t offset_bytes, const void* data, size_t num_bytes) {
  if (fd_ < 0) return FailedPrecondition("write " + final_path_ + ": the writer is closed");
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < num_bytes) {
    const ssize_t n = ::pwrite(fd_, p + done, num_bytes - done, static_cast<off_t>(offset_bytes + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("pwrite", tmp_path_, offset_bytes + done, num_bytes - done, errno);
    }
    if (n == 0) return ErrnoStatus("pwrite", tmp_path_, offset_bytes + done, num_bytes - done, EIO);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FileWriter::Commit() {
  if (fd_ < 0) return FailedPrecondition("commit " + final_path_ + ": the writer is closed");
  if (::fsync(fd_) != 0) return ErrnoStatus("fsync", tmp_path_, 0, offset_bytes_, errno);
  if (::close(fd_) != 0) {
    const int err = errno;
    fd_ = -1;
    ::unlink(tmp_path_.c_str());
    return ErrnoStatus("close", tmp_path_, 0, offset_bytes_, err);
  }
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), final_path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_path_.c_str());
    return ErrnoStatus("rename " + tmp_path_ + " to", final_path_, 0, 0, err);
  }
  // Make the rename itself durable.
  const size_t slash = final_path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : final_path_.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // best effort: some file systems refuse fsync on directories
    ::close(dfd);
  }
  return Status::Ok();
}

}  // namespace zinf::data
