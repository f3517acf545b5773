#include "sched/checkpoint_io.h"

#include "common/logging.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace zinf::sched::ckpt {
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
    if (n <= 0)
      return IoError("write to " + Where(path_, offset + done, bytes - done) + ": " + Errno(n < 0 ? errno : EIO));
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

namespace {

std::mutex opener_mu;
FileOpener& TestOpener() {
  static FileOpener opener;
  return opener;
}

uint64_t AlignUp(uint64_t x) { return (x + kSliceAlign - 1) / kSliceAlign * kSliceAlign; }

void* AllocAligned(uint64_t bytes) { return std::aligned_alloc(kSliceAlign, AlignUp(bytes)); }

}  // namespace

void SetFileOpenerForTesting(FileOpener opener) {
  std::lock_guard lock(opener_mu);
  TestOpener() = std::move(opener);
}

Result<std::shared_ptr<nvme::File>> OpenWithHook(nvme::IoEngine& io, const std::string& path,
                                                 const nvme::FileOptions& options) {
  FileOpener opener;
  {
    std::lock_guard lock(opener_mu);
    opener = TestOpener();
  }
  return opener ? opener(io, path, options) : io.Open(path, options);
}

Result<std::shared_ptr<nvme::File>> OpenDataFile(nvme::IoEngine& io, const std::string& path, bool write) {
  nvme::FileOptions o;
  o.direct = true;
  o.writable = write;
  o.create = write;
  o.truncate = write;
  auto f = OpenWithHook(io, path, o);
  if (!f.ok() && f.status().code() == StatusCode::kInvalidArgument && !std::filesystem::is_directory(path)) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      ZINF_LOG_INFO("checkpoint files under {} go through the page cache: {}",
                    std::filesystem::path(path).parent_path().string(), f.status().message());
    }
    o.direct = false;
    f = OpenWithHook(io, path, o);
  }
  if (!f.ok() && !write && f.status().code() == StatusCode::kNotFound) {
    return DataLoss("checkpoint file missing: " + path);
  }
  return f;
}

// ---- SliceWriter -------------------------------------------------------------

SliceWriter::SliceWriter(nvme::IoEngine& io, std::shared_ptr<nvme::File> file, uint64_t chunk_bytes, int depth)
    : io_(io), file_(std::move(file)), chunk_(AlignUp(chunk_bytes)), bufs_(depth, nullptr), inflight_(depth) {}

Result<std::unique_ptr<SliceWriter>> SliceWriter::Create(nvme::IoEngine& io, std::shared_ptr<nvme::File> file,
                                                         uint64_t chunk_bytes, int depth) {
  if (depth < 1 || chunk_bytes == 0) return InvalidArgument("SliceWriter: depth >= 1 and chunk_bytes > 0 needed");
  std::unique_ptr<SliceWriter> w(new SliceWriter(io, std::move(file), chunk_bytes, depth));
  for (void*& b : w->bufs_) {
    b = AllocAligned(w->chunk_);
    if (!b) return OutOfMemory("checkpoint staging buffer of " + std::to_string(w->chunk_) + " bytes");
  }
  w->hash_ = XXH3_createState();
  if (!w->hash_) return OutOfMemory("XXH3 state");
  return w;
}

SliceWriter::~SliceWriter() {
  for (auto& r : inflight_) {
    if (r.valid()) (void)r.Wait();
  }
  for (void* b : bufs_) std::free(b);
  if (hash_) XXH3_freeState(static_cast<XXH3_state_t*>(hash_));
}

uint64_t SliceWriter::BeginSlice() {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(hash_));
  return buf_offset_ + fill_;
}

