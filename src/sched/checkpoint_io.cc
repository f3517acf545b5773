#include "sched/checkpoint_io.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace zinf::ckpt {
namespace {

std::string Errno(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

std::string Where(const std::string& path, uint64_t offset, uint64_t bytes) {
  return path + " at offset " + std::to_string(offset) + ", " + std::to_string(bytes) + " bytes";
}

}  // namespace

Result<File> File::Create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("cannot create " + path + ": " + Errno(errno));
  return File(fd, path);
}

Result<File> File::OpenRead(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return DataLoss("checkpoint file missing: " + path);
    return IoError("cannot open " + path + ": " + Errno(e));
  }
  return File(fd, path);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

Status File::Write(const void* data, uint64_t bytes, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  uint64_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pwrite(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return IoError("write to " + Where(path_, offset + done, bytes - done) + ": " + Errno(n < 0 ? errno : EIO));
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status File::Read(void* data, uint64_t bytes, uint64_t offset) const {
  char* p = static_cast<char*>(data);
  uint64_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("read of " + Where(path_, offset + done, bytes - done) + ": " + Errno(errno));
    if (n == 0) return DataLoss("checkpoint file truncated: " + Where(path_, offset + done, bytes - done) + " missing");
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status File::Sync() {
  if (::fsync(fd_) != 0) return IoError("fsync of " + path_ + ": " + Errno(errno));
  return Status::Ok();
}

Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open directory " + dir + ": " + Errno(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) return IoError("fsync of directory " + dir + ": " + Errno(e));
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    ZINF_ASSIGN_OR_RETURN(File f, File::Create(tmp));
    ZINF_RETURN_IF_ERROR(f.Write(text.data(), text.size(), 0));
    ZINF_RETURN_IF_ERROR(f.Sync());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return IoError("rename " + tmp + " -> " + path + ": " + Errno(errno));
  return FsyncDir(std::filesystem::path(path).parent_path().string());
}

Result<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t Checksum(const void* data, uint64_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace zinf::ckpt
