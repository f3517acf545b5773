// `zinf bench comm`: the collectives of zinf's MPI communicator, run under
// mpirun (`mpirun -np 4 zinf bench comm`; one rank without mpirun), against
// Open MPI's own collectives on the same sizes in the same run.
//
// Figures are defined as nccl-tests defines them (doc/PERFORMANCE.md):
//   size   all_reduce, broadcast: the buffer; all_gather: the gathered
//          output (n x per-rank); reduce_scatter: the input (n x per-rank)
//   time   per collective: --iters back-to-back collectives on one stream,
//          after --warmup, divided by --iters; the slowest rank's time
//   algbw  size / time
//   busbw  algbw x factor: all_reduce 2(n-1)/n, all_gather and
//          reduce_scatter (n-1)/n, broadcast 1 — the bytes each rank's link
//          must carry for an optimal algorithm, comparable across n.
// GB/s are 10^9 bytes per second. "vs mpi" is zinf's busbw over Open MPI's
// (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Bcast on
// plain host buffers; fp32 only for the reductions, MPI has no bf16/fp16 sum).
// On one machine this measures shared-memory MPI (Open MPI's vader BTL):
// memory bandwidth and the cores, not a network. zinf's buffers are
// HostDevice memory and its collectives run on a HostDevice stream, as in
// training. Rank 0 prints; not thread-safe (runs from the CLI's thread).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "common/communicator.h"
#include "common/units.h"
#include "cpu/host_device.h"
#include "cpu/mpi_comm.h"
#include "zinf/dtype.h"

namespace zinf::bench {
namespace {

struct Options {
  std::string sizes = "4K..256M";
  std::string dtype = "fp32";
  std::vector<std::string> collectives = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
  int iters = 20;
  int warmup = 5;
  double timeout_seconds = 60;
  bool no_reference = false;
  bool json = false;
};

// "4K..256M" (doubling), "1M", or "4K,1M,64M".
Result<std::vector<uint64_t>> ParseSizes(const std::string& text) {
  std::vector<uint64_t> sizes;
  if (auto dots = text.find(".."); dots != std::string::npos) {
    ZINF_ASSIGN_OR_RETURN(uint64_t lo, ParseSize(text.substr(0, dots)));
    ZINF_ASSIGN_OR_RETURN(uint64_t hi, ParseSize(text.substr(dots + 2)));
    if (lo == 0 || lo > hi) return InvalidArgument("--sizes " + text + ": want MIN..MAX with 0 < MIN <= MAX");
    for (uint64_t s = lo; s <= hi; s *= 2) sizes.push_back(s);
    return sizes;
  }
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    ZINF_ASSIGN_OR_RETURN(uint64_t s, ParseSize(item));
    if (s == 0) return InvalidArgument("--sizes: 0 bytes");
    sizes.push_back(s);
  }
  if (sizes.empty()) return InvalidArgument("--sizes is empty");
  return sizes;
}

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast };

struct Collective {
  Kind kind;
  const char* name;
};
constexpr Collective kCollectives[] = {{Kind::kAllReduce, "all_reduce"},
                                       {Kind::kAllGather, "all_gather"},
                                       {Kind::kReduceScatter, "reduce_scatter"},
                                       {Kind::kBroadcast, "broadcast"}};

double BusFactor(Kind kind, int n) {
  switch (kind) {
    case Kind::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Kind::kAllGather:
    case Kind::kReduceScatter:
      return static_cast<double>(n - 1) / n;
    case Kind::kBroadcast:
      return 1.0;
  }
  return 1.0;
}

// One measured case. `count` is the collective's count argument; send/recv
// are the byte sizes of its buffers.
struct Shape {
  size_t count = 0;
  uint64_t size_bytes = 0;  // nccl-tests' size, after rounding to whole elements per rank
  uint64_t send_bytes = 0, recv_bytes = 0;
};

