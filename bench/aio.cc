// `zinf aio`: see aio.h. The run keeps, for each thread (one io_uring ring
// each, like one fio job each on its own region), queue_depth blocks in
// flight; each completion callback submits that slot's next block, so the
// ring never waits for this thread. Files are laid out with a known pattern
// first (as fio lays its file out), which is also what --verify checks.
//
// The buffers are allocated once per run and serve the lay-out and every
// loop, so memory is faulted in once, not per loop. What a write sends:
// with --verify, each block's pattern; otherwise, as fio by default, data
// that neither compresses nor deduplicates: the buffers are filled once
// with pseudo-random words, and before each submission one word in every
// 4 KiB takes the block's number (fio's scramble_buffers), so that storage
// which special-cases zeros or repeated blocks is measured on real data.
#include "bench/aio.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>

#include "bench/bench_util.h"
#include "common/units.h"
#include "cpu/io_memory.h"
#include "nvme/io_engine.h"

namespace zinf::bench {
namespace {

using nvme::IoEngine;
using nvme::IoKind;

constexpr uint64_t kMaxSlotBytes = 4ull << 30;  // all in-flight buffers together

// The pattern word for logical byte offset `o` (o % 8 == 0): a splitmix64
// of the word index, so every word of a multi-GB file differs.
inline uint64_t PatternWord(uint64_t o) {
  uint64_t z = (o >> 3) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void FillPattern(char* buf, uint64_t logical_offset, uint64_t bytes) {
  auto* w = reinterpret_cast<uint64_t*>(buf);
  for (uint64_t i = 0; i < bytes / 8; ++i) w[i] = PatternWord(logical_offset + 8 * i);
}

// Plain writes: the buffers' words come from PatternWord far past any file
// offset (kPlainStream), so no block a plain write sends passes --verify.
constexpr uint64_t kPlainStream = uint64_t{1} << 62;
constexpr uint64_t kScrambleStride = 4096;

// One word in every 4 KiB of a plain write's buffer becomes a function of
// the block number: no two blocks of a pass are the same 4 KiB pages.
void ScrambleBlock(char* buf, uint64_t block, uint64_t bytes) {
  const uint64_t tag = PatternWord(kPlainStream ^ (block << 3)) | 1;  // never 0
  for (uint64_t o = 0; o < bytes; o += kScrambleStride) *reinterpret_cast<uint64_t*>(buf + o) = tag + o;
}

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  size_t k = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

// What a pass writes into a buffer before submitting a block.
enum class WriteData { kNone, kPattern, kScramble };

// One timed pass over every block, through the run's buffers: queue_depth
// × threads slots of block_size bytes at `pool`.
class Pass {
 public:
  Pass(IoEngine& engine, const std::vector<std::shared_ptr<nvme::File>>& files, const AioOptions& o, IoKind kind,
       char* pool, WriteData data, bool check)
      : engine_(engine), files_(files), o_(o), kind_(kind), pool_(pool), data_(data), check_(check) {}

  Result<AioLoop> Run(const std::function<void(uint64_t)>& on_blocks) {
    const uint64_t nblocks = o_.size / o_.block_size;
    const uint64_t per_job = nblocks / o_.threads;
    jobs_ = std::vector<Job>(o_.threads);
    for (unsigned j = 0; j < o_.threads; ++j) {
      jobs_[j].next = j * per_job;
      jobs_[j].end = (j + 1) * per_job;
    }
    const unsigned nslots = o_.queue_depth * o_.threads;
    slots_.resize(nslots);
    for (unsigned s = 0; s < nslots; ++s) slots_[s] = {this, s / o_.queue_depth, pool_ + s * o_.block_size, 0, 0};
    latencies_.reserve(nblocks);
    active_ = nslots;
    double cpu0 = CpuSeconds(), t0 = NowSeconds();
    for (auto& s : slots_) SubmitNext(&s);
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (active_ > 0) {
        cv_.wait_for(lock, std::chrono::milliseconds(250));
        if (on_blocks) {
          lock.unlock();
          on_blocks(done_.load());
          lock.lock();
        }
      }
    }
    double seconds = NowSeconds() - t0, cpu = CpuSeconds() - cpu0;
    if (!first_error_.ok()) return first_error_;
    AioLoop loop;
    loop.seconds = seconds;
    loop.gb_per_s = static_cast<double>(nblocks * o_.block_size) / seconds / 1e9;
    loop.iops = static_cast<double>(nblocks) / seconds;
    loop.p50_us = Percentile(latencies_, 0.50) * 1e6;
    loop.p99_us = Percentile(latencies_, 0.99) * 1e6;
    loop.cpu_seconds = cpu;
    return loop;
  }

 private:
  struct Job {
    std::atomic<uint64_t> next{0};
    uint64_t end = 0;
    Job() = default;
    Job(Job&& o) noexcept : next(o.next.load()), end(o.end) {}
    Job& operator=(Job&& o) noexcept {
      next.store(o.next.load());
      end = o.end;
      return *this;
    }
  };
  struct Slot {
    Pass* pass;
    unsigned job;
    char* buf;
    uint64_t block;
    double t_submit;
  };

  void SubmitNext(Slot* s) {
    uint64_t b = jobs_[s->job].next.fetch_add(1);
    if (b >= jobs_[s->job].end || failed_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) cv_.notify_all();
      return;
    }
    s->block = b;
    const uint64_t nf = files_.size();
    if (data_ == WriteData::kPattern) FillPattern(s->buf, b * o_.block_size, o_.block_size);
    if (data_ == WriteData::kScramble) ScrambleBlock(s->buf, b, o_.block_size);
    s->t_submit = NowSeconds();
    engine_.Submit(
        {nvme::IoOp{kind_, files_[b % nf], (b / nf) * o_.block_size, s->buf, o_.block_size}},
        [s](const Status& st) { s->pass->OnDone(s, st); }, nullptr, static_cast<int>(s->job));
  }

