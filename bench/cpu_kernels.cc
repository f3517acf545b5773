// `zinf bench adam`, `zinf bench cast`, `zinf bench norm`: the CPU tier's
// kernels (src/cpu) against this machine's memory bandwidth on the same
// footprint, measured in the same run.
//
// Adam's bound is the fastest of several streaming kernels that move exactly
// Adam's bytes over Adam's own arrays (bench/stream_bound.h). The bound of
// `cast` and `norm` is the in-place update a[i] += s*b[i] (12 bytes per
// element: read a and b, write a; STREAM counting, no write-allocate traffic)
// run over the very pages the kernel uses, viewed as two float arrays of half
// the footprint each, through the same oneTBB arena. Regions are 2 MiB-aligned
// and advised as transparent huge pages, the same pages for kernel and bound. Each loop times the bound, then the
// kernel, so both see the same machine state; figures are medians. The ratio
// is the kernel's effective bandwidth (bytes it must move, stated per mode)
// over the bound's. `cast` also reports a copy bound (memcpy, 8 bytes per
// element), the pattern a cast has; `norm` is read-only, so it also reports a
// read-only bound (a sum over the same pages, 4 bytes per element).
//
// The bounds run with flush-to-zero and denormals-are-zero: they reinterpret
// the kernels' data (16-bit values, for one) as fp32, which may be subnormal
// and would otherwise trigger slow microcode assists that no kernel pays.
#include <CLI/CLI.hpp>
#include <benchmark/benchmark.h>
#include <nlohmann/json.hpp>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "bench/ds_adam_reference.h"
#include "bench/stream_bound.h"
#include "common/units.h"
#include "cpu/adam.h"
#include "cpu/cast.h"
#include "common/float16.h"
#include "cpu/norm.h"
#include "cpu/simd_level.h"
#include "zinf/dtype.h"

namespace zinf::bench {
namespace {

constexpr size_t kGrain = 64 * 1024;  // elements per task, as the kernels use
constexpr size_t kPage = 4096;

size_t RoundUpToPage(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

struct FreeDeleter {
  void operator()(unsigned char* p) const { std::free(p); }
};
using Region = std::unique_ptr<unsigned char[], FreeDeleter>;

Region AllocRegion(size_t bytes, const char* bench) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (p) ::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: a refusal leaves 4 KiB pages
  if (!p) {
    std::fprintf(stderr, "zinf bench %s: cannot allocate %s\n", bench, FormatBytes(bytes).c_str());
    std::exit(1);
  }
  return Region(static_cast<unsigned char*>(p));
}

// Parallel first touch, so pages land where the arena's threads run.
template <class Fn>
void ParallelInit(tbb::task_arena& arena, size_t n, const Fn& fn) {
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n, kGrain),
                      [&](const tbb::blocked_range<size_t>& r) { fn(r.begin(), r.end()); });
  });
}

#if defined(__SSE2__)
struct FlushDenormals {  // FTZ | DAZ for the bounds (see the file comment)
  FlushDenormals() : saved(_mm_getcsr()) { _mm_setcsr(saved | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved); }
  unsigned saved;
};
#else
struct FlushDenormals {};
#endif

// Restrict-qualified so the compiler vectorizes without alias checks (-O3).
__attribute__((noinline)) void Update(float* __restrict a, const float* __restrict b, float s, size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; ++i) a[i] += s * b[i];
}

__attribute__((noinline)) float Sum(const float* __restrict a, size_t lo, size_t hi) {
#if defined(__SSE2__)
  __m128 acc0 = _mm_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  size_t i = lo;
  for (; i + 16 <= hi; i += 16) {
    acc0 = _mm_add_ps(acc0, _mm_loadu_ps(a + i));
    acc1 = _mm_add_ps(acc1, _mm_loadu_ps(a + i + 4));
    acc2 = _mm_add_ps(acc2, _mm_loadu_ps(a + i + 8));
    acc3 = _mm_add_ps(acc3, _mm_loadu_ps(a + i + 12));
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, _mm_add_ps(_mm_add_ps(acc0, acc1), _mm_add_ps(acc2, acc3)));
  float s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < hi; ++i) s += a[i];
  return s;
#else
  float s = 0;
  for (size_t i = lo; i < hi; ++i) s += a[i];
  return s;
#endif
}

