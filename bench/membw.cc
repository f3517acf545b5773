// `zinf bench membw`: this machine's memory bandwidth on a given footprint,
// the bound the CPU-side kernels (Adam, casts, norms) are measured against.
// Kernels (fp32, n elements per array, oneTBB arena of --threads):
//   copy     a[i] = b[i]              8n bytes moved  (the reference: memcpy-like)
//   triad    a[i] = b[i] + s*c[i]    12n bytes
//   update   a[i] += s*b[i]          12n bytes (the in-place pattern of Adam)
// Bytes count payload read + written, without write-allocate traffic, as
// STREAM does. Each figure is the median of --loops passes.
#include <CLI/CLI.hpp>
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "common/units.h"

namespace zinf::bench {
namespace {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

Buffer AllocAligned(size_t n) {
  void* p = std::aligned_alloc(4096, ((n * sizeof(float) + 4095) / 4096) * 4096);
  if (!p) {
    std::fprintf(stderr, "zinf bench membw: cannot allocate %zu bytes\n", n * sizeof(float));
    std::exit(1);
  }
  return Buffer(static_cast<float*>(p));
}

// Restrict-qualified so the compiler vectorizes without runtime alias checks.
__attribute__((noinline)) void Triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
                                     size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; ++i) a[i] = b[i] + s * c[i];
}
__attribute__((noinline)) void Update(float* __restrict a, const float* __restrict b, float s, size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; ++i) a[i] += s * b[i];
}

struct Options {
  std::string size = "1G";
  int threads = 2;
  int loops = 5;
  bool json = false;
};

// Chunks of >= 256 KiB per task: big enough that scheduling cost vanishes.
constexpr size_t kGrain = 64 * 1024;

template <typename Body>
double TimeKernel(tbb::task_arena& arena, size_t n, int loops, Body body) {
  std::vector<double> seconds;
  for (int l = 0; l < loops + 1; ++l) {  // the first pass warms pages and caches
    double t0 = NowSeconds();
    arena.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<size_t>(0, n, kGrain),
          [&](const tbb::blocked_range<size_t>& r) { body(r.begin(), r.end()); }, tbb::static_partitioner());
    });
    benchmark::ClobberMemory();
    if (l > 0) seconds.push_back(NowSeconds() - t0);
  }
  return Median(seconds);
}

int Run(const Options& opt) {
  auto bytes = ParseSize(opt.size);
  if (!bytes.ok()) {
    std::fprintf(stderr, "zinf bench membw: --size: %s\n", bytes.status().message().c_str());
    return 2;
  }
  if (opt.threads < 1 || opt.loops < 1) {
    std::fprintf(stderr, "zinf bench membw: --threads and --loops must be >= 1\n");
    return 2;
  }
  // --size is the footprint of one array.
  const size_t n = *bytes / sizeof(float);
  if (n < kGrain) {
    std::fprintf(stderr, "zinf bench membw: --size must be at least %zu bytes\n", kGrain * sizeof(float));
    return 2;
  }
  Buffer a = AllocAligned(n), b = AllocAligned(n), c = AllocAligned(n);
  tbb::task_arena arena(opt.threads);
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, n, kGrain),
        [&](const tbb::blocked_range<size_t>& r) {
          for (size_t i = r.begin(); i < r.end(); ++i) a[i] = 1.0f, b[i] = 2.0f, c[i] = 0.5f;
        },
        tbb::static_partitioner());
  });
  const float s = 1e-7f;
  float* pa = a.get();
  const float* pb = b.get();
  const float* pc = c.get();

  if (!opt.json) {
    std::printf("# zinf bench membw: 3 arrays x %s (fp32), %d thread(s), median of %d loops\n",
                FormatBytes(n * sizeof(float)).c_str(), opt.threads, opt.loops);
    std::printf("%-8s %12s %10s %8s\n", "kernel", "bytes", "GB/s", "vs copy");
  }
  double t_copy = TimeKernel(arena, n, opt.loops,
                             [&](size_t lo, size_t hi) { std::memcpy(pa + lo, pb + lo, (hi - lo) * sizeof(float)); });
  double t_triad = TimeKernel(arena, n, opt.loops, [&](size_t lo, size_t hi) { Triad(pa, pb, pc, s, lo, hi); });
  double t_update = TimeKernel(arena, n, opt.loops, [&](size_t lo, size_t hi) { Update(pa, pb, s, lo, hi); });
  benchmark::DoNotOptimize(pa[n / 2]);

  struct Row {
    const char* name;
    double bytes, seconds;
  };
  const Row rows[] = {{"copy", 8.0 * n, t_copy}, {"triad", 12.0 * n, t_triad}, {"update", 12.0 * n, t_update}};
  const double copy_gbs = rows[0].bytes / rows[0].seconds / 1e9;
  nlohmann::json out = {{"bench", "membw"},
                        {"array_bytes", n * sizeof(float)},
                        {"threads", opt.threads},
                        {"loops", opt.loops},
                        {"kernels", nlohmann::json::array()}};
  for (const auto& r : rows) {
    double gbs = r.bytes / r.seconds / 1e9;
    if (opt.json) {
      out["kernels"].push_back({{"kernel", r.name},
                                {"bytes", r.bytes},
                                {"seconds", r.seconds},
                                {"gb_per_s", gbs},
                                {"ratio_to_copy", gbs / copy_gbs}});
    } else {
      std::printf("%-8s %12.0f %10.2f %8.2f\n", r.name, r.bytes, gbs, gbs / copy_gbs);
    }
  }
  if (opt.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

void RegisterMembw(CLI::App& bench, int* exit_code) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("membw", "Memory bandwidth (copy, triad, in-place update) on a footprint");
  cmd->add_option("--size", opt->size, "Bytes per array (3 arrays are used), e.g. 1G")->capture_default_str();
  cmd->add_option("--threads", opt->threads, "oneTBB arena size")->capture_default_str();
  cmd->add_option("--loops", opt->loops, "Timed passes per kernel (median reported)")->capture_default_str();
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of the table");
  cmd->callback([opt, exit_code] { *exit_code = Run(*opt); });
}

}  // namespace zinf::bench
