// The Adam bound's streaming kernels (bench/stream_bound.h) touch every byte
// Adam touches: each variant adds s*g to params, exp_avg and exp_avg_sq over
// the whole range, tails and odd lengths included, reads 16-bit gradients as
// their top halves, and writes the copy. And `zinf bench adam --json` reports
// the bound beside the kernel.
#include "bench/stream_bound.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/simd_level.h"
#include "test_util.h"

namespace zinf::bench {
namespace {

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(StreamBoundTest, EveryVariantUpdatesEveryElementAndWritesTheCopy) {
  const std::vector<StreamVariant> variants = StreamVariants(cpu::DetectedSimdLevel());
  ASSERT_GE(variants.size(), 4u);
  tbb::task_arena arena(2);
  for (const size_t n : {size_t{1}, size_t{15}, size_t{17}, size_t{1037}, size_t{200003}}) {
    for (const bool g16 : {false, true}) {
      for (const bool with_copy : {false, true}) {
        for (const StreamVariant& variant : variants) {
          // 64-byte aligned, as the bench's page-aligned arrays are.
          std::vector<float> p(n + 16), m(n + 16), v(n + 16), g32(n + 16);
          std::vector<uint16_t> g16v(n + 32), copy(n + 32, 0xdead);
          auto aligned = [](auto* base) {
            auto addr = reinterpret_cast<uintptr_t>(base);
            return reinterpret_cast<decltype(base)>((addr + 63) / 64 * 64);
          };
          float *pa = aligned(p.data()), *ma = aligned(m.data()), *va = aligned(v.data()), *ga = aligned(g32.data());
          uint16_t *ha = aligned(g16v.data()), *ca = aligned(copy.data());
          for (size_t i = 0; i < n; ++i) {
            pa[i] = 1.0f + static_cast<float>(i % 7);
            ma[i] = 2.0f;
            va[i] = 3.0f;
            ga[i] = 1000.0f * static_cast<float>(i % 5 + 1);
            ha[i] = static_cast<uint16_t>(0x4480 + i % 5);  // bf16 1024 .. 1152
          }
          cpu::AdamBuffers a;
          a.params = pa;
          a.exp_avg = ma;
          a.exp_avg_sq = va;
          a.grads = g16 ? static_cast<const void*>(ha) : ga;
          a.grad_dtype = g16 ? DType::kBFloat16 : DType::kFloat32;
          a.param_copy = with_copy ? ca : nullptr;
          a.num_elems = n;
          ASSERT_GT(variant.time(arena, a), 0.0);
          EXPECT_DOUBLE_EQ(StreamBytes(a), (24.0 + (g16 ? 2 : 4) + (with_copy ? 2 : 0)) * static_cast<double>(n));
          size_t wrong = 0;
          for (size_t i = 0; i < n; ++i) {
            const float g = g16 ? FromBits(uint32_t{ha[i]} << 16) : ga[i];
            const float want_p = (1.0f + static_cast<float>(i % 7)) + 1e-7f * g;
            bool ok = pa[i] == want_p && ma[i] == 2.0f + 1e-7f * g && va[i] == 3.0f + 1e-7f * g;
            if (with_copy) {
              uint32_t bits;
              std::memcpy(&bits, &pa[i], 4);
              ok = ok && ca[i] == static_cast<uint16_t>(bits >> 16);
            }
            wrong += !ok;
          }
          EXPECT_EQ(wrong, 0u) << variant.name << " n=" << n << " g16=" << g16 << " copy=" << with_copy;
          if (!with_copy) {
            EXPECT_EQ(ca[0], 0xdead);  // no copy asked for: none written
          }
        }
      }
    }
  }
}

TEST(StreamBoundTest, BenchAdamReportsTheBoundBesideTheKernel) {
  auto r = zinf::test::RunCommand(zinf::test::BinaryDir() +
                                  "/zinf bench adam --params 1M --threads 1 --loops 1 --grad-dtype bf16 "
                                  "--param-copy bf16 --json 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j["rows"].size(), 1u) << r.output;
  const auto& row = j["rows"][0];
  EXPECT_GT(row["params_per_s"].get<double>(), 0);
  EXPECT_GT(row["bound_gb_per_s"].get<double>(), 0);
  EXPECT_GE(row["bound_variants"].size(), 4u);
  EXPECT_FALSE(row["bound_variant"].get<std::string>().empty());
  // The bound counts Adam's bytes: 24 + 2 (bf16 gradient) + 2 (bf16 copy).
  EXPECT_EQ(j["bytes_per_param"].get<int>(), 28);
}

}  // namespace
}  // namespace zinf::bench
