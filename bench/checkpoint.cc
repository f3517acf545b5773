// `zinf bench checkpoint`: Save and Load of an engine whose optimizer state
// lives on NVMe (or in pinned host memory), against the bound measured in the
// same run: zinf's I/O engine copying the same number of bytes between the
// two directories (read from one, write to the other, pipelined through the
// same buffers a copy tool would use), with nothing else running.
//
//   zinf bench checkpoint --params 1B --path DIR [--ckpt-path DIR2] [--offload nvme|cpu]
//                         [--sub-group-size 100M] [--rounds 3] [--json]
//
// Save reads each sub-group of [master | m | v] from the swap store and
// streams this rank's slices into DIR2/step-0/rank-0.bin; Load reads them back
// (verifying every XXH3) and writes the sub-groups to the store. Both move
// 12 B/param out of one directory and into the other, as the bound does.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/units.h"
#include "cpu/host_device.h"
#include "nvme/io_engine.h"
#include "zinf/engine.h"

namespace zinf::bench {
namespace {

struct Options {
  std::string params = "1B";
  std::string path, ckpt_path;
  std::string offload = "nvme";
  std::string sub_group_size = "100M";
  int units = 24;
  int rounds = 3;
  bool json = false;
};

struct Fail {
  int code;
};
template <class T>
T Check(Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "zinf bench checkpoint: %s: %s\n", what, r.status().ToString().c_str());
    throw Fail{1};
  }
  return std::move(*r);
}
void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "zinf bench checkpoint: %s: %s\n", what, s.ToString().c_str());
    throw Fail{1};
  }
}

// Copies `bytes` from `src` to `dst` through `io`: reads and writes of
// `chunk` bytes pipelined over `depth` buffers. Returns seconds.
double Copy(nvme::IoEngine& io, const std::shared_ptr<nvme::File>& src, const std::shared_ptr<nvme::File>& dst,
            uint64_t bytes, uint64_t chunk, int depth) {
  std::vector<std::unique_ptr<char, decltype(&std::free)>> bufs;
  for (int i = 0; i < depth; ++i) {
    bufs.emplace_back(static_cast<char*>(std::aligned_alloc(4096, chunk)), &std::free);
    std::memset(bufs.back().get(), 0, chunk);
  }
  const uint64_t chunks = (bytes + chunk - 1) / chunk;
  std::vector<nvme::IoRequest> reads(depth), writes(depth);
  const double t0 = NowSeconds();
  auto issue_read = [&](uint64_t c) {
    const int b = static_cast<int>(c % depth);
    if (writes[b].valid()) Check(writes[b].Wait(), "bound: write");
    reads[b] = io.Read(src, c * chunk, bufs[b].get(), std::min(chunk, bytes - c * chunk));
  };
  for (uint64_t c = 0; c < std::min<uint64_t>(chunks, depth); ++c) issue_read(c);
  for (uint64_t c = 0; c < chunks; ++c) {
    const int b = static_cast<int>(c % depth);
    Check(reads[b].Wait(), "bound: read");
    writes[b] = io.Write(dst, c * chunk, bufs[b].get(), std::min(chunk, bytes - c * chunk));
    if (c + depth < chunks) issue_read(c + depth);
  }
  for (auto& w : writes) {
    if (w.valid()) Check(w.Wait(), "bound: write");
  }
  Check(::fsync(dst->fd()) == 0 ? Status::Ok() : IoError("fsync " + dst->path()), "bound: fsync");
  return NowSeconds() - t0;
}

