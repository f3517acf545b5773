// `zinf bench io --path DIR`: sequential read and write bandwidth of zinf's
// I/O engine on one pre-written file, against fio with io_uring and O_DIRECT
// at identical settings, measured in the same run and interleaved round by
// round so both see the same machine.
//
// Which tool runs first alternates every round (ABBA): virtual disks may
// cache on the host and favour whichever run comes second.
//
// Settings map one to one: block size = fio --bs; queue depth per ring =
// fio --iodepth per job; rings = fio --numjobs, each fio job on its own
// region (--offset_increment), each zinf ring fed every rings-th block. GB/s
// counts 10^9 bytes of payload per second. CPU seconds per GB come from
// getrusage (zinf: this process; fio: the child), so kernel time spent on
// the caller's behalf is counted for both.
//
// Buffer memory decides the figure on some machines (a VM's O_DIRECT
// requests from 4 KiB pages are split per page): zinf's buffers are huge
// pages, fio's are 4 KiB pages unless --fio-iomem shmhuge gives it huge pages
// from the hugetlb pool. The header says which pairing ran; the like-for-like
// one is --fio-iomem shmhuge (bench/aio_vs_fio.sh runs both).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "common/units.h"
#include "cpu/io_memory.h"
#include "nvme/io_engine.h"