// Submits the current buffer (the whole chunk, or at a slice's end its
// filled part padded to 4 KiB) and moves to the next, waiting for its
// previous write.
Status SliceWriter::Flush(bool slice_end) {
  if (fill_ == 0) return Status::Ok();
  uint64_t len = fill_;
  if (slice_end) {
    len = AlignUp(fill_);
    std::memset(static_cast<char*>(bufs_[cur_]) + fill_, 0, len - fill_);
  }
  inflight_[cur_] = io_.Write(file_, buf_offset_, bufs_[cur_], len);
  submitted_ += len;
  buf_offset_ += len;
  fill_ = 0;
  cur_ = (cur_ + 1) % static_cast<int>(bufs_.size());
  if (inflight_[cur_].valid()) {
    Status s = inflight_[cur_].Wait();
    inflight_[cur_] = {};
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Status SliceWriter::Append(const void* data, uint64_t bytes) {
  if (!error_.ok()) return error_;
  XXH3_64bits_update(static_cast<XXH3_state_t*>(hash_), data, bytes);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const uint64_t n = std::min(bytes, chunk_ - fill_);
    std::memcpy(static_cast<char*>(bufs_[cur_]) + fill_, p, n);
    fill_ += n;
    p += n;
    bytes -= n;
    if (fill_ == chunk_) {
      error_ = Flush(false);
      if (!error_.ok()) return error_;
    }
  }
  return Status::Ok();
}

Result<uint64_t> SliceWriter::EndSlice() {
  if (!error_.ok()) return error_;
  error_ = Flush(true);
  if (!error_.ok()) return error_;
  return static_cast<uint64_t>(XXH3_64bits_digest(static_cast<XXH3_state_t*>(hash_)));
}

Status SliceWriter::Finish() {
  if (error_.ok()) error_ = Flush(true);
  for (auto& r : inflight_) {
    if (!r.valid()) continue;
    Status s = r.Wait();
    r = {};
    if (error_.ok() && !s.ok()) error_ = s;
  }
  if (!error_.ok()) return error_;
  if (::fsync(file_->fd()) != 0) return IoError("fsync of " + file_->path() + ": " + Errno(errno));
  return Status::Ok();
}

// ---- SliceReader -------------------------------------------------------------

SliceReader::SliceReader(nvme::IoEngine& io, uint64_t chunk_bytes, int depth)
    : io_(io), chunk_(AlignUp(chunk_bytes)), bufs_(depth, nullptr) {}

Result<std::unique_ptr<SliceReader>> SliceReader::Create(nvme::IoEngine& io, uint64_t chunk_bytes, int depth) {
  if (depth < 1 || chunk_bytes == 0) return InvalidArgument("SliceReader: depth >= 1 and chunk_bytes > 0 needed");
  std::unique_ptr<SliceReader> r(new SliceReader(io, chunk_bytes, depth));
  for (void*& b : r->bufs_) {
    b = AllocAligned(r->chunk_);
    if (!b) return OutOfMemory("checkpoint staging buffer of " + std::to_string(r->chunk_) + " bytes");
  }
  return r;
}

SliceReader::~SliceReader() {
  for (void* b : bufs_) std::free(b);
}

Status SliceReader::Read(const std::shared_ptr<nvme::File>& file, uint64_t offset, uint64_t bytes, uint64_t xxh3,
                         const std::string& what, const std::function<void(const void*, uint64_t, uint64_t)>& sink) {
  std::vector<Job> jobs(1);
  jobs[0] = Job{file, offset, bytes, xxh3, what, sink};
  return ReadAll(jobs);
}

Status SliceReader::ReadAll(std::vector<Job>& jobs) {
  for (const Job& j : jobs) {
    if (j.file->direct() && j.offset % kSliceAlign != 0) {
      return DataLoss("checkpoint: " + j.what + " in " + j.file->path() + " starts at offset " +
                      std::to_string(j.offset) + ", not a multiple of 4096");
    }
  }
  // Every chunk of every job, in order.
  struct Chunk {
    size_t job;
    uint64_t pos, len;
  };
  std::vector<Chunk> chunks;
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (uint64_t pos = 0; pos < jobs[j].bytes; pos += chunk_)
      chunks.push_back({j, pos, std::min(chunk_, jobs[j].bytes - pos)});
  }
  XXH3_state_t* h = XXH3_createState();  // before any read is in flight
  if (!h) return OutOfMemory("XXH3 state");
  const int depth = static_cast<int>(bufs_.size());
  std::vector<nvme::IoRequest> reqs(depth);
  auto issue = [&](size_t c) {
    const Job& j = jobs[chunks[c].job];
    const uint64_t len = chunks[c].len;
    reqs[c % depth] =
        io_.Read(j.file, j.offset + chunks[c].pos, bufs_[c % depth], j.file->direct() ? AlignUp(len) : len);
  };
  for (size_t c = 0; c < std::min<size_t>(chunks.size(), depth); ++c) issue(c);
  Status st;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Job& j = jobs[chunks[c].job];
    nvme::IoRequest& r = reqs[c % depth];
    Status s = r.Wait();
    r = {};
    if (!s.ok()) {
      if (s.code() == StatusCode::kDataLoss) {
        s = DataLoss("checkpoint: " + j.what + ": " + j.file->path() + " is truncated (" + s.message() + ")");
      }
      st = s;
      break;
    }
    if (chunks[c].pos == 0) XXH3_64bits_reset(h);
    XXH3_64bits_update(h, bufs_[c % depth], chunks[c].len);
    j.sink(bufs_[c % depth], chunks[c].pos, chunks[c].len);
    read_ += chunks[c].len;
    if (chunks[c].pos + chunks[c].len == j.bytes && XXH3_64bits_digest(h) != j.xxh3) {
      st = DataLoss("checkpoint: " + j.what + " in " + j.file->path() + " at offset " + std::to_string(j.offset) +
                    " (" + std::to_string(j.bytes) + " bytes): checksum mismatch");
      break;
    }
    if (c + depth < chunks.size()) issue(c + depth);
  }
  for (auto& r : reqs) {
    if (r.valid()) (void)r.Wait();
  }
  XXH3_freeState(h);
  return st;
}