Shape ShapeFor(Kind kind, uint64_t size, size_t elem, int n) {
  Shape s;
  switch (kind) {
    case Kind::kAllReduce:
    case Kind::kBroadcast:
      s.count = size / elem;
      s.size_bytes = s.send_bytes = s.recv_bytes = s.count * elem;
      break;
    case Kind::kAllGather:
      s.count = size / elem / n;
      s.size_bytes = s.recv_bytes = s.count * elem * n;
      s.send_bytes = s.count * elem;
      break;
    case Kind::kReduceScatter:
      s.count = size / elem / n;
      s.size_bytes = s.send_bytes = s.count * elem * n;
      s.recv_bytes = s.count * elem;
      break;
  }
  return s;
}

class Runner {
 public:
  Runner(Communicator& comm, Device& device, Stream& stream, const Options& opt, DType dtype)
      : comm_(comm), device_(device), stream_(stream), opt_(opt), dtype_(dtype) {}

  // Seconds per collective on the slowest rank.
  Result<double> TimeZinf(Kind kind, const Shape& s) {
    ZINF_ASSIGN_OR_RETURN(void* send, device_.Allocate(std::max<uint64_t>(s.send_bytes, 1), stream_));
    ZINF_ASSIGN_OR_RETURN(void* recv, device_.Allocate(std::max<uint64_t>(s.recv_bytes, 1), stream_));
    // 0x3c bytes: normal numbers in every dtype (fp32 0.0115, bf16 0.0115, fp16 1.06).
    ZINF_RETURN_IF_ERROR(device_.Memset(send, 0x3c, s.send_bytes, stream_));
    ZINF_RETURN_IF_ERROR(device_.Memset(recv, 0, s.recv_bytes, stream_));
    auto enqueue = [&]() -> Status {
      switch (kind) {
        case Kind::kAllReduce:
          return comm_.AllReduce(send, recv, s.count, dtype_, ReduceOp::kSum, stream_);
        case Kind::kAllGather:
          return comm_.AllGather(send, recv, s.count, dtype_, stream_);
        case Kind::kReduceScatter:
          return comm_.ReduceScatter(send, recv, s.count, dtype_, ReduceOp::kSum, stream_);
        case Kind::kBroadcast:
          return comm_.Broadcast(send, s.count, dtype_, 0, stream_);
      }
      return Internal("unknown collective");
    };
    for (int i = 0; i < opt_.warmup; ++i) ZINF_RETURN_IF_ERROR(enqueue());
    ZINF_RETURN_IF_ERROR(comm_.Barrier(stream_));
    ZINF_RETURN_IF_ERROR(stream_.Synchronize());
    const double t0 = NowSeconds();
    for (int i = 0; i < opt_.iters; ++i) ZINF_RETURN_IF_ERROR(enqueue());
    ZINF_RETURN_IF_ERROR(stream_.Synchronize());
    const double seconds = (NowSeconds() - t0) / opt_.iters;
    ZINF_RETURN_IF_ERROR(device_.Free(send, stream_));
    ZINF_RETURN_IF_ERROR(device_.Free(recv, stream_));
    return SlowestRank(seconds);
  }

