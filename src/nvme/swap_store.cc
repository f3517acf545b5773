// SwapStore: file layout, space reservation, the written/failed state of each
// tensor, and checksum verification in the read request's finalizer.
#include "nvme/swap_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <random>

#include "common/logging.h"
#include "common/units.h"

namespace zinf::nvme {
namespace {

constexpr const char* kPrefix = "zinf-swap-";
constexpr const char* kSuffix = ".swap";

uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

std::string Errno(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

// "zinf-swap-<pid>-<random>.swap" -> pid, or -1.
int PidOf(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() <= std::strlen(kPrefix) + std::strlen(kSuffix) ||
      name.compare(name.size() - std::strlen(kSuffix), std::string::npos, kSuffix) != 0)
    return -1;
  size_t start = std::strlen(kPrefix);
  size_t dash = name.find('-', start);
  if (dash == std::string::npos || dash == start) return -1;
  int pid = 0;
  for (size_t i = start; i < dash; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid;
}

bool ProcessAlive(int pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

std::vector<StaleSwapFile> SwapStore::FindStale(const std::vector<std::string>& dirs) {
  std::vector<StaleSwapFile> stale;
  for (const auto& dir : dirs) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) continue;
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      int pid = PidOf(name);
      if (pid <= 0 || pid == ::getpid() || ProcessAlive(pid)) continue;
      std::string path = dir + "/" + name;
      struct stat st {};
      uint64_t bytes = ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
      stale.push_back({path, bytes, pid});
    }
    ::closedir(d);
  }
  return stale;
}

Result<std::unique_ptr<SwapStore>> SwapStore::Create(IoEngine& engine, const SwapStoreOptions& options) {
  if (options.dirs.empty()) return InvalidArgument("swap store: no directory given");
  if (options.extent_bytes == 0 || options.extent_bytes % kDirectAlignment)
    return InvalidArgument("swap store: extent size " + std::to_string(options.extent_bytes) +
                           " is not a positive multiple of 4096");
  // Check every path before touching any: directories exist, are writable,
  // and have the space (Reserve's check, before any file is created).
  for (const auto& dir : options.dirs) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0)
      return (errno == ENOENT ? NotFound("") : IoError("")).WithContext("swap directory " + dir + ": " + Errno(errno));
    if (!S_ISDIR(st.st_mode)) return InvalidArgument("swap directory " + dir + " is not a directory");
    if (::access(dir.c_str(), W_OK) != 0) return IoError("swap directory " + dir + " is not writable: " + Errno(errno));
  }
  std::unique_ptr<SwapStore> store(new SwapStore(engine, options));
  ZINF_RETURN_IF_ERROR(store->CheckSpace(store->PerDir(options.capacity_bytes)));
  store->stale_ = FindStale(options.dirs);
  for (const auto& s : store->stale_)
    WarnOnce("swap file " + s.path + " (" + FormatBytes(s.bytes) + ") was left by process " + std::to_string(s.pid) +
             ", which did not shut down cleanly; it is not reused — delete it to free the space");

  std::random_device rd;
  uint64_t tag = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char tag_hex[17];
  std::snprintf(tag_hex, sizeof(tag_hex), "%016llx", static_cast<unsigned long long>(tag));
  for (const auto& dir : options.dirs) {
    std::string path = dir + "/" + kPrefix + std::to_string(::getpid()) + "-" + tag_hex + "-" +
                       std::to_string(store->files_.size()) + kSuffix;
    FileOptions fo;
    fo.direct = options.direct;
    fo.create = true;
    fo.truncate = true;
    auto file = options.open_file ? options.open_file(path, fo) : engine.Open(path, fo);
    if (!file.ok()) return std::move(file).status().WithContext("swap store");
    store->paths_.push_back(path);  // from here on the destructor removes it
    store->files_.push_back(*file);
  }
  store->next_offset_.assign(store->files_.size(), 0);
  ZINF_RETURN_IF_ERROR(store->Reserve(options.capacity_bytes));
  return store;
}

// Each directory gets an equal share, in whole extents.
uint64_t SwapStore::PerDir(uint64_t capacity_bytes) const {
  const uint64_t ndirs = options_.dirs.size();
  return RoundUp((capacity_bytes + ndirs - 1) / ndirs, options_.extent_bytes);
}