// Seconds for one pass of the in-place update over `bytes` at `base`
// (two float arrays of bytes/8 elements each); moves 12 * bytes/8 bytes.
double TimeUpdateBound(tbb::task_arena& arena, unsigned char* base, size_t bytes) {
  const size_t n = bytes / 8;
  float* a = reinterpret_cast<float*>(base);
  const float* b = reinterpret_cast<const float*>(base + n * 4);
  const double t0 = NowSeconds();
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, n, kGrain),
        [&](const tbb::blocked_range<size_t>& r) {
          FlushDenormals ftz;
          Update(a, b, 1e-7f, r.begin(), r.end());
        },
        tbb::static_partitioner());
  });
  benchmark::ClobberMemory();
  return NowSeconds() - t0;
}

double UpdateBoundBytes(size_t bytes) { return 12.0 * static_cast<double>(bytes / 8); }

// Seconds for one copy of the second half of `bytes` at `base` onto the first
// (memcpy per task); moves 2 * bytes/2 bytes (STREAM's copy counting).
double TimeCopyBound(tbb::task_arena& arena, unsigned char* base, size_t bytes) {
  const size_t n = bytes / 8;
  float* a = reinterpret_cast<float*>(base);
  const float* b = reinterpret_cast<const float*>(base + n * 4);
  const double t0 = NowSeconds();
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, n, kGrain),
        [&](const tbb::blocked_range<size_t>& r) {
          std::memcpy(a + r.begin(), b + r.begin(), (r.end() - r.begin()) * sizeof(float));
        },
        tbb::static_partitioner());
  });
  benchmark::ClobberMemory();
  return NowSeconds() - t0;
}

double CopyBoundBytes(size_t bytes) { return 8.0 * static_cast<double>(bytes / 8); }

// Seconds for one read-only pass (sum) over `bytes` at `base`.
double TimeReadBound(tbb::task_arena& arena, const unsigned char* base, size_t bytes) {
  const size_t n = bytes / 4;
  const float* a = reinterpret_cast<const float*>(base);
  const double t0 = NowSeconds();
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, n, kGrain),
        [&](const tbb::blocked_range<size_t>& r) {
          FlushDenormals ftz;
          benchmark::DoNotOptimize(Sum(a, r.begin(), r.end()));
        },
        tbb::static_partitioner());
  });
  return NowSeconds() - t0;
}

// "2" or "1,2": thread counts, each >= 1.
bool ParseThreadList(const std::string& text, std::vector<int>* out, const char* bench) {
  out->clear();
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 4096) {
      std::fprintf(stderr, "zinf bench %s: --threads: '%s' is not a list of thread counts >= 1 (e.g. 2 or 1,2)\n",
                   bench, text.c_str());
      return false;
    }
    out->push_back(static_cast<int>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return true;
}

// Options every CPU-kernel bench shares.
struct CommonOptions {
  std::string count = "100M";  // elements (parameters)
  std::string threads = "2";
  int loops = 5;
  std::string simd;  // empty: ActiveSimdLevel()
  bool json = false;
};

// Validates the shared options; returns 0 to go on, else an exit code.
int ParseCommon(const CommonOptions& opt, const char* bench, size_t* n, std::vector<int>* threads,
                cpu::SimdLevel* level) {
  auto count = ParseCount(opt.count);
  if (!count.ok()) {
    std::fprintf(stderr, "zinf bench %s: %s\n", bench, count.status().message().c_str());
    return 2;
  }
  *n = *count;
  if (*n < kGrain) {
    std::fprintf(stderr, "zinf bench %s: need at least %zu elements\n", bench, kGrain);
    return 2;
  }
  if (opt.loops < 1) {
    std::fprintf(stderr, "zinf bench %s: --loops must be >= 1\n", bench);
    return 2;
  }
  if (!ParseThreadList(opt.threads, threads, bench)) return 2;
  *level = cpu::ActiveSimdLevel();
  if (!opt.simd.empty()) {
    auto parsed = cpu::ParseSimdLevel(opt.simd);
    if (!parsed.ok()) {
      std::fprintf(stderr, "zinf bench %s: --simd: %s\n", bench, parsed.status().message().c_str());
      return 2;
    }
    if (static_cast<int>(*parsed) > static_cast<int>(cpu::DetectedSimdLevel())) {
      std::fprintf(stderr, "zinf bench %s: --simd %s: this CPU supports at most %s\n", bench, opt.simd.c_str(),
                   std::string(cpu::SimdLevelName(cpu::DetectedSimdLevel())).c_str());
      return 2;
    }
    *level = *parsed;
  }
  return 0;
}