  // The same through Open MPI's own collective; 0 where there is none.
  Result<double> TimeMpi(Kind kind, const Shape& s) {
    const bool reduces = kind == Kind::kAllReduce || kind == Kind::kReduceScatter;
    if (reduces && dtype_ != DType::kFloat32) return 0.0;
    std::vector<uint8_t> send(std::max<uint64_t>(s.send_bytes, 1), 0x3c), recv(std::max<uint64_t>(s.recv_bytes, 1), 0);
    const int bytes_per_rank = static_cast<int>(s.count * DTypeSizeBytes(dtype_));
    auto run = [&]() -> int {
      switch (kind) {
        case Kind::kAllReduce:
          return MPI_Allreduce(send.data(), recv.data(), static_cast<int>(s.count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        case Kind::kAllGather:
          return MPI_Allgather(send.data(), bytes_per_rank, MPI_BYTE, recv.data(), bytes_per_rank, MPI_BYTE,
                               MPI_COMM_WORLD);
        case Kind::kReduceScatter:
          return MPI_Reduce_scatter_block(send.data(), recv.data(), static_cast<int>(s.count), MPI_FLOAT, MPI_SUM,
                                          MPI_COMM_WORLD);
        case Kind::kBroadcast:
          return MPI_Bcast(send.data(), bytes_per_rank, MPI_BYTE, 0, MPI_COMM_WORLD);
      }
      return MPI_ERR_OTHER;
    };
    for (int i = 0; i < opt_.warmup; ++i)
      if (run() != MPI_SUCCESS) return Internal("MPI reference collective failed");
    if (MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) return Internal("MPI_Barrier failed");
    const double t0 = NowSeconds();
    for (int i = 0; i < opt_.iters; ++i)
      if (run() != MPI_SUCCESS) return Internal("MPI reference collective failed");
    return SlowestRank((NowSeconds() - t0) / opt_.iters);
  }

 private:
  // The max over ranks, through the communicator itself (host memory, inline stream).
  Result<double> SlowestRank(double seconds) {
    float mine = static_cast<float>(seconds), slowest = 0;
    InlineHostStream host;
    ZINF_RETURN_IF_ERROR(comm_.AllReduce(&mine, &slowest, 1, DType::kFloat32, ReduceOp::kMax, host));
    ZINF_RETURN_IF_ERROR(host.Synchronize());
    return static_cast<double>(slowest);
  }

  Communicator& comm_;
  Device& device_;
  Stream& stream_;
  const Options& opt_;
  DType dtype_;
};

// Prints the error; returns the exit code (2: bad options, 1: the run failed).
int Fail(const std::string& what, int code = 1) {
  std::fprintf(stderr, "zinf bench comm: %s\n", what.c_str());
  return code;
}

int Run(const Options& opt) {
  auto sizes = ParseSizes(opt.sizes);
  if (!sizes.ok()) return Fail(sizes.status().message(), 2);
  auto dtype = ParseDType(opt.dtype);
  if (!dtype.ok()) return Fail("--dtype: " + dtype.status().message(), 2);
  if (opt.iters < 1 || opt.warmup < 0) return Fail("--iters must be >= 1 and --warmup >= 0", 2);
  std::vector<Collective> chosen;
  for (const std::string& name : opt.collectives) {
    auto it = std::find_if(std::begin(kCollectives), std::end(kCollectives),
                           [&](const Collective& c) { return name == c.name; });
    if (it == std::end(kCollectives))
      return Fail("--collectives: unknown '" + name + "'; expected all_reduce, all_gather, reduce_scatter, broadcast",
                  2);
    chosen.push_back(*it);
  }

  auto comm = cpu::CreateMpiCommunicator(CommOptions{.timeout_seconds = opt.timeout_seconds});
  if (!comm.ok()) return Fail(comm.status().ToString());
  const int n = (*comm)->size(), rank = (*comm)->rank();
  const uint64_t max_size = *std::max_element(sizes->begin(), sizes->end());
  // Send + receive of the largest case, plus the allocator's rounding.
  auto device = cpu::CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 2 * max_size + (64ull << 20)});
  if (!device.ok()) return Fail(device.status().ToString());
  auto stream = (*device)->CreateStream();
  if (!stream.ok()) return Fail(stream.status().ToString());
  int mpi_initialized = 0;
  MPI_Initialized(&mpi_initialized);
  const bool reference = mpi_initialized && !opt.no_reference;