// ---- CheckpointReader ----------------------------------------------------------

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(nvme::IoEngine& io, const std::string& path) {
  namespace fs = std::filesystem;
  std::unique_ptr<CheckpointReader> r(new CheckpointReader(io));
  r->dir_ = path;
  if (!fs::exists(fs::path(path) / "manifest.json")) {
    auto latest = ReadSmallFile((fs::path(path) / "latest").string());
    if (!latest.ok()) return NotFound("no checkpoint at " + path + ": neither manifest.json nor latest");
    std::string name = *latest;
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    r->dir_ = (fs::path(path) / name).string();
  }
  const std::string manifest_path = (fs::path(r->dir_) / "manifest.json").string();
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(manifest_path));
  ZINF_RETURN_IF_ERROR(ParseManifest(text, manifest_path, &r->tables_));
  for (int rank = 0; rank < r->tables_.world_size; ++rank) {
    const std::string tpath = (fs::path(r->dir_) / ("rank-" + std::to_string(rank) + ".json")).string();
    auto ttext = ReadSmallFile(tpath);
    if (!ttext.ok()) {
      return DataLoss("checkpoint " + r->dir_ + ": rank " + std::to_string(rank) + "'s table " + tpath + " is missing");
    }
    ZINF_RETURN_IF_ERROR(AddRankTable(*ttext, tpath, &r->tables_));
    r->paths_.push_back((fs::path(r->dir_) / r->tables_.files.back()).string());
    r->files_.emplace_back();
  }
  ZINF_RETURN_IF_ERROR(r->CheckDataFiles());
  ZINF_ASSIGN_OR_RETURN(r->reader_, SliceReader::Create(io));
  return r;
}

// Every slice within its data file's real size, and every unit of the
// manifest held whole by its master slices: what the tables promise is what
// the files can give, before anything is sized from them.
Status CheckpointReader::CheckDataFiles() const {
  namespace fs = std::filesystem;
  std::vector<uint64_t> sizes(paths_.size(), 0);
  std::vector<bool> seen(paths_.size(), false);
  for (const auto& [key, slices] : tables_.slices) {
    for (const SliceEntry& sl : slices) {
      if (!seen[sl.file]) {
        std::error_code ec;
        sizes[sl.file] = fs::file_size(paths_[sl.file], ec);
        if (ec) {
          if (ec == std::errc::no_such_file_or_directory)
            return DataLoss("checkpoint file missing: " + paths_[sl.file]);
          return IoError("stat " + paths_[sl.file] + ": " + ec.message());
        }
        seen[sl.file] = true;
      }
      const uint64_t end = sl.offset + static_cast<uint64_t>(sl.count) * 4;  // bounded by AddRankTable
      if (end > sizes[sl.file]) {
        return DataLoss("checkpoint file truncated: " + paths_[sl.file] + " is " + std::to_string(sizes[sl.file]) +
                        " bytes; unit '" + key.first + "' " + key.second + " elements [" + std::to_string(sl.begin) +
                        ", " + std::to_string(sl.begin + sl.count) + ") end at byte " + std::to_string(end));
      }
    }
  }
  for (const ManifestUnit& u : tables_.units) {
    ZINF_RETURN_IF_ERROR(PlanRange(tables_, dir_, u.name, kStateKindNames[0], u.elements, 0, u.elements).status());
  }
  return Status::Ok();
}

Status CheckpointReader::ReadRange(const std::string& unit, int kind, int64_t unit_elems, int64_t first, int64_t count,
                                   float* dst) {
  return ReadRanges({Range{unit, kind, unit_elems, first, count, dst}});
}

Status CheckpointReader::ReadRanges(const std::vector<Range>& ranges) {
  std::vector<SliceReader::Job> jobs;
  for (const Range& rg : ranges) {
    if (rg.kind < 0 || rg.kind > 2) return InvalidArgument("checkpoint: state kind " + std::to_string(rg.kind));
    const char* kname = kStateKindNames[rg.kind];
    ZINF_ASSIGN_OR_RETURN(std::vector<SlicePart> parts,
                          PlanRange(tables_, dir_, rg.unit, kname, rg.unit_elems, rg.first, rg.count));
    for (const SlicePart& part : parts) {
      const SliceEntry& sl = *part.slice;
      if (!files_[sl.file]) {
        ZINF_ASSIGN_OR_RETURN(files_[sl.file], OpenDataFile(io_, paths_[sl.file], false));
      }
      const uint64_t want_lo = static_cast<uint64_t>(part.lo - sl.begin) * 4;
      const uint64_t want_hi = static_cast<uint64_t>(part.hi - sl.begin) * 4;
      char* out = reinterpret_cast<char*>(rg.dst + (part.lo - rg.first));
      jobs.push_back({files_[sl.file], sl.offset, static_cast<uint64_t>(sl.count) * 4, sl.xxh3,
                      "unit '" + rg.unit + "' " + kname + " elements [" + std::to_string(sl.begin) + ", " +
                          std::to_string(sl.begin + sl.count) + ")",
                      [out, want_lo, want_hi](const void* data, uint64_t pos, uint64_t n) {
                        const uint64_t a = std::max(pos, want_lo), b = std::min(pos + n, want_hi);
                        if (a < b) std::memcpy(out + (a - want_lo), static_cast<const char*>(data) + (a - pos), b - a);
                      }});
    }
  }
  return reader_->ReadAll(jobs);
}

}  // namespace zinf::sched::ckpt