// Whether the filesystems have room to grow every directory's file to
// `per_dir` bytes (directories on one filesystem add up).
Status SwapStore::CheckSpace(uint64_t per_dir) const {
  if (per_dir <= reserved_per_dir_) return Status::Ok();
  const uint64_t more = per_dir - reserved_per_dir_;
  std::map<dev_t, std::pair<uint64_t, uint64_t>> per_fs;  // dev -> (needed, available)
  std::vector<dev_t> devs;
  for (const auto& dir : options_.dirs) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return IoError("swap directory " + dir + ": " + Errno(errno));
    struct statvfs vfs {};
    if (::statvfs(dir.c_str(), &vfs) != 0) return IoError("statvfs " + dir + ": " + Errno(errno));
    auto& fs = per_fs[st.st_dev];
    fs.first += more;
    fs.second = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    devs.push_back(st.st_dev);
  }
  bool short_of_space = false;
  for (const auto& [dev, fs] : per_fs) short_of_space |= fs.first > fs.second;
  if (!short_of_space) return Status::Ok();
  std::string msg = "not enough space for the swap store (" + FormatBytes(per_dir * options_.dirs.size()) + " in all" +
                    (reserved_per_dir_ > 0 ? ", " + FormatBytes(more * options_.dirs.size()) + " more" : "") + "):";
  for (size_t i = 0; i < options_.dirs.size(); ++i) {
    const auto& fs = per_fs[devs[i]];
    msg += " " + options_.dirs[i] + " needs " + FormatBytes(more) + (reserved_per_dir_ > 0 ? " more, " : ", ") +
           FormatBytes(fs.second) + " available" +
           (fs.first > more ? " (shared with other paths on this filesystem)" : "") + ";";
  }
  msg.pop_back();
  return IoError(msg);
}

Status SwapStore::Reserve(uint64_t capacity_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t per_dir = PerDir(capacity_bytes);
  if (per_dir <= reserved_per_dir_) return Status::Ok();
  ZINF_RETURN_IF_ERROR(CheckSpace(per_dir));
  const uint64_t from = reserved_per_dir_, len = per_dir - from;
  for (size_t i = 0; i < files_.size(); ++i) {
    const std::string& path = paths_[i];
    const int fd = files_[i]->fd();
    if (::fallocate(fd, 0, static_cast<off_t>(from), static_cast<off_t>(len)) == 0) continue;
    const int err = errno;
    const std::string what = " " + path + " offset=" + std::to_string(from) + " len=" + std::to_string(len) + ": ";
    if (err != EOPNOTSUPP) {
      return IoError("fallocate" + what + Errno(err) +
                     (err == ENOSPC ? "; free space on this filesystem or lower the swap capacity" : ""));
    }
    const int rc = ::posix_fallocate(fd, static_cast<off_t>(from), static_cast<off_t>(len));
    if (rc != 0) return IoError("posix_fallocate" + what + Errno(rc));
  }
  reserved_per_dir_ = per_dir;
  return Status::Ok();
}

SwapStore::~SwapStore() {
  files_.clear();
  for (const auto& p : paths_) ::unlink(p.c_str());
}

Status SwapStore::Allocate(TensorId id, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (tensors_.count(id)) return AlreadyExists("swap store: tensor " + std::to_string(id) + " is already allocated");
  Tensor t;
  t.bytes = bytes;
  t.padded = RoundUp(bytes, kDirectAlignment);
  // Place extents round-robin over the files, starting where the last tensor
  // stopped so small tensors spread too. Check space first, then commit.
  const uint32_t nfiles = static_cast<uint32_t>(files_.size());
  std::vector<uint64_t> next = next_offset_;
  uint32_t f = next_first_file_;
  for (uint64_t off = 0; off < t.padded; off += options_.extent_bytes) {
    uint64_t len = std::min(options_.extent_bytes, t.padded - off);
    if (next[f] + len > reserved_per_dir_)
      return OutOfMemory("swap store full: tensor " + std::to_string(id) + " needs " + FormatBytes(t.padded) + ", " +
                         FormatBytes(bytes_reserved() - bytes_allocated()) + " of " + FormatBytes(bytes_reserved()) +
                         " reserved is left (" + paths_[f] + " is full)");
    t.extents.push_back({f, next[f], len});
    next[f] += len;
    f = (f + 1) % nfiles;
  }
  next_offset_ = std::move(next);
  next_first_file_ = f;
  t.checksums.assign(t.extents.size(), 0);
  tensors_.emplace(id, std::move(t));
  return Status::Ok();
}