  void OnDone(Slot* s, Status st) {
    double latency = NowSeconds() - s->t_submit;
    if (st.ok() && check_) st = Check(*s);
    {
      std::lock_guard<std::mutex> lock(mu_);
      latencies_.push_back(latency);
      if (!st.ok() && first_error_.ok()) first_error_ = st;
    }
    if (!st.ok()) failed_.store(true);
    done_.fetch_add(1, std::memory_order_relaxed);
    SubmitNext(s);
  }

  Status Check(const Slot& s) const {
    const uint64_t logical = s.block * o_.block_size;
    const auto* w = reinterpret_cast<const uint64_t*>(s.buf);
    for (uint64_t i = 0; i < o_.block_size / 8; ++i) {
      uint64_t want = PatternWord(logical + 8 * i);
      if (w[i] == want) continue;
      uint64_t got = w[i];
      int byte = 0;
      while (((got >> (8 * byte)) & 0xff) == ((want >> (8 * byte)) & 0xff)) ++byte;
      const uint64_t nf = files_.size();
      uint64_t file_offset = (s.block / nf) * o_.block_size + 8 * i + byte;
      char detail[96];
      std::snprintf(detail, sizeof(detail), "expected 0x%02x, read 0x%02x",
                    static_cast<unsigned>((want >> (8 * byte)) & 0xff),
                    static_cast<unsigned>((got >> (8 * byte)) & 0xff));
      return DataLoss("verify: " + files_[s.block % nf]->path() + " offset=" + std::to_string(file_offset) + ": " +
                      detail +
                      " (the file does not hold zinf aio's pattern: it was changed, or written by another program "
                      "or by 'zinf aio write' without --verify)");
    }
    return Status::Ok();
  }