namespace zinf::bench {
namespace {

using nvme::IoEngine;
using nvme::IoKind;

struct Case {
  uint64_t block_size;
  unsigned queue_depth;
  unsigned rings;
};

struct Options {
  std::string dir;
  std::string size = "4G";
  int rounds = 3;
  std::vector<std::string> cases = {"1M:16:1", "8M:32:2"};
  bool no_fio = false;
  std::string fio_iomem;  // fio --iomem; empty: fio's default (malloc, 4 KiB pages)
  bool keep = false;
  bool json = false;
};

double CpuSeconds(int who) {
  rusage ru{};
  getrusage(who, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

struct Measurement {
  double gbps = 0;
  double cpu_s_per_gb = 0;
};

// Streams `bytes` sequentially through the engine, keeping queue_depth x
// rings blocks in flight, one block per request, like fio's jobs.
Result<Measurement> RunZinf(const Case& c, IoKind kind, const std::string& path, uint64_t bytes) {
  nvme::IoEngineOptions o;
  o.backend = nvme::IoBackend::kUring;
  o.block_size = c.block_size;
  o.queue_depth = c.queue_depth;
  o.rings = c.rings;
  ZINF_ASSIGN_OR_RETURN(auto engine, IoEngine::Create(o));
  nvme::FileOptions fo;
  ZINF_ASSIGN_OR_RETURN(auto file, engine->Open(path, fo));
  const unsigned slots = c.queue_depth * c.rings;
  cpu::IoMemory pool = cpu::AllocateIoMemory(uint64_t{slots} * c.block_size);  // huge pages: see cpu/io_memory.h
  if (!pool) return OutOfMemory("cannot allocate " + FormatBytes(uint64_t{slots} * c.block_size) + " of I/O buffers");
  std::mt19937_64 rng(1);
  for (uint64_t i = 0; i < slots * c.block_size / 8; ++i) reinterpret_cast<uint64_t*>(pool.get())[i] = rng();
  for (unsigned s = 0; s < slots; ++s) {
    // Register each slot (<= 1 GiB each) so the ring uses fixed buffers.
    ZINF_RETURN_IF_ERROR(engine->RegisterBuffer(pool.get() + s * c.block_size, c.block_size));
  }
  const uint64_t blocks = bytes / c.block_size;
  std::deque<std::pair<nvme::IoRequest, unsigned>> inflight;
  std::vector<unsigned> free_slots;
  for (unsigned s = 0; s < slots; ++s) free_slots.push_back(s);
  double cpu0 = CpuSeconds(RUSAGE_SELF), t0 = NowSeconds();
  for (uint64_t b = 0; b < blocks || !inflight.empty();) {
    while (b < blocks && !free_slots.empty()) {
      unsigned s = free_slots.back();
      free_slots.pop_back();
      char* buf = pool.get() + s * c.block_size;
      auto req = kind == IoKind::kRead ? engine->Read(file, b * c.block_size, buf, c.block_size)
                                       : engine->Write(file, b * c.block_size, buf, c.block_size);
      inflight.emplace_back(req, s);
      ++b;
    }
    ZINF_RETURN_IF_ERROR(inflight.front().first.Wait());
    free_slots.push_back(inflight.front().second);
    inflight.pop_front();
  }
  double seconds = NowSeconds() - t0, cpu = CpuSeconds(RUSAGE_SELF) - cpu0;
  double gb = static_cast<double>(blocks * c.block_size) / 1e9;
  return Measurement{gb / seconds, cpu / gb};
}

Result<Measurement> RunFio(const Case& c, IoKind kind, const std::string& path, uint64_t bytes,
                           const std::string& iomem) {
  const uint64_t per_job = bytes / c.rings;
  std::string out_path = path + ".fio.json";
  std::string cmd =
      "fio --name=zinf-ref --filename=" + path + " --rw=" + (kind == IoKind::kRead ? "read" : "write") +
      " --bs=" + std::to_string(c.block_size) + " --iodepth=" + std::to_string(c.queue_depth) +
      " --numjobs=" + std::to_string(c.rings) + " --size=" + std::to_string(per_job) +
      " --offset_increment=" + std::to_string(per_job) +
      " --ioengine=io_uring --direct=1 --thread=0 --group_reporting --output-format=json --output=" + out_path +
      (iomem.empty() ? "" : " --iomem=" + iomem) + " > /dev/null 2>&1";
  double cpu0 = CpuSeconds(RUSAGE_CHILDREN);
  int rc = std::system(cmd.c_str());
  double cpu = CpuSeconds(RUSAGE_CHILDREN) - cpu0;
  if (rc != 0) return IoError("fio failed (exit " + std::to_string(WEXITSTATUS(rc)) + "): " + cmd);
  std::FILE* f = std::fopen(out_path.c_str(), "r");
  if (!f) return IoError("fio wrote no output at " + out_path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    std::fclose(f);
    return IoError(std::string("cannot parse fio's JSON: ") + e.what());
  }
  std::fclose(f);
  std::filesystem::remove(out_path);
  const auto& side = j["jobs"][0][kind == IoKind::kRead ? "read" : "write"];
  double bw = side["bw_bytes"].get<double>();
  double gb = static_cast<double>(side["io_bytes"].get<uint64_t>()) / 1e9;
  return Measurement{bw / 1e9, cpu / gb};
}

Result<Case> ParseCase(const std::string& text) {
  // "BS:QD:RINGS", e.g. "8M:32:2"
  auto c1 = text.find(':'), c2 = text.rfind(':');
  if (c1 == std::string::npos || c1 == c2)
    return InvalidArgument("case '" + text + "': expected BLOCK:QD:RINGS, e.g. 8M:32:2");
  ZINF_ASSIGN_OR_RETURN(uint64_t bs, ParseSize(text.substr(0, c1)));
  int qd = std::atoi(text.substr(c1 + 1, c2 - c1 - 1).c_str()), rings = std::atoi(text.substr(c2 + 1).c_str());
  if (bs == 0 || bs % 4096 || qd < 1 || rings < 1)
    return InvalidArgument("case '" + text + "': block size must be a multiple of 4 KiB, queue depth and rings >= 1");
  return Case{bs, static_cast<unsigned>(qd), static_cast<unsigned>(rings)};
}

int Run(const Options& opt) {
  auto size = ParseSize(opt.size);
  if (!size.ok()) {
    std::fprintf(stderr, "zinf bench io: --size: %s\n", size.status().message().c_str());
    return 2;
  }
  std::vector<Case> cases;
  for (const auto& t : opt.cases) {
    auto c = ParseCase(t);
    if (!c.ok()) {
      std::fprintf(stderr, "zinf bench io: %s\n", c.status().message().c_str());
      return 2;
    }
    if (*size % (c->block_size * c->rings)) {
      std::fprintf(stderr, "zinf bench io: --size %s is not a multiple of block size x rings for case %s\n",
                   opt.size.c_str(), t.c_str());
      return 2;
    }
    cases.push_back(*c);
  }
  if (!std::filesystem::is_directory(opt.dir)) {
    std::fprintf(stderr, "zinf bench io: --path %s is not a directory\n", opt.dir.c_str());
    return 2;
  }
  bool fio = !opt.no_fio && std::system("command -v fio > /dev/null 2>&1") == 0;
  if (!opt.no_fio && !fio) {
    std::fprintf(stderr,
                 "zinf bench io: fio not found; install it (apt-get install fio, or scripts/setup --with fio) "
                 "or pass --no-fio\n");
    return 1;
  }
  const std::string path = opt.dir + "/zinf-bench-io.dat";

  // Lay the file out once with real data, so no read ever touches an
  // unwritten extent (those read back at memory speed).
  if (!opt.json) {
    std::printf("# zinf bench io: %s file %s, %d rounds, reference fio %s\n", FormatBytes(*size).c_str(), path.c_str(),
                opt.rounds, fio ? "(io_uring, direct=1, same bs/iodepth/numjobs)" : "off");
    if (fio) {
      std::printf(
          "# buffers: zinf huge pages; fio %s\n",
          opt.fio_iomem.empty()
              ? "its default, 4 KiB pages (not like for like: buffer memory can decide the figure; "
                "--fio-iomem shmhuge with a hugetlb pool, or bench/aio_vs_fio.sh, gives the like-for-like pairing)"
              : ("--iomem=" + opt.fio_iomem).c_str());
    }
  }
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "zinf bench io: cannot create %s\n", path.c_str());
      return 1;
    }
    std::fclose(f);
    auto laid = RunZinf(Case{8 << 20, 8, 1}, IoKind::kWrite, path, *size);
    if (!laid.ok()) {
      std::fprintf(stderr, "zinf bench io: laying out %s: %s\n", path.c_str(), laid.status().message().c_str());
      std::filesystem::remove(path);
      return 1;
    }
    ::sync();
  }