  const bool print = rank == 0;
  if (print && !opt.json) {
    std::printf(
        "# zinf bench comm: %d rank(s), %s, zinf MpiComm (all-to-all + rank-order sum, HostDevice stream)%s\n", n,
        std::string(DTypeName(*dtype)).c_str(),
        reference ? " vs Open MPI's collectives" : (mpi_initialized ? "" : ", no MPI (1 rank, not under mpirun)"));
    std::printf(
        "# time: mean of %d back-to-back collectives after %d warm-up, slowest rank; "
        "algbw = size/time, busbw = algbw x (all_reduce 2(n-1)/n, all_gather/reduce_scatter (n-1)/n, "
        "broadcast 1); GB/s = 1e9 B/s\n",
        opt.iters, opt.warmup);
    std::printf("%-15s %12s %12s %11s %10s %10s %11s %10s %7s\n", "collective", "size(B)", "count", "time(us)", "algbw",
                "busbw", "mpi(us)", "mpi_busbw", "vs_mpi");
  }
  nlohmann::json out = {{"bench", "comm"},    {"ranks", n},           {"dtype", std::string(DTypeName(*dtype))},
                        {"iters", opt.iters}, {"warmup", opt.warmup}, {"rows", nlohmann::json::array()}};
  Runner runner(**comm, **device, **stream, opt, *dtype);
  const size_t elem = DTypeSizeBytes(*dtype);
  for (const Collective& c : chosen) {
    for (uint64_t size : *sizes) {
      const Shape s = ShapeFor(c.kind, size, elem, n);
      if (s.count == 0) continue;  // smaller than one element per rank
      auto t = runner.TimeZinf(c.kind, s);
      if (!t.ok()) return Fail(std::string(c.name) + " " + FormatBytes(size) + ": " + t.status().ToString());
      double mpi_t = 0;
      if (reference) {
        auto r = runner.TimeMpi(c.kind, s);
        if (!r.ok()) return Fail(std::string(c.name) + " reference: " + r.status().ToString());
        mpi_t = *r;
      }
      const double factor = BusFactor(c.kind, n);
      const double algbw = s.size_bytes / *t / 1e9, busbw = algbw * factor;
      const double mpi_busbw = mpi_t > 0 ? s.size_bytes / mpi_t / 1e9 * factor : 0;
      if (!print) continue;
      if (opt.json) {
        nlohmann::json row = {{"collective", c.name}, {"size_bytes", s.size_bytes}, {"count", s.count},
                              {"time_us", *t * 1e6},  {"algbw_gbps", algbw},        {"busbw_gbps", busbw}};
        if (mpi_t > 0) {
          row["mpi_time_us"] = mpi_t * 1e6;
          row["mpi_busbw_gbps"] = mpi_busbw;
          row["ratio_to_mpi"] = mpi_t / *t;
        }
        out["rows"].push_back(row);
      } else if (mpi_t > 0) {
        std::printf("%-15s %12llu %12zu %11.1f %10.3f %10.3f %11.1f %10.3f %7.2f\n", c.name,
                    static_cast<unsigned long long>(s.size_bytes), s.count, *t * 1e6, algbw, busbw, mpi_t * 1e6,
                    mpi_busbw, mpi_t / *t);
      } else {
        std::printf("%-15s %12llu %12zu %11.1f %10.3f %10.3f %11s %10s %7s\n", c.name,
                    static_cast<unsigned long long>(s.size_bytes), s.count, *t * 1e6, algbw, busbw, "-", "-", "-");
      }
      std::fflush(stdout);
    }
  }
  if (print && opt.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

void RegisterComm(CLI::App& bench, int* exit_code) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "comm", "Collectives of the MPI communicator (run under mpirun), algbw/busbw as nccl-tests, vs Open MPI");
  cmd->add_option("--sizes", opt->sizes, "MIN..MAX (doubling) or a comma list, e.g. 4K..256M")->capture_default_str();
  cmd->add_option("--dtype", opt->dtype, "fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--collectives", opt->collectives, "Any of all_reduce all_gather reduce_scatter broadcast")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--iters", opt->iters, "Timed collectives per case")->capture_default_str();
  cmd->add_option("--warmup", opt->warmup, "Untimed collectives per case first")->capture_default_str();
  cmd->add_option("--timeout", opt->timeout_seconds, "Communicator deadline in seconds")->capture_default_str();
  cmd->add_flag("--no-reference", opt->no_reference, "Skip Open MPI's own collectives");
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of the table");
  cmd->callback([opt, exit_code] { *exit_code = Run(*opt); });
}

}  // namespace zinf::bench
