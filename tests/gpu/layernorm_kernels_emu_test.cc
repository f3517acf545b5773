// LayerNorm's row kernels (gpu/layernorm_kernels.cuh: a half-warp a row,
// batched loads), run without a GPU through the SIMT emulation, launched as
// kernels.cu launches them, against the CPU layers (model/layers.h) bit for
// bit: y (fp32, and bf16 as the fp32 y rounded), mean, rstd, and the input
// gradient added into dx. The weight and bias gradients are the column
// kernel's, which tests/gpu/kernels_test.cc checks on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/float16.h"
#include "gpu/layernorm_kernels.cuh"
#include "model/layers.h"
#include "model/parallel.h"
#include "test_util.h"

namespace zinf::gpu {
namespace {

using test::UniformFloats;

Status Emulate(unsigned blocks, uint64_t seed, const std::function<void()>& kernel) {
  emu::LaunchConfig c;
  c.grid = emu::Dim3{blocks, 1, 1};
  c.block = emu::Dim3{layernorm::kThreads, 1, 1};
  c.schedule_seed = seed;
  return emu::Launch(c, kernel);
}

size_t DifferentBits(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d += FloatToBits(a[i]) != FloatToBits(b[i]);
  return d;
}

// Rows shorter than the 16 lanes, with and without a tail, batches of 32,
// 16 and 8 and single elements before a tail (1480: 92 elements a lane), a
// model's row (2048), and more rows than the grid's half-warps (one block).
TEST(LayerNormKernelsEmuTest, RowsMatchTheCpuBitForBit) {
  const model::ModelThreads th(1);
  struct Case {
    int64_t rows, cols;
    bool one_block;
  };
  for (const Case& k : {Case{37, 1, false}, Case{37, 15, false}, Case{37, 16, false}, Case{37, 17, false},
                        Case{9, 773, false}, Case{5, 1480, false}, Case{3, 2048, false}, Case{40, 33, true}}) {
    const int64_t R = k.rows, C = k.cols;
    SCOPED_TRACE(::testing::Message() << "rows " << R << ", cols " << C << (k.one_block ? ", one block" : ""));
    const size_t n = static_cast<size_t>(R * C);
    const std::vector<float> x = UniformFloats(20 + C, n, -3.0f, 5.0f);
    const std::vector<float> w = UniformFloats(21 + C, static_cast<size_t>(C), 0.5f, 1.5f);
    const std::vector<float> b = UniformFloats(22 + C, static_cast<size_t>(C), -0.5f, 0.5f);
    const std::vector<float> dy = UniformFloats(23 + C, n, -1.0f, 1.0f);
    const std::vector<float> dx0 = UniformFloats(24 + C, n, -0.1f, 0.1f);  // the backward adds into dx
    std::vector<float> y(n), mean(static_cast<size_t>(R)), rstd(static_cast<size_t>(R)), dx = dx0;
    std::vector<float> dw(static_cast<size_t>(C)), db(static_cast<size_t>(C));
    model::LayerNormForward<float>(th, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R, C);
    model::LayerNormBackward<float>(th, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                                    rstd.data(), R, C);

    std::vector<float> gy(n, NAN), gmean(mean.size(), NAN), grstd(rstd.size(), NAN), gdx = dx0;
    std::vector<float> gmean16(mean.size(), NAN), grstd16(rstd.size(), NAN);
    std::vector<uint16_t> gy16(n, 0xffff);
    const unsigned blocks = k.one_block ? 1 : layernorm::BlocksForRows(R);
    for (uint64_t sched : {uint64_t{0}, uint64_t{5}}) {
      SCOPED_TRACE(::testing::Message() << "schedule " << sched);
      gdx = dx0;
      ASSERT_TRUE(Emulate(blocks, sched, [&] {
                    layernorm::LayerNormForwardKernel<float>(x.data(), w.data(), b.data(), gy.data(), gmean.data(),
                                                             grstd.data(), R, C);
                    layernorm::LayerNormForwardKernel<uint16_t>(x.data(), w.data(), b.data(), gy16.data(),
                                                                gmean16.data(), grstd16.data(), R, C);
                  }).ok());
      ASSERT_TRUE(Emulate(blocks, sched, [&] {
                    layernorm::LayerNormBackwardRowsKernel(dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                                                           gdx.data(), R, C);
                  }).ok());
      EXPECT_EQ(DifferentBits(gy, y), 0u) << "y";
      EXPECT_EQ(DifferentBits(gmean, mean), 0u) << "mean";
      EXPECT_EQ(DifferentBits(grstd, rstd), 0u) << "rstd";
      EXPECT_EQ(DifferentBits(gmean16, mean), 0u) << "mean (bf16 y)";
      EXPECT_EQ(DifferentBits(grstd16, rstd), 0u) << "rstd (bf16 y)";
      size_t not_rounded = 0;
      for (size_t i = 0; i < n; ++i) not_rounded += gy16[i] != FloatToBf16Bits(y[i]);
      EXPECT_EQ(not_rounded, 0u) << "bf16 y";
      EXPECT_EQ(DifferentBits(gdx, dx), 0u) << "dx";
    }
  }
}

}  // namespace
}  // namespace zinf::gpu