  nlohmann::json out = {{"bench", "io"},
                        {"file", path},
                        {"bytes", *size},
                        {"rounds", opt.rounds},
                        {"fio_iomem", opt.fio_iomem.empty() ? "default" : opt.fio_iomem},
                        {"cases", nlohmann::json::array()}};
  if (!opt.json)
    std::printf("%-8s %4s %5s %-5s %10s %10s %7s %12s %12s\n", "block", "qd", "rings", "op", "zinf GB/s", "fio GB/s",
                "ratio", "zinf cpu s/GB", "fio cpu s/GB");
  int rc = 0;
  for (const Case& c : cases) {
    for (IoKind kind : {IoKind::kWrite, IoKind::kRead}) {
      std::vector<double> z, f, zc, fc;
      for (int r = 0; r < opt.rounds; ++r) {
        // Alternate who goes first (ABBA): a virtual disk may cache on the
        // host and favour whichever run comes second.
        for (int turn = 0; turn < 2; ++turn) {
          bool zinf_turn = (turn == 0) == (r % 2 == 0);
          if (!zinf_turn && !fio) continue;
          auto m = zinf_turn ? RunZinf(c, kind, path, *size) : RunFio(c, kind, path, *size, opt.fio_iomem);
          if (!m.ok()) {
            std::fprintf(stderr, "zinf bench io: %s\n", m.status().message().c_str());
            return 1;
          }
          (zinf_turn ? z : f).push_back(m->gbps);
          (zinf_turn ? zc : fc).push_back(m->cpu_s_per_gb);
        }
      }
      double zm = Median(z), fm = Median(f);
      const char* op = kind == IoKind::kRead ? "read" : "write";
      if (opt.json) {
        nlohmann::json row = {
            {"block_size", c.block_size}, {"queue_depth", c.queue_depth},    {"rings", c.rings}, {"op", op},
            {"zinf_gb_per_s", zm},        {"zinf_cpu_s_per_gb", Median(zc)}, {"zinf_rounds", z}};
        if (fio) {
          row["fio_gb_per_s"] = fm;
          row["fio_cpu_s_per_gb"] = Median(fc);
          row["ratio"] = zm / fm;
          row["fio_rounds"] = f;
        }
        out["cases"].push_back(row);
      } else {
        std::printf("%-8s %4u %5u %-5s %10.2f %10s %7s %12.3f %12s\n", FormatBytes(c.block_size).c_str(), c.queue_depth,
                    c.rings, op, zm, fio ? std::to_string(fm).substr(0, 5).c_str() : "-",
                    fio ? std::to_string(zm / fm).substr(0, 5).c_str() : "-", Median(zc),
                    fio ? std::to_string(Median(fc)).substr(0, 5).c_str() : "-");
        std::fflush(stdout);
      }
    }
  }
  if (opt.json) std::printf("%s\n", out.dump(2).c_str());
  if (!opt.keep) std::filesystem::remove(path);
  return rc;
}

}  // namespace

void RegisterIo(CLI::App& bench, int* exit_code) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd =
      bench.add_subcommand("io", "Sequential NVMe read/write through zinf's I/O engine vs fio, same settings");
  cmd->add_option("--path", opt->dir, "Directory for the test file (on the drive to measure)")->required();
  cmd->add_option("--size", opt->size, "File size")->capture_default_str();
  cmd->add_option("--rounds", opt->rounds, "Rounds per case (zinf and fio interleaved); medians are reported")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--case", opt->cases, "BLOCK:QUEUE_DEPTH:RINGS, repeatable (default 1M:16:1 and 8M:32:2)");
  cmd->add_flag("--no-fio", opt->no_fio, "Skip the fio reference");
  cmd->add_option("--fio-iomem", opt->fio_iomem,
                  "fio's --iomem for its buffers, e.g. shmhuge (huge pages from the "
                  "hugetlb pool, as zinf's: like for like); default: fio's, 4 KiB pages");
  cmd->add_flag("--keep", opt->keep, "Keep the test file");
  cmd->add_flag("--json", opt->json, "Print one JSON object");
  cmd->callback([opt, exit_code] { *exit_code = Run(*opt); });
}

}  // namespace zinf::bench