  IoEngine& engine_;
  const std::vector<std::shared_ptr<nvme::File>>& files_;
  const AioOptions& o_;
  IoKind kind_;
  char* pool_;
  WriteData data_;
  bool check_;
  std::vector<Job> jobs_;
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  unsigned active_ = 0;
  Status first_error_;
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> done_{0};
  std::vector<double> latencies_;
};

std::string ParentDir(const std::string& path) {
  auto p = std::filesystem::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

}  // namespace

Status ValidateAio(const AioOptions& o) {
  if (o.paths.empty()) return InvalidArgument("--path is required");
  if (o.block_size == 0 || o.block_size % 4096)
    return InvalidArgument("--block-size " + std::to_string(o.block_size) + " is not a positive multiple of 4096");
  if (o.block_size > (1ull << 30))
    return InvalidArgument("--block-size " + FormatBytes(o.block_size) + " exceeds 1 GiB");
  if (o.queue_depth == 0 || o.queue_depth > 4096)
    return InvalidArgument("--queue-depth " + std::to_string(o.queue_depth) + " is outside 1..4096");
  if (o.threads == 0 || o.threads > 256)
    return InvalidArgument("--threads " + std::to_string(o.threads) + " is outside 1..256");
  if (o.loops < 1) return InvalidArgument("--loops must be >= 1");
  const uint64_t unit = o.block_size * o.threads * o.paths.size();
  if (o.size == 0 || o.size % unit)
    return InvalidArgument(
        "--size " + FormatBytes(o.size) +
        " is not a positive multiple of --block-size x --threads x paths = " + FormatBytes(o.block_size) + " x " +
        std::to_string(o.threads) + " x " + std::to_string(o.paths.size()) + " = " + FormatBytes(unit));
  if (static_cast<uint64_t>(o.queue_depth) * o.threads * o.block_size > kMaxSlotBytes)
    return InvalidArgument("--queue-depth x --threads x --block-size = " +
                           FormatBytes(static_cast<uint64_t>(o.queue_depth) * o.threads * o.block_size) +
                           " of buffers in flight exceeds 4 GiB; lower one of them");
  for (size_t i = 0; i < o.paths.size(); ++i) {
    const std::string& p = o.paths[i];
    for (size_t k = 0; k < i; ++k)
      if (o.paths[k] == p) return InvalidArgument("--path " + p + " is given twice");
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode))
        return InvalidArgument("--path " + p + " is a directory; give a file path (zinf aio lays the file out there)");
      if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
        return InvalidArgument("--path " + p + " is neither a regular file nor a block device");
      if (::access(p.c_str(), o.kind == IoKind::kWrite ? (R_OK | W_OK) : R_OK) != 0)
        return InvalidArgument("--path " + p + " is not " + (o.kind == IoKind::kWrite ? "writable" : "readable") +
                               ": " + std::strerror(errno));
    } else {
      std::string dir = ParentDir(p);
      struct stat dst {};
      if (::stat(dir.c_str(), &dst) != 0 || !S_ISDIR(dst.st_mode))
        return InvalidArgument("--path " + p + ": directory " + dir + " does not exist");
      if (::access(dir.c_str(), W_OK | X_OK) != 0)
        return InvalidArgument("--path " + p + ": cannot create it, directory " + dir + " is not writable (" +
                               std::strerror(errno) + ")");
    }
  }
  return Status::Ok();
}

Result<AioResult> RunAio(const AioOptions& o, const std::function<void(double)>& progress) {
  ZINF_RETURN_IF_ERROR(ValidateAio(o));
  nvme::IoEngineOptions eo;
  eo.block_size = o.block_size;
  eo.queue_depth = o.queue_depth;
  eo.rings = o.threads;
  eo.fixed_buffers = o.fixed_buffers;
  eo.sqpoll = o.sqpoll;
  eo.single_submit = o.single_submit;
  ZINF_ASSIGN_OR_RETURN(auto engine, IoEngine::Create(eo));

  AioResult result;
  result.backend = engine->backend_name();
  const uint64_t per_file = o.size / o.paths.size();
  std::vector<std::shared_ptr<nvme::File>> files;
  std::vector<std::string> created;
  auto cleanup = [&] {
    files.clear();
    for (const auto& p : created) std::filesystem::remove(p);
  };
  bool layout = false;
  for (const auto& p : o.paths) {
    bool existed = std::filesystem::exists(p);
    nvme::FileOptions fo;
    fo.direct = !o.buffered;
    fo.create = true;
    auto f = engine->Open(p, fo);
    if (!existed && std::filesystem::exists(p)) created.push_back(p);
    if (!f.ok()) {
      cleanup();
      return f.status();
    }
    auto size = (*f)->Size();
    if (!size.ok()) {
      cleanup();
      return size.status();
    }
    layout |= *size < per_file;
    files.push_back(*f);
  }

  const uint64_t nblocks = o.size / o.block_size;
  const double total = static_cast<double>(nblocks) * (o.loops + (layout ? 1 : 0));
  double base = 0;
  auto report = [&](uint64_t blocks) {
    if (progress) progress((base + static_cast<double>(blocks)) / total);
  };
  // The buffers, for the lay-out and every loop (huge pages: cpu/io_memory.h).
  const uint64_t pool_bytes = uint64_t{o.queue_depth} * o.threads * o.block_size;
  cpu::IoMemory pool = cpu::AllocateIoMemory(pool_bytes);
  if (!pool) {
    cleanup();
    return OutOfMemory("cannot allocate " + FormatBytes(pool_bytes) + " of I/O buffers");
  }
  std::vector<char*> registered;
  auto unregister = [&] {
    for (char* b : registered) engine->UnregisterBuffer(b).IgnoreError();
    registered.clear();
  };
  if (o.fixed_buffers) {
    for (uint64_t off = 0; off < pool_bytes; off += o.block_size) {
      Status st = engine->RegisterBuffer(pool.get() + off, o.block_size);
      if (!st.ok()) {
        unregister();
        cleanup();
        return st;
      }
      registered.push_back(pool.get() + off);
    }
  }
  if (layout) {
    // Lay out with the pattern. A pass that fails here leaves no new file behind.
    Pass pass(*engine, files, o, IoKind::kWrite, pool.get(), WriteData::kPattern, /*check=*/false);
    auto r = pass.Run(report);
    if (!r.ok()) {
      unregister();
      cleanup();
      return std::move(r).status().WithContext("laying out the test file");
    }
    result.laid_out = true;
    base += static_cast<double>(nblocks);
  }
  if (o.kind == IoKind::kWrite && !o.verify) FillPattern(pool.get(), kPlainStream, pool_bytes);
  for (int l = 0; l < o.loops; ++l) {
    // Only --verify pays for generating the pattern per block; a plain write
    // sends other bytes, which a later `read --verify` reports as a mismatch.
    const WriteData data = o.kind == IoKind::kRead ? WriteData::kNone
                           : o.verify              ? WriteData::kPattern
                                                   : WriteData::kScramble;
    Pass pass(*engine, files, o, o.kind, pool.get(), data, /*check=*/o.kind == IoKind::kRead && o.verify);
    auto r = pass.Run(report);
    if (!r.ok()) {
      unregister();
      return r.status();
    }
    result.loops.push_back(*r);
    base += static_cast<double>(nblocks);
  }
  unregister();
  auto med = [&](double AioLoop::*field) {
    std::vector<double> v;
    for (const auto& l : result.loops) v.push_back(l.*field);
    return Median(v);
  };
  for (auto field : {&AioLoop::seconds, &AioLoop::gb_per_s, &AioLoop::iops, &AioLoop::p50_us, &AioLoop::p99_us,
                     &AioLoop::cpu_seconds})
    result.median.*field = med(field);
  return result;
}

}  // namespace zinf::bench