Result<uint64_t> SwapStore::PaddedBytes(TensorId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tensors_.find(id);
  if (it == tensors_.end()) return NotFound("swap store: no tensor " + std::to_string(id));
  return it->second.padded;
}

uint64_t SwapStore::bytes_allocated() const {
  uint64_t total = 0;
  for (uint64_t n : next_offset_) total += n;
  return total;
}

std::vector<std::string> SwapStore::file_paths() const { return paths_; }

IoRequest SwapStore::Failed(Status st, IoCallback callback) {
  // A request that fails without I/O, through the engine so callers see one
  // kind of handle and the callback still runs.
  return engine_.Submit({}, std::move(callback), [st](Status) { return st; });
}

IoRequest SwapStore::Write(TensorId id, const void* buffer, IoCallback callback) {
  std::vector<IoOp> ops;
  std::vector<uint64_t> sums;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tensors_.find(id);
    if (it == tensors_.end())
      return Failed(NotFound("swap store: write of unallocated tensor " + std::to_string(id)), std::move(callback));
    Tensor& t = it->second;
    const char* p = static_cast<const char*>(buffer);
    uint64_t off = 0;
    for (const Extent& e : t.extents) {
      ops.push_back({IoKind::kWrite, files_[e.file], e.offset, const_cast<char*>(p + off), e.bytes});
      if (options_.checksums) sums.push_back(XXH3_64bits(p + off, e.bytes));
      off += e.bytes;
    }
    t.state = State::kWriting;
  }
  auto finalize = [this, id, sums = std::move(sums)](Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    Tensor& t = tensors_.at(id);
    if (st.ok()) {
      t.state = State::kWritten;
      if (!sums.empty()) t.checksums = sums;
      return st;
    }
    t.state = State::kFailed;
    t.failure = st.message();
    return std::move(st).WithContext("swap out tensor " + std::to_string(id));
  };
  return engine_.Submit(std::move(ops), std::move(callback), std::move(finalize));
}

IoRequest SwapStore::Read(TensorId id, void* buffer, IoCallback callback) {
  std::vector<IoOp> ops;
  std::vector<Extent> extents;
  std::vector<uint64_t> sums;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tensors_.find(id);
    if (it == tensors_.end())
      return Failed(NotFound("swap store: read of unallocated tensor " + std::to_string(id)), std::move(callback));
    const Tensor& t = it->second;
    switch (t.state) {
      case State::kWritten:
        break;
      case State::kEmpty:
      case State::kWriting:
        return Failed(FailedPrecondition("swap store: tensor " + std::to_string(id) +
                                         " is read before it was written in full (its extents hold no data yet)"),
                      std::move(callback));
      case State::kFailed:
        return Failed(DataLoss("swap store: tensor " + std::to_string(id) +
                               " is incomplete on disk: its last write failed (" + t.failure + ")"),
                      std::move(callback));
    }
    char* p = static_cast<char*>(buffer);
    uint64_t off = 0;
    for (const Extent& e : t.extents) {
      ops.push_back({IoKind::kRead, files_[e.file], e.offset, p + off, e.bytes});
      off += e.bytes;
    }
    extents = t.extents;
    if (options_.checksums) sums = t.checksums;
  }
  auto finalize = [this, id, buffer, extents = std::move(extents), sums = std::move(sums)](Status st) {
    if (!st.ok()) return std::move(st).WithContext("swap in tensor " + std::to_string(id));
    const char* p = static_cast<const char*>(buffer);
    uint64_t off = 0;
    for (size_t i = 0; i < sums.size(); ++i) {
      const Extent& e = extents[i];
      uint64_t got = XXH3_64bits(p + off, e.bytes);
      if (got != sums[i]) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "stored %016llx, read %016llx", static_cast<unsigned long long>(sums[i]),
                      static_cast<unsigned long long>(got));
        return DataLoss("swap in tensor " + std::to_string(id) + ": checksum mismatch in " + paths_[e.file] +
                        " offset=" + std::to_string(e.offset) + " len=" + std::to_string(e.bytes) + " (" + buf + ")");
      }
      off += e.bytes;
    }
    return st;
  };
  return engine_.Submit(std::move(ops), std::move(callback), std::move(finalize));
}

}  // namespace zinf::nvme
