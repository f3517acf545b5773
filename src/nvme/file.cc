// File: open with the right flags and explain the failures users hit
// (O_DIRECT unsupported, a directory, permissions).
#include "nvme/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace zinf::nvme {
namespace {
std::atomic<uint64_t> next_file_id{1};
int RealOpen(const char* path, int flags, unsigned mode) { return ::open(path, flags, static_cast<mode_t>(mode)); }
internal::OpenFunction open_function = &RealOpen;
}  // namespace

void internal::SetOpenFunctionForTesting(OpenFunction fn) { open_function = fn ? fn : &RealOpen; }

std::string DescribeIoFailure(IoKind kind, const std::string& path, uint64_t offset, uint64_t len, int err) {
  return std::string(kind == IoKind::kRead ? "pread " : "pwrite ") + path + " offset=" + std::to_string(offset) +
         " len=" + std::to_string(len) + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
}

File::File(std::string path, int fd, bool direct)
    : path_(std::move(path)), fd_(fd), direct_(direct), id_(next_file_id.fetch_add(1)) {}

File::~File() {
  if (fixed_release_) fixed_release_();
  if (fd_ >= 0) ::close(fd_);
}

void File::SetFixedRegistration(const void* owner, int slot, std::function<void()> release) {
  fixed_owner_ = owner;
  fixed_slot_ = slot;
  fixed_release_ = std::move(release);
}

Result<std::shared_ptr<File>> File::Open(const std::string& path, const FileOptions& options) {
  int flags = O_CLOEXEC | (options.writable ? O_RDWR : O_RDONLY);
  if (options.create) flags |= O_CREAT;
  if (options.truncate) flags |= O_TRUNC;
  if (options.direct) flags |= O_DIRECT;
  int fd = open_function(path.c_str(), flags, 0644);
  if (fd < 0) {
    int err = errno;
    std::string what = "open " + path + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")";
    if (err == EINVAL && options.direct) {
      what +=
          "; this filesystem does not support O_DIRECT (tmpfs, some overlay and network filesystems): "
          "put the file on a local disk, or use buffered I/O";
    } else if (err == EISDIR) {
      what += "; a file path is needed, not a directory";
    }
    if (err == EINVAL && options.direct) return InvalidArgument(what);
    return err == ENOENT ? NotFound(what) : IoError(what);
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return InvalidArgument("open " + path + ": is a directory; a file path is needed");
  }
  return std::shared_ptr<File>(new File(path, fd, options.direct));
}

Result<uint64_t> File::Size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0)
    return IoError("fstat " + path_ + ": " + std::strerror(errno) + " (errno " + std::to_string(errno) + ")");
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace zinf::nvme