int Run(const Options& opt) {
  auto count = ParseCount(opt.params);
  auto sub_group = ParseCount(opt.sub_group_size);
  if (!count.ok() || *count < static_cast<uint64_t>(opt.units) || opt.units < 1 || opt.rounds < 1 || !sub_group.ok() ||
      *sub_group == 0 || opt.path.empty() || (opt.offload != "nvme" && opt.offload != "cpu")) {
    std::fprintf(stderr,
                 "zinf bench checkpoint: --path DIR is required; --params a count >= --units; --rounds >= 1; "
                 "--sub-group-size a positive count; --offload nvme or cpu\n");
    return 2;
  }
  namespace fs = std::filesystem;
  const std::string ckpt_root = opt.ckpt_path.empty() ? opt.path : opt.ckpt_path;
  const std::string swap_dir = opt.path + "/zinf-bench-swap", ckpt_dir = ckpt_root + "/zinf-bench-ckpt";
  std::error_code ec;
  for (const std::string& d : {swap_dir, ckpt_dir}) {
    fs::remove_all(d, ec);
    if (!fs::create_directories(d, ec) && ec) {
      std::fprintf(stderr, "zinf bench checkpoint: cannot create %s: %s\n", d.c_str(), ec.message().c_str());
      return 2;
    }
  }
  struct Cleanup {
    std::vector<std::string> dirs;
    ~Cleanup() {
      std::error_code e;
      for (const auto& d : dirs) fs::remove_all(d, e);
    }
  } cleanup{{swap_dir, ckpt_dir}};
  const bool nvme = opt.offload == "nvme";
  const int64_t per_unit = static_cast<int64_t>(*count) / opt.units;
  const int64_t P = per_unit * opt.units;
  const uint64_t state_bytes = static_cast<uint64_t>(P) * 12;
  if (!opt.json) {
    std::printf(
        "# zinf bench checkpoint: %s parameters in %d units, optimizer state (%s) on %s, checkpoint in %s, "
        "%d rounds, %u cores\n",
        FormatCount(static_cast<double>(P)).c_str(), opt.units, FormatBytes(state_bytes).c_str(),
        nvme ? swap_dir.c_str() : "pinned host memory", ckpt_dir.c_str(), opt.rounds,
        std::thread::hardware_concurrency());
    std::fflush(stdout);
  }

  // The engine, its state written to the store once (before any timing).
  Config c;
  c.bf16.enabled = true;
  c.zero.stage = 0;
  c.zero.offload_optimizer.device = nvme ? OffloadDevice::kNvme : OffloadDevice::kCpu;
  if (nvme) {
    c.zero.offload_optimizer.nvme_path = {swap_dir};
    c.zero.sub_group_size = static_cast<int64_t>(*sub_group);
  }
  c.zero.offload_optimizer.pin_memory = true;
  DeviceOptions dopt;
  dopt.spec = "cpu";
  dopt.memory_budget = static_cast<uint64_t>(P) * 6 + (uint64_t{512} << 20);
  auto device = Check(cpu::CreateHostDevice(dopt), "device");
  auto engine = Check(Engine::Create(c, *device, nullptr), "engine");
  {
    std::vector<float> init(per_unit);
    for (int u = 0; u < opt.units; ++u) {
      for (int64_t i = 0; i < per_unit; ++i) init[i] = static_cast<float>((i * 2654435761u + u) % 1000003) * 1e-6f;
      Check(engine->AddUnit("unit" + std::to_string(u), {{"w", {per_unit}, DType::kFloat32, init.data()}}), "register");
    }
  }
  {
    std::vector<float> probe(per_unit);
    Check(engine->ReadState(0, StateKind::kMaster, probe.data()), "first touch");  // writes the initial state
  }

  // Save and Load, `rounds` times each.
  std::vector<double> save_s, load_s;
  for (int r = 0; r < opt.rounds; ++r) {
    fs::remove_all(ckpt_dir + "/step-0", ec);
    if (!opt.json) std::fprintf(stderr, "  save %d/%d...\n", r + 1, opt.rounds);
    double t0 = NowSeconds();
    Check(engine->Save(ckpt_dir), "save");
    save_s.push_back(NowSeconds() - t0);
    if (!opt.json) std::fprintf(stderr, "  load %d/%d...\n", r + 1, opt.rounds);
    t0 = NowSeconds();
    Check(engine->Load(ckpt_dir), "load");
    load_s.push_back(NowSeconds() - t0);
  }
  const uint64_t ckpt_bytes = fs::file_size(ckpt_dir + "/step-0/rank-0.bin");
  engine.reset();
  device.reset();

  // The bound: the same engine settings copying the same bytes from the swap
  // directory to the checkpoint directory (save), and back (load).
  double bound_save = 0, bound_load = 0;
  {
    auto io = Check(nvme::IoEngine::Create(nvme::IoEngineOptionsFromConfig(c)), "io engine");
    nvme::FileOptions fo;
    fo.create = true;
    fo.truncate = true;
    const std::string a_path = swap_dir + "/bound-a.bin", b_path = ckpt_dir + "/bound-b.bin";
    auto a = Check(io->Open(a_path, fo), "bound file");
    auto b = Check(io->Open(b_path, fo), "bound file");
    const uint64_t bytes = (state_bytes + 4095) / 4096 * 4096;
    const uint64_t chunk = 64ull << 20;  // bytes is a multiple of 4 KiB; chunks are too
    {                                    // lay out the source with real data
      std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(std::aligned_alloc(4096, chunk)), &std::free);
      for (uint64_t i = 0; i < chunk; ++i) buf.get()[i] = static_cast<char>(i * 131);
      std::vector<nvme::IoRequest> w;
      for (uint64_t off = 0; off < bytes; off += chunk) {
        w.push_back(io->Write(a, off, buf.get(), std::min(chunk, bytes - off)));
        if (w.size() >= 4) {
          Check(w.front().Wait(), "bound: lay out");
          w.erase(w.begin());
        }
      }
      for (auto& q : w) Check(q.Wait(), "bound: lay out");
    }
    if (!opt.json) std::fprintf(stderr, "  bound: copying %s each way...\n", FormatBytes(bytes).c_str());
    // The best of a few chunk sizes and depths, each way.
    bound_save = bound_load = 1e30;
    for (const auto& [bytes_per_chunk, depth] :
         {std::pair<uint64_t, int>{64ull << 20, 4}, {16ull << 20, 16}, {64ull << 20, 8}}) {
      bound_save = std::min(bound_save, Copy(*io, a, b, bytes, bytes_per_chunk, depth));
      bound_load = std::min(bound_load, Copy(*io, b, a, bytes, bytes_per_chunk, depth));
    }
  }
  const double save = Median(save_s), load = Median(load_s);
  const double save_gbs = state_bytes / save / 1e9, load_gbs = state_bytes / load / 1e9;
  const double bsave_gbs = state_bytes / bound_save / 1e9, bload_gbs = state_bytes / bound_load / 1e9;
  if (opt.json) {
    nlohmann::json j = {{"params", P},
                        {"offload", opt.offload},
                        {"state_bytes", state_bytes},
                        {"checkpoint_file_bytes", ckpt_bytes},
                        {"save_seconds", save_s},
                        {"load_seconds", load_s},
                        {"save_gbps", save_gbs},
                        {"load_gbps", load_gbs},
                        {"bound_save_seconds", bound_save},
                        {"bound_load_seconds", bound_load},
                        {"save_over_bound", save_gbs / bsave_gbs},
                        {"load_over_bound", load_gbs / bload_gbs}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "# bound: zinf's I/O engine copying the same %s between the two directories, the best of 64 MiB x 4, "
      "16 MiB x 16 and 64 MiB x 8 in flight, alone\n",
      FormatBytes(state_bytes).c_str());
  std::printf("%6s %12s %10s %12s %14s %8s\n", "", "median s", "GB/s", "bound s", "bound GB/s", "ratio");
  std::printf("%6s %12.2f %10.2f %12.2f %14.2f %8.2f\n", "save", save, save_gbs, bound_save, bsave_gbs,
              save_gbs / bsave_gbs);
  std::printf("%6s %12.2f %10.2f %12.2f %14.2f %8.2f\n", "load", load, load_gbs, bound_load, bload_gbs,
              load_gbs / bload_gbs);
  std::printf("# rounds: save");
  for (double s : save_s) std::printf(" %.2f", s);
  std::printf(" s; load");
  for (double s : load_s) std::printf(" %.2f", s);
  std::printf(" s; checkpoint file %s (slices 4 KiB-aligned)\n", FormatBytes(ckpt_bytes).c_str());
  return 0;
}

}  // namespace

void RegisterCheckpoint(CLI::App& bench, int* exit_code) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("checkpoint", "Engine Save/Load throughput vs copying the same bytes");
  cmd->add_option("--params", opt->params, "Parameters, e.g. 1B")->capture_default_str();
  cmd->add_option("--path", opt->path, "Directory of the optimizer state (the NVMe to measure)")->required();
  cmd->add_option("--ckpt-path", opt->ckpt_path, "Directory of the checkpoint (default: --path)");
  cmd->add_option("--offload", opt->offload, "nvme or cpu: where the optimizer state lives")->capture_default_str();
  cmd->add_option("--sub-group-size", opt->sub_group_size, "nvme: elements per sub-group (whole units)")
      ->capture_default_str();
  cmd->add_option("--units", opt->units, "Units the parameters are split into")->capture_default_str();
  cmd->add_option("--rounds", opt->rounds, "Saves and loads timed (median reported)")->capture_default_str();
  cmd->add_flag("--json", opt->json, "Print one JSON object");
  cmd->callback([opt, exit_code] {
    try {
      *exit_code = Run(*opt);
    } catch (const Fail& f) {
      *exit_code = f.code;
    }
  });
}

}  // namespace zinf::bench