void AddCommonOptions(CLI::App* cmd, CommonOptions* opt, const char* count_flag, const char* count_help) {
  cmd->add_option(count_flag, opt->count, count_help)->capture_default_str();
  cmd->add_option("--threads", opt->threads, "oneTBB arena size, or a list (1,2) for one row each")
      ->capture_default_str();
  cmd->add_option("--loops", opt->loops, "Timed passes per case (median reported)")->capture_default_str();
  cmd->add_option("--simd", opt->simd,
                  "SIMD level: scalar, sse2, avx2, avx512 (default: the best, capped by ZINF_SIMD)");
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of the table");
}

// ---------------------------------------------------------------- adam

struct AdamBenchOptions {
  CommonOptions common;
  std::string grad_dtype = "fp32";
  std::string param_copy = "none";
};

int RunAdam(const AdamBenchOptions& opt) {
  constexpr const char* kName = "adam";
  size_t n = 0;
  std::vector<int> thread_counts;
  cpu::SimdLevel level;
  if (int rc = ParseCommon(opt.common, kName, &n, &thread_counts, &level)) return rc;
  auto grad_dtype = ParseDType(opt.grad_dtype);
  if (!grad_dtype.ok()) {
    std::fprintf(stderr, "zinf bench adam: --grad-dtype: %s\n", grad_dtype.status().message().c_str());
    return 2;
  }
  const bool with_copy = opt.param_copy != "none";
  DType copy_dtype = DType::kBFloat16;
  if (with_copy) {
    auto parsed = ParseDType(opt.param_copy);
    if (!parsed.ok() || *parsed == DType::kFloat32) {
      std::fprintf(stderr, "zinf bench adam: --param-copy must be none, bf16 or fp16, not '%s'\n",
                   opt.param_copy.c_str());
      return 2;
    }
    copy_dtype = *parsed;
  }
  const size_t grad_bytes = DTypeSizeBytes(*grad_dtype), copy_bytes = with_copy ? DTypeSizeBytes(copy_dtype) : 0;
  const size_t bytes_per_param = 24 + grad_bytes + copy_bytes;
  // One region: params | exp_avg | exp_avg_sq | grads | copy, each page-aligned.
  const size_t f32 = RoundUpToPage(n * 4), g16 = RoundUpToPage(n * grad_bytes), c16 = RoundUpToPage(n * copy_bytes);
  const size_t footprint = 3 * f32 + g16 + c16;
  Region region = AllocRegion(footprint, kName);
  float* params = reinterpret_cast<float*>(region.get());
  float* exp_avg = reinterpret_cast<float*>(region.get() + f32);
  float* exp_avg_sq = reinterpret_cast<float*>(region.get() + 2 * f32);
  unsigned char* grads = region.get() + 3 * f32;
  unsigned char* copy = with_copy ? region.get() + 3 * f32 + g16 : nullptr;

  cpu::AdamOptions adam;
  adam.weight_decay = 0.01;  // AdamW
  const double grad_scale = 1.0 / 1024;
  // The ds-shape reference reads fp32 gradients (ZeRO-Offload hands cpu_adam
  // fp32): in the mixed form, its own array of the same values, widened.
  const DsAdamKernels ds = DsAdamKernelsFor(level);
  const bool ds_own_grads = *grad_dtype != DType::kFloat32;
  Region ds_grads_region = ds_own_grads ? AllocRegion(f32, kName) : nullptr;
  float* ds_grads = ds_own_grads ? reinterpret_cast<float*>(ds_grads_region.get()) : reinterpret_cast<float*>(grads);
  if (Status st =
          DsAdamSelfCheck(thread_counts.back(), ds, adam, grad_scale, *grad_dtype, with_copy, copy_dtype, level);
      !st.ok()) {
    std::fprintf(stderr, "zinf bench adam: self-check: %s\n", st.ToString().c_str());
    return 1;
  }

  if (!opt.common.json) {
    std::printf("# zinf bench adam: %s params, grad %s, param copy %s, AdamW, simd %s, median of %d loops\n",
                FormatCount(double(n)).c_str(), std::string(DTypeName(*grad_dtype)).c_str(),
                with_copy ? std::string(DTypeName(copy_dtype)).c_str() : "none",
                std::string(cpu::SimdLevelName(level)).c_str(), opt.common.loops);
    std::printf("# bytes/param %zu: params, exp_avg, exp_avg_sq read+written 24, grad %s read %zu", bytes_per_param,
                std::string(DTypeName(*grad_dtype)).c_str(), grad_bytes);
    if (with_copy) std::printf(", %s copy written %zu", std::string(DTypeName(copy_dtype)).c_str(), copy_bytes);
    std::printf(
        "\n# bound: the fastest streaming kernel moving these bytes over the same arrays (params, exp_avg, "
        "exp_avg_sq read and written, grad read%s), threads and pages: %zu variants (vector width, unrolled "
        "x1/x4, auto or static partition), each timed every loop, best median\n",
        with_copy ? ", copy written" : "", StreamVariants(level).size());
    std::printf("# ds-shape: %s; timed in turn with zinf every loop (ds Mp/s, zinf/ds = the two rates' ratio)\n",
                DsAdamDescription(ds, with_copy).c_str());
    std::printf("%7s %11s %8s %11s %7s %8s %9s %8s  %s\n", "threads", "Mparams/s", "GB/s", "bound GB/s", "ratio",
                "scaling", "ds Mp/s", "zinf/ds", "bound's variant");
  }
  nlohmann::json out = {{"bench", "adam"},
                        {"params", n},
                        {"grad_dtype", DTypeName(*grad_dtype)},
                        {"param_copy", with_copy ? DTypeName(copy_dtype) : "none"},
                        {"simd", cpu::SimdLevelName(level)},
                        {"bytes_per_param", bytes_per_param},
                        {"footprint_bytes", footprint},
                        {"loops", opt.common.loops},
                        {"ds_shape",
                         {{"simd", ds.name},
                          {"floats_per_vector", ds.floats_per_vector},
                          {"grad_dtype", "fp32"},
                          {"passes", with_copy ? 2 : 1},
                          {"bytes_per_param", DsAdamBytesPerParam(with_copy)}}},
                        {"rows", nlohmann::json::array()}};
  double first_rate = 0;
  for (int threads : thread_counts) {
    tbb::task_arena arena(threads);
    ParallelInit(arena, n, [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) {
        const float g = static_cast<float>(static_cast<int>((i * 2654435761u) % 2001) - 1000) * 1e-3f + 0.5f;
        params[i] = 0.01f * g;
        exp_avg[i] = 0.0f;
        exp_avg_sq[i] = 0.0f;
        if (*grad_dtype == DType::kFloat32) {
          reinterpret_cast<float*>(grads)[i] = g;
        } else {
          const uint16_t h = *grad_dtype == DType::kBFloat16 ? FloatToBf16Bits(g) : FloatToHalfBits(g);
          reinterpret_cast<uint16_t*>(grads)[i] = h;
          ds_grads[i] = *grad_dtype == DType::kBFloat16 ? Bf16BitsToFloat(h) : HalfBitsToFloat(h);
        }
        if (copy) reinterpret_cast<uint16_t*>(copy)[i] = 0;
      }
    });
    cpu::AdamBuffers buffers;
    buffers.params = params;
    buffers.exp_avg = exp_avg;
    buffers.exp_avg_sq = exp_avg_sq;
    buffers.grads = grads;
    buffers.grad_dtype = *grad_dtype;
    buffers.param_copy = copy;
    buffers.param_copy_dtype = copy_dtype;
    buffers.num_elems = n;
    cpu::AdamBuffers ds_buffers = buffers;  // the same arrays and copy, fp32 gradients
    ds_buffers.grads = ds_grads;
    ds_buffers.grad_dtype = DType::kFloat32;
    const std::vector<StreamVariant> variants = StreamVariants(level);
    std::vector<std::vector<double>> variant_s(variants.size());
    std::vector<double> adam_s, ds_s;
    for (int l = 0; l < opt.common.loops + 1; ++l) {  // the first loop warms up
      for (size_t k = 0; k < variants.size(); ++k) {
        const double tv = variants[k].time(arena, buffers);
        if (l > 0) variant_s[k].push_back(tv);
      }
      // zinf and the reference in turn, first one then the other, on the same arrays.
      double ta = 0, td = 0;
      for (int turn = 0; turn < 2; ++turn) {
        const double t0 = NowSeconds();
        if ((turn + l) % 2 == 0) {
          Status st = cpu::AdamStep(arena, adam, l + 1, grad_scale, buffers, level);
          ta = NowSeconds() - t0;
          if (!st.ok()) {
            std::fprintf(stderr, "zinf bench adam: %s\n", st.ToString().c_str());
            return 1;
          }
        } else {
          DsAdamStep(arena, ds, MakeDsAdamConstants(adam, l + 1, grad_scale), ds_buffers);
          td = NowSeconds() - t0;
        }
      }
      if (l > 0) {
        adam_s.push_back(ta);
        ds_s.push_back(td);
      }
    }
    const double rate = double(n) / Median(adam_s), ds_rate = double(n) / Median(ds_s);
    const double gbs = rate * double(bytes_per_param) / 1e9;
    size_t best = 0;
    nlohmann::json variant_rows = nlohmann::json::array();
    for (size_t k = 0; k < variants.size(); ++k) {
      if (Median(variant_s[k]) < Median(variant_s[best])) best = k;
      variant_rows.push_back(
          {{"variant", variants[k].name}, {"gb_per_s", StreamBytes(buffers) / Median(variant_s[k]) / 1e9}});
    }
    const double bound_gbs = StreamBytes(buffers) / Median(variant_s[best]) / 1e9;
    if (first_rate == 0) first_rate = rate;
    if (opt.common.json) {
      out["rows"].push_back({{"threads", threads},
                             {"params_per_s", rate},
                             {"gb_per_s", gbs},
                             {"bound_gb_per_s", bound_gbs},
                             {"ratio", gbs / bound_gbs},
                             {"bound_variant", variants[best].name},
                             {"bound_variants", variant_rows},
                             {"scaling", rate / first_rate},
                             {"ds_shape_params_per_s", ds_rate},
                             {"zinf_over_ds_shape", rate / ds_rate}});
    } else {
      std::printf("%7d %11.1f %8.2f %11.2f %7.2f %8.2f %9.1f %8.2f  %s\n", threads, rate / 1e6, gbs, bound_gbs,
                  gbs / bound_gbs, rate / first_rate, ds_rate / 1e6, rate / ds_rate, variants[best].name.c_str());
    }
  }
  if (opt.common.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

// ---------------------------------------------------------------- cast

int RunCast(const CommonOptions& opt) {
  constexpr const char* kName = "cast";
  size_t n = 0;
  std::vector<int> thread_counts;
  cpu::SimdLevel level;
  if (int rc = ParseCommon(opt, kName, &n, &thread_counts, &level)) return rc;
  // Source and destination in one region; every case moves 6 bytes/element.
  const size_t f32 = RoundUpToPage(n * 4), h16 = RoundUpToPage(n * 2);
  const size_t footprint = f32 + h16;
  Region region = AllocRegion(footprint, kName);
  float* wide = reinterpret_cast<float*>(region.get());
  uint16_t* narrow = reinterpret_cast<uint16_t*>(region.get() + f32);
  struct Case {
    const char* name;
    DType src, dst;
  };
  const Case cases[] = {{"fp32->bf16", DType::kFloat32, DType::kBFloat16},
                        {"fp32->fp16", DType::kFloat32, DType::kFloat16},
                        {"bf16->fp32", DType::kBFloat16, DType::kFloat32},
                        {"fp16->fp32", DType::kFloat16, DType::kFloat32}};
  if (!opt.json) {
    std::printf("# zinf bench cast: %s elements, simd %s, median of %d loops\n", FormatCount(double(n)).c_str(),
                std::string(cpu::SimdLevelName(level)).c_str(), opt.loops);
    std::printf("# bytes/elem 6: read 4 + write 2, or read 2 + write 4 (non-temporal stores)\n");
    std::printf("# bounds over the same %s: in-place update a[i] += s*b[i] (12 B/elem) and memcpy (8 B/elem)\n",
                FormatBytes(footprint).c_str());
    std::printf("%7s %-11s %11s %8s %11s %7s %10s %7s\n", "threads", "case", "Melem/s", "GB/s", "update GB/s", "ratio",
                "copy GB/s", "ratio");
  }
  nlohmann::json out = {{"bench", "cast"},
                        {"elems", n},
                        {"simd", cpu::SimdLevelName(level)},
                        {"bytes_per_elem", 6},
                        {"footprint_bytes", footprint},
                        {"loops", opt.loops},
                        {"rows", nlohmann::json::array()}};
  for (int threads : thread_counts) {
    tbb::task_arena arena(threads);
    auto init = [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) {
        wide[i] = static_cast<float>(static_cast<int>((i * 2654435761u) % 2001) - 1000) * 1e-2f + 0.25f;
        narrow[i] = FloatToHalfBits(wide[i]);
      }
    };
    ParallelInit(arena, n, init);
    std::vector<double> bound_s, copy_s;
    std::vector<std::vector<double>> case_s(std::size(cases));
    for (int l = 0; l < opt.loops + 1; ++l) {
      const double tb = TimeUpdateBound(arena, region.get(), footprint);
      const double tc = TimeCopyBound(arena, region.get(), footprint);
      // The bounds rewrote the data as fp32: restore it (untimed).
      ParallelInit(arena, n, init);
      if (l > 0) {
        bound_s.push_back(tb);
        copy_s.push_back(tc);
      }
      for (size_t c = 0; c < std::size(cases); ++c) {
        // bf16->fp32 reads fp16 bits as bf16 (harmless: the conversions
        // cost the same for every value); fp16->fp32, last, restores wide.
        const bool src_wide = cases[c].src == DType::kFloat32;
        const double t0 = NowSeconds();
        Status st = cpu::Cast(arena, src_wide ? static_cast<void*>(wide) : narrow, cases[c].src,
                              src_wide ? static_cast<void*>(narrow) : wide, cases[c].dst, n, level);
        const double t = NowSeconds() - t0;
        if (!st.ok()) {
          std::fprintf(stderr, "zinf bench cast: %s\n", st.ToString().c_str());
          return 1;
        }
        if (l > 0) case_s[c].push_back(t);
      }
    }
    const double bound_gbs = UpdateBoundBytes(footprint) / Median(bound_s) / 1e9;
    const double copy_gbs = CopyBoundBytes(footprint) / Median(copy_s) / 1e9;
    for (size_t c = 0; c < std::size(cases); ++c) {
      const double rate = double(n) / Median(case_s[c]);
      const double gbs = rate * 6 / 1e9;
      if (opt.json) {
        out["rows"].push_back({{"threads", threads},
                               {"case", cases[c].name},
                               {"elems_per_s", rate},
                               {"gb_per_s", gbs},
                               {"bound_gb_per_s", bound_gbs},
                               {"ratio", gbs / bound_gbs},
                               {"copy_bound_gb_per_s", copy_gbs},
                               {"ratio_to_copy", gbs / copy_gbs}});
      } else {
        std::printf("%7d %-11s %11.1f %8.2f %11.2f %7.2f %10.2f %7.2f\n", threads, cases[c].name, rate / 1e6, gbs,
                    bound_gbs, gbs / bound_gbs, copy_gbs, gbs / copy_gbs);
      }
    }
  }
  if (opt.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

// ---------------------------------------------------------------- norm

struct NormBenchOptions {
  CommonOptions common;
  std::string dtype = "fp32";
};

int RunNorm(const NormBenchOptions& opt) {
  constexpr const char* kName = "norm";
  size_t n = 0;
  std::vector<int> thread_counts;
  cpu::SimdLevel level;
  if (int rc = ParseCommon(opt.common, kName, &n, &thread_counts, &level)) return rc;
  auto dtype = ParseDType(opt.dtype);
  if (!dtype.ok()) {
    std::fprintf(stderr, "zinf bench norm: --dtype: %s\n", dtype.status().message().c_str());
    return 2;
  }
  const size_t elem_bytes = DTypeSizeBytes(*dtype);
  const size_t footprint = RoundUpToPage(n * elem_bytes);
  Region region = AllocRegion(footprint, kName);
  std::vector<double> partials(cpu::NumNormBlocks(n));
  if (!opt.common.json) {
    std::printf(
        "# zinf bench norm: sum of squares of %s %s values in 64 Ki blocks (double lanes, non-finite check), "
        "simd %s, median of %d loops\n",
        FormatCount(double(n)).c_str(), std::string(DTypeName(*dtype)).c_str(),
        std::string(cpu::SimdLevelName(level)).c_str(), opt.common.loops);
    std::printf(
        "# bytes/elem %zu (read only); bounds over the same %s: in-place update a[i] += s*b[i] (12 B/elem) "
        "and read-only sum (4 B/elem)\n",
        elem_bytes, FormatBytes(footprint).c_str());
    std::printf("%7s %11s %8s %11s %7s %10s %7s\n", "threads", "Melem/s", "GB/s", "update GB/s", "ratio", "read GB/s",
                "ratio");
  }
  nlohmann::json out = {{"bench", "norm"},
                        {"elems", n},
                        {"dtype", DTypeName(*dtype)},
                        {"simd", cpu::SimdLevelName(level)},
                        {"bytes_per_elem", elem_bytes},
                        {"footprint_bytes", footprint},
                        {"loops", opt.common.loops},
                        {"rows", nlohmann::json::array()}};
  for (int threads : thread_counts) {
    tbb::task_arena arena(threads);
    auto init = [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) {
        const float x = static_cast<float>(static_cast<int>((i * 2654435761u) % 2001) - 1000) * 1e-3f + 0.5f;
        if (*dtype == DType::kFloat32) {
          reinterpret_cast<float*>(region.get())[i] = x;
        } else {
          reinterpret_cast<uint16_t*>(region.get())[i] =
              *dtype == DType::kBFloat16 ? FloatToBf16Bits(x) : FloatToHalfBits(x);
        }
      }
    };
    ParallelInit(arena, n, init);
    std::vector<double> update_s, read_s, norm_s;
    for (int l = 0; l < opt.common.loops + 1; ++l) {
      const double tu = TimeUpdateBound(arena, region.get(), footprint);
      ParallelInit(arena, n, init);  // untimed: the update rewrote the data as fp32
      const double tr = TimeReadBound(arena, region.get(), footprint);
      const double t0 = NowSeconds();
      auto r = cpu::SumSquaresBlocks(arena, region.get(), *dtype, n, partials, level);
      const double tn = NowSeconds() - t0;
      if (!r.ok()) {
        std::fprintf(stderr, "zinf bench norm: %s\n", r.status().ToString().c_str());
        return 1;
      }
      if (l > 0) {
        update_s.push_back(tu);
        read_s.push_back(tr);
        norm_s.push_back(tn);
      }
    }
    const double rate = double(n) / Median(norm_s);
    const double gbs = rate * double(elem_bytes) / 1e9;
    const double update_gbs = UpdateBoundBytes(footprint) / Median(update_s) / 1e9;
    const double read_gbs = double(footprint / 4 * 4) / Median(read_s) / 1e9;
    if (opt.common.json) {
      out["rows"].push_back({{"threads", threads},
                             {"elems_per_s", rate},
                             {"gb_per_s", gbs},
                             {"update_bound_gb_per_s", update_gbs},
                             {"ratio_to_update", gbs / update_gbs},
                             {"read_bound_gb_per_s", read_gbs},
                             {"ratio_to_read", gbs / read_gbs}});
    } else {
      std::printf("%7d %11.1f %8.2f %11.2f %7.2f %10.2f %7.2f\n", threads, rate / 1e6, gbs, update_gbs,
                  gbs / update_gbs, read_gbs, gbs / read_gbs);
    }
  }
  if (opt.common.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

void RegisterCpuKernels(CLI::App& bench, int* exit_code) {
  auto adam = std::make_shared<AdamBenchOptions>();
  CLI::App* cmd = bench.add_subcommand("adam", "CPU Adam (src/cpu) vs the in-place memory bandwidth bound");
  AddCommonOptions(cmd, &adam->common, "--params", "Parameters, e.g. 100M");
  cmd->add_option("--grad-dtype", adam->grad_dtype, "fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--param-copy", adam->param_copy, "16-bit copy of the updated parameter: none, bf16 or fp16")
      ->capture_default_str();
  cmd->callback([adam, exit_code] { *exit_code = RunAdam(*adam); });

  auto cast = std::make_shared<CommonOptions>();
  cmd = bench.add_subcommand("cast", "fp32 <-> bf16/fp16 casts vs the in-place memory bandwidth bound");
  AddCommonOptions(cmd, cast.get(), "--elems", "Elements, e.g. 100M");
  cmd->callback([cast, exit_code] { *exit_code = RunCast(*cast); });

  auto norm = std::make_shared<NormBenchOptions>();
  cmd = bench.add_subcommand("norm", "Blockwise sum of squares vs the update and read-only bandwidth bounds");
  AddCommonOptions(cmd, &norm->common, "--elems", "Elements, e.g. 100M");
  cmd->add_option("--dtype", norm->dtype, "fp32, bf16 or fp16")->capture_default_str();
  cmd->callback([norm, exit_code] { *exit_code = RunNorm(*norm); });
}

}  // namespace zinf::bench