// --- the CLI: read, write, sweep ----------------------------------------------

namespace zinf::bench {
namespace {

struct CliAio {
  AioOptions o;
  std::string size = "4G", block_size = "1M";
  bool json = false;
};

void AddCommonOptions(CLI::App* cmd, CliAio& c, bool sweep) {
  cmd->add_option("--path", c.o.paths, "File to test (repeat for several drives: blocks are striped across them)")
      ->required();
  cmd->add_option("--size", c.size, "Total bytes across all paths")->capture_default_str();
  if (!sweep) {
    cmd->add_option("--block-size", c.block_size, "Bytes per I/O")->capture_default_str();
    cmd->add_option("--queue-depth", c.o.queue_depth, "I/Os in flight per thread (fio's iodepth per job)")
        ->capture_default_str();
    cmd->add_option("--threads", c.o.threads, "Threads, one io_uring each, each on its own region (fio's numjobs)")
        ->capture_default_str();
    cmd->add_flag("--fixed-buffers", c.o.fixed_buffers, "Register the buffers with io_uring");
    cmd->add_flag("--verify", c.o.verify, "write: write a known pattern; read: check every byte against it");
  }
  cmd->add_option("--loops", c.o.loops, "Timed passes (medians reported)")->capture_default_str();
  cmd->add_flag("--buffered", c.o.buffered, "Page-cache I/O instead of O_DIRECT");
  cmd->add_flag("--sqpoll", c.o.sqpoll, "Kernel submission polling thread per ring (takes a core each)");
  if (!sweep)
    cmd->add_flag("--single-submit", c.o.single_submit,
                  "Submit each block on its own (the kernel then does not merge neighbouring blocks)");
  cmd->add_flag("--json", c.json, "Print one JSON object");
}

// Parses the size strings; bad ones are usage errors.
Status ParseCliSizes(CliAio& c) {
  auto size = ParseSize(c.size);
  if (!size.ok()) return InvalidArgument("--size: " + size.status().message());
  c.o.size = *size;
  auto bs = ParseSize(c.block_size);
  if (!bs.ok()) return InvalidArgument("--block-size: " + bs.status().message());
  c.o.block_size = *bs;
  return Status::Ok();
}

// Usage problems exit 2, failures of the run exit 1.
int Fail(const Status& st) {
  std::fprintf(stderr, "zinf aio: %s\n", st.message().c_str());
  return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

// "[read] 42%  ETA 3s" on stderr, rewritten in place on a terminal.
std::function<void(double)> ProgressLine(const std::string& what) {
  if (!::isatty(STDERR_FILENO)) return nullptr;
  double t0 = NowSeconds();
  return [what, t0](double f) {
    double elapsed = NowSeconds() - t0;
    double eta = f > 0.01 ? elapsed * (1 - f) / f : 0;
    std::fprintf(stderr, "\r[%s] %3.0f%%  elapsed %.0fs  ETA %.0fs   ", what.c_str(), 100 * f, elapsed, eta);
    if (f >= 1) std::fprintf(stderr, "\n");
  };
}

nlohmann::json LoopJson(const AioLoop& l) {
  return {{"seconds", l.seconds}, {"gb_per_s", l.gb_per_s}, {"iops", l.iops},
          {"p50_us", l.p50_us},   {"p99_us", l.p99_us},     {"cpu_seconds", l.cpu_seconds}};
}

int RunReadWrite(CliAio& c, IoKind kind) {
  c.o.kind = kind;
  Status st = ParseCliSizes(c);
  if (st.ok()) st = ValidateAio(c.o);
  if (!st.ok()) return Fail(st);
  const char* op = kind == IoKind::kRead ? "read" : "write";
  std::string paths;
  for (const auto& p : c.o.paths) paths += (paths.empty() ? "" : ", ") + p;
  if (!c.json)
    std::printf(
        "# zinf aio %s: %s; %s in %s blocks; queue depth %u per thread; %u thread(s); %s; fixed buffers %s; "
        "sqpoll %s; single submit %s; %d loop(s); verify %s\n",
        op, paths.c_str(), FormatBytes(c.o.size).c_str(), FormatBytes(c.o.block_size).c_str(), c.o.queue_depth,
        c.o.threads, c.o.buffered ? "buffered" : "O_DIRECT", c.o.fixed_buffers ? "on" : "off",
        c.o.sqpoll ? "on" : "off", c.o.single_submit ? "on" : "off", c.o.loops, c.o.verify ? "on" : "off");
  std::fflush(stdout);
  auto r = RunAio(c.o, ProgressLine(op));
  if (!r.ok()) return Fail(r.status());
  const double gb = static_cast<double>(c.o.size) / 1e9;
  if (c.json) {
    nlohmann::json j = {{"command", "aio"},
                        {"op", op},
                        {"config",
                         {{"paths", c.o.paths},
                          {"size_bytes", c.o.size},
                          {"block_size", c.o.block_size},
                          {"queue_depth", c.o.queue_depth},
                          {"threads", c.o.threads},
                          {"buffered", c.o.buffered},
                          {"fixed_buffers", c.o.fixed_buffers},
                          {"sqpoll", c.o.sqpoll},
                          {"single_submit", c.o.single_submit},
                          {"loops", c.o.loops},
                          {"verify", c.o.verify},
                          {"backend", r->backend}}},
                        {"laid_out", r->laid_out},
                        {"loops", nlohmann::json::array()},
                        {"median", LoopJson(r->median)},
                        {"cpu_seconds_per_gb", r->median.cpu_seconds / gb}};
    for (const auto& l : r->loops) j["loops"].push_back(LoopJson(l));
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  if (r->laid_out) std::printf("# laid out %s with zinf aio's pattern first\n", paths.c_str());
  std::printf("%-7s %8s %10s %10s %10s %8s %9s\n", "loop", "GB/s", "IOPS", "p50 us", "p99 us", "cpu s", "cpu s/GB");
  auto row = [&](const std::string& name, const AioLoop& l) {
    std::printf("%-7s %8.3f %10.0f %10.0f %10.0f %8.3f %9.4f\n", name.c_str(), l.gb_per_s, l.iops, l.p50_us, l.p99_us,
                l.cpu_seconds, l.cpu_seconds / gb);
  };
  for (size_t i = 0; i < r->loops.size(); ++i) row(std::to_string(i + 1), r->loops[i]);
  row("median", r->median);
  return 0;
}

// --- sweep ----------------------------------------------------------------------

struct SweepPoint {
  unsigned threads;
  uint64_t block_size;
  unsigned queue_depth;
  double read_gbps = 0, write_gbps = 0;
};

const uint64_t kSweepBlocks[] = {128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20};
const unsigned kSweepDepths[] = {1, 2, 4, 8, 16, 32, 64};
const unsigned kSweepThreads[] = {1, 2};
constexpr size_t kConfirm = 3;  // grid points measured again

// A colour from dark blue to yellow for t in [0, 1] (a viridis-like ramp).
std::string Color(double t) {
  static const int stops[][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(t, 0.0, 1.0) * 4;
  int i = std::min(3, static_cast<int>(t));
  double f = t - i;
  char buf[16];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", static_cast<int>(stops[i][0] + f * (stops[i + 1][0] - stops[i][0])),
                static_cast<int>(stops[i][1] + f * (stops[i + 1][1] - stops[i][1])),
                static_cast<int>(stops[i][2] + f * (stops[i + 1][2] - stops[i][2])));
  return buf;
}

Status WriteSvg(const std::string& path, const std::vector<SweepPoint>& points, const std::string& title) {
  const int cell_w = 64, cell_h = 30, left = 70, top = 60, gap = 50;
  const int nb = std::size(kSweepBlocks), nq = std::size(kSweepDepths);
  const int panel_w = left + nq * cell_w, panel_h = top + nb * cell_h + 30;
  const int width = 2 * panel_w + gap + 20, height = 2 * panel_h + 40;
  double max_gbps = 0;
  for (const auto& p : points) max_gbps = std::max({max_gbps, p.read_gbps, p.write_gbps});
  std::ofstream svg(path);
  if (!svg) return IoError("cannot write " + path + ": " + std::strerror(errno));
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='10' y='20' font-size='15'>" << title << " (GB/s, 10^9 B/s; colour scale 0 to "
      << std::to_string(max_gbps).substr(0, 4) << ")</text>\n";
  int panel = 0;
  for (unsigned threads : kSweepThreads) {
    for (int op = 0; op < 2; ++op, ++panel) {
      int x0 = (panel % 2) * (panel_w + gap), y0 = 30 + (panel / 2) * panel_h;
      svg << "<text x='" << x0 + left << "' y='" << y0 + 20 << "' font-weight='bold'>" << (op ? "read" : "write")
          << ", " << threads << " thread" << (threads > 1 ? "s" : "") << "</text>\n";
      svg << "<text x='" << x0 + left << "' y='" << y0 + 42 << "'>queue depth per thread →</text>\n";
      for (int q = 0; q < nq; ++q)
        svg << "<text x='" << x0 + left + q * cell_w + cell_w / 2 << "' y='" << y0 + top - 4
            << "' text-anchor='middle'>" << kSweepDepths[q] << "</text>\n";
      for (int b = 0; b < nb; ++b) {
        svg << "<text x='" << x0 + left - 6 << "' y='" << y0 + top + b * cell_h + cell_h / 2 + 4
            << "' text-anchor='end'>" << FormatBytes(kSweepBlocks[b]).substr(0, FormatBytes(kSweepBlocks[b]).find('.'))
            << (kSweepBlocks[b] >= (1 << 20) ? "M" : "K") << "</text>\n";
        for (int q = 0; q < nq; ++q) {
          double v = -1;
          for (const auto& p : points)
            if (p.threads == threads && p.block_size == kSweepBlocks[b] && p.queue_depth == kSweepDepths[q])
              v = op ? p.read_gbps : p.write_gbps;
          int x = x0 + left + q * cell_w, y = y0 + top + b * cell_h;
          svg << "<rect x='" << x << "' y='" << y << "' width='" << cell_w - 1 << "' height='" << cell_h - 1
              << "' fill='" << (v < 0 ? std::string("#dddddd") : Color(v / max_gbps)) << "'/>\n";
          if (v >= 0)
            svg << "<text x='" << x + cell_w / 2 << "' y='" << y + cell_h / 2 + 4 << "' text-anchor='middle' fill='"
                << (v / max_gbps > 0.6 ? "black" : "white") << "'>" << std::to_string(v).substr(0, 4) << "</text>\n";
        }
      }
      svg << "<text x='" << x0 + 4 << "' y='" << y0 + top - 4 << "'>block</text>\n";
    }
  }
  svg << "</svg>\n";
  return svg.good() ? Status::Ok() : IoError("writing " + path + " failed");
}

struct CliSweep {
  CliAio c;
  std::string output = "zinf_aio_config.json";
  std::string svg;
};

int RunSweep(CliSweep& s) {
  CliAio& c = s.c;
  c.block_size = "8M";  // the largest swept, for the size check below
  c.o.threads = 2;
  c.o.kind = IoKind::kWrite;
  Status st = ParseCliSizes(c);
  if (st.ok()) st = ValidateAio(c.o);
  if (!st.ok()) return Fail(st);
  if (c.o.loops == 3) c.o.loops = 1;  // the read/write default; one pass per point unless asked
  // The grid, then the best kConfirm points again, batched and single-submitted.
  const size_t total =
      std::size(kSweepThreads) * std::size(kSweepBlocks) * std::size(kSweepDepths) * 2 + kConfirm * 2 * 2;
  if (!c.json)
    std::printf(
        "# zinf aio sweep: %s, %s per point, %zu points (block 128K-8M x queue depth 1-64 x threads 1-2 x "
        "write, read), %d loop(s) each\n",
        c.o.paths[0].c_str(), FormatBytes(c.o.size).c_str(), total, c.o.loops);
  std::vector<SweepPoint> points;
  size_t done = 0;
  double t0 = NowSeconds();
  // Both ops at one point: write first, so the read finds the file laid out.
  auto measure = [&](SweepPoint& p, bool single_submit) -> Status {
    for (IoKind kind : {IoKind::kWrite, IoKind::kRead}) {
      AioOptions o = c.o;
      o.kind = kind;
      o.block_size = p.block_size;
      o.queue_depth = p.queue_depth;
      o.threads = p.threads;
      o.single_submit = single_submit;
      o.verify = false;
      auto r = RunAio(o);
      if (!r.ok()) return r.status();
      (kind == IoKind::kRead ? p.read_gbps : p.write_gbps) = r->median.gb_per_s;
      ++done;
      double elapsed = NowSeconds() - t0;
      std::fprintf(stderr, "%s[%3zu/%zu] %-5s %6s qd %2u t%u%s %7.3f GB/s   elapsed %4.0fs  ETA %4.0fs%s",
                   ::isatty(STDERR_FILENO) ? "\r" : "", done, total, kind == IoKind::kRead ? "read" : "write",
                   FormatBytes(p.block_size).c_str(), p.queue_depth, p.threads, single_submit ? " single" : "",
                   r->median.gb_per_s, elapsed, elapsed / done * (total - done),
                   ::isatty(STDERR_FILENO) ? "   " : "\n");
    }
    return Status::Ok();
  };
  // The optimizer moves the same bytes in and out, so the best setting for
  // it minimises read time + write time: 1/read + 1/write.
  auto time_per_byte = [](const SweepPoint& p) { return 1 / p.read_gbps + 1 / p.write_gbps; };
  for (unsigned threads : kSweepThreads) {
    for (uint64_t bs : kSweepBlocks) {
      for (unsigned qd : kSweepDepths) {
        SweepPoint p{threads, bs, qd};
        if (Status m = measure(p, false); !m.ok()) return Fail(m);
        points.push_back(p);
      }
    }
  }
  const SweepPoint* best_read = &points[0];
  const SweepPoint* best_write = &points[0];
  for (const auto& p : points) {
    if (p.read_gbps > best_read->read_gbps) best_read = &p;
    if (p.write_gbps > best_write->write_gbps) best_write = &p;
  }
  // One pass per point picks the best of 196 noisy figures, which favours a
  // lucky one. The kConfirm points with the least read + write time are
  // measured again, each batched and with every block submitted on its own
  // (a batch is plugged and the kernel merges neighbouring blocks into larger
  // device requests, which some devices serve more slowly: DeepSpeed's
  // single_submit). The least time among these runs is the recommendation.
  std::vector<const SweepPoint*> ranked;
  for (const auto& p : points) ranked.push_back(&p);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](const SweepPoint* a, const SweepPoint* b) { return time_per_byte(*a) < time_per_byte(*b); });
  ranked.resize(std::min<size_t>(kConfirm, ranked.size()));
  struct Confirmed {
    SweepPoint p;
    bool single_submit;
  };
  std::vector<Confirmed> confirmed;
  for (const SweepPoint* p : ranked) {
    for (bool single : {false, true}) {
      Confirmed again{*p, single};
      if (Status m = measure(again.p, single); !m.ok()) return Fail(m);
      confirmed.push_back(again);
    }
  }
  if (::isatty(STDERR_FILENO)) std::fprintf(stderr, "\n");
  const Confirmed& rec = *std::min_element(confirmed.begin(), confirmed.end(), [&](const auto& a, const auto& b) {
    return time_per_byte(a.p) < time_per_byte(b.p);
  });
  nlohmann::json config = {{"aio",
                            {{"block_size", rec.p.block_size},
                             {"queue_depth", rec.p.queue_depth},
                             {"intra_op_parallelism", rec.p.threads},
                             {"single_submit", rec.single_submit},
                             {"overlap_events", true}}},
                           {"zinf",
                            {{"aio",
                              {{"rings", rec.p.threads},
                               {"fixed_buffers", c.o.fixed_buffers},
                               {"sqpoll", c.o.sqpoll},
                               {"buffered", c.o.buffered}}}}}};
  {
    std::ofstream out(s.output);
    out << config.dump(2) << "\n";
    if (!out) return Fail(IoError("cannot write " + s.output + ": " + std::strerror(errno)));
  }
  if (!s.svg.empty()) {
    Status svg = WriteSvg(s.svg, points, "zinf aio sweep: " + c.o.paths[0]);
    if (!svg.ok()) return Fail(svg);
  }
  auto describe = [](const SweepPoint& p) {
    return FormatBytes(p.block_size) + " qd " + std::to_string(p.queue_depth) + " threads " + std::to_string(p.threads);
  };
  if (c.json) {
    nlohmann::json j = {{"command", "aio sweep"},
                        {"path", c.o.paths[0]},
                        {"size_bytes", c.o.size},
                        {"points", nlohmann::json::array()},
                        {"confirmed", nlohmann::json::array()},
                        {"recommended", config}};
    for (const auto& p : points)
      j["points"].push_back({{"threads", p.threads},
                             {"block_size", p.block_size},
                             {"queue_depth", p.queue_depth},
                             {"read_gb_per_s", p.read_gbps},
                             {"write_gb_per_s", p.write_gbps}});
    for (const auto& c2 : confirmed)
      j["confirmed"].push_back({{"threads", c2.p.threads},
                                {"block_size", c2.p.block_size},
                                {"queue_depth", c2.p.queue_depth},
                                {"single_submit", c2.single_submit},
                                {"read_gb_per_s", c2.p.read_gbps},
                                {"write_gb_per_s", c2.p.write_gbps}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%-8s %-9s %3s %9s %9s\n", "threads", "block", "qd", "read", "write");
  for (const auto& p : points)
    std::printf("%-8u %-9s %3u %9.3f %9.3f\n", p.threads, FormatBytes(p.block_size).c_str(), p.queue_depth, p.read_gbps,
                p.write_gbps);
  std::printf("best read:  %.3f GB/s at %s\n", best_read->read_gbps, describe(*best_read).c_str());
  std::printf("best write: %.3f GB/s at %s\n", best_write->write_gbps, describe(*best_write).c_str());
  std::printf("measured again (the %zu points with the least read + write time, batched and single-submitted):\n",
              ranked.size());
  for (const auto& c2 : confirmed)
    std::printf("  %-36s single submit %-3s read %7.3f write %7.3f GB/s\n", describe(c2.p).c_str(),
                c2.single_submit ? "on" : "off", c2.p.read_gbps, c2.p.write_gbps);
  std::printf(
      "recommended (least read + write time measured again): %s, single submit %s, read %.3f, write %.3f "
      "GB/s -> %s%s%s\n",
      describe(rec.p).c_str(), rec.single_submit ? "on" : "off", rec.p.read_gbps, rec.p.write_gbps, s.output.c_str(),
      s.svg.empty() ? "" : ", heatmap ", s.svg.c_str());
  return 0;
}

}  // namespace

void RegisterAio(CLI::App& app, int* exit_code) {
  CLI::App* aio = app.add_subcommand("aio", "Measure NVMe throughput through zinf's I/O engine, and tune it");
  aio->require_subcommand(1);
  auto read = std::make_shared<CliAio>(), write = std::make_shared<CliAio>();
  CLI::App* r = aio->add_subcommand("read", "Sequential reads (the file is laid out first if needed)");
  AddCommonOptions(r, *read, false);
  r->callback([read, exit_code] { *exit_code = RunReadWrite(*read, IoKind::kRead); });
  CLI::App* w = aio->add_subcommand("write", "Sequential writes");
  AddCommonOptions(w, *write, false);
  w->callback([write, exit_code] { *exit_code = RunReadWrite(*write, IoKind::kWrite); });

  auto sweep = std::make_shared<CliSweep>();
  sweep->c.size = "1G";
  CLI::App* s = aio->add_subcommand("sweep",
                                    "Block size x queue depth x threads, read and write; writes the best "
                                    "`aio` settings as a config file");
  AddCommonOptions(s, sweep->c, true);
  s->add_option("--output", sweep->output, "Where to write the recommended config")->capture_default_str();
  s->add_option("--svg", sweep->svg, "Also draw a GB/s heatmap (block size x queue depth) for read and write");
  s->callback([sweep, exit_code] { *exit_code = RunSweep(*sweep); });
}

}  // namespace zinf::bench
