// The loss kernels (gpu/loss_kernels.cuh), run without a GPU through the
// SIMT emulation (gpu/simt_emu.h), launched as loss_kernels.cu launches
// them, against the CPU layers (model/layers.h), bit for bit: the kernels
// add in the CPU's 16-lane order, which the emulation keeps (no tensor
// cores here). The same comparisons as tests/gpu/kernels_test.cc's, which
// need a GPU:
//   - softmax + cross-entropy forward: probabilities and losses;
//   - the fused bf16 gradient (scaled by the count, rounded);
//   - the chunked loss's one-kernel gradient, straight from the logits.
// Rows with an ignored target, a padded row stride, vocabularies inside one
// 2048-element tile and across several, a count of zero.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "common/float16.h"
#include "gpu/loss_kernels.cuh"
#include "model/layers.h"
#include "model/parallel.h"
#include "test_util.h"

namespace zinf::gpu {
namespace {

using test::SplitMix64;
using test::UniformFloats;

Status Emulate(emu::Dim3 grid, unsigned threads, uint64_t seed, const std::function<void()>& kernel) {
  emu::LaunchConfig c;
  c.grid = grid;
  c.block = emu::Dim3{threads, 1, 1};
  c.schedule_seed = seed;
  return emu::Launch(c, kernel);
}

struct Problem {
  int64_t rows, vocab, ld;
  std::vector<float> logits;  // rows × ld, the padding NaN
  std::vector<int32_t> targets;

  Problem(int64_t r, int64_t v) : rows(r), vocab(v), ld((v + 7) / 8 * 8) {
    logits = UniformFloats(30 + v, static_cast<size_t>(rows * ld), -30.0f, 30.0f);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = vocab; j < ld; ++j) logits[i * ld + j] = NAN;  // never read
    }
    if (vocab > 1) logits[3 % vocab] = -std::numeric_limits<float>::infinity();  // exp gives 0
    targets.resize(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) {
      targets[i] = i % 4 == 1 ? -1 : static_cast<int32_t>(SplitMix64(vocab * 3 + i) % vocab);
    }
  }
  // The CPU layers' probabilities and losses, the rows unpadded.
  void Cpu(std::vector<float>& probs, std::vector<float>& losses) const {
    std::vector<float> dense(static_cast<size_t>(rows * vocab));
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < vocab; ++j) dense[i * vocab + j] = logits[i * ld + j];
    }
    probs.assign(dense.size(), 0.0f);
    losses.assign(static_cast<size_t>(rows), 0.0f);
    model::SoftmaxCrossEntropyForward(model::ModelThreads(1), probs.data(), losses.data(), dense.data(), targets.data(),
                                      rows, vocab);
  }
};

class LossKernelsEmuTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(LossKernelsEmuTest, MatchTheCpuLayersBitForBit) {
  const Problem p(7, GetParam());
  std::vector<float> probs, losses;
  p.Cpu(probs, losses);
  const size_t n = p.logits.size();
  for (uint64_t seed : {uint64_t{0}, uint64_t{5}}) {
    SCOPED_TRACE(::testing::Message() << "schedule " << seed);
    std::vector<float> gprobs(n, NAN), glosses(static_cast<size_t>(p.rows), NAN);
    const Status st = Emulate({loss::BlocksForRows(p.rows), 1, 1}, loss::kLossThreads, seed, [&] {
      loss::SoftmaxCrossEntropyForwardKernel(p.logits.data(), p.targets.data(), gprobs.data(), glosses.data(), p.rows,
                                             p.vocab, p.ld);
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
    size_t differ = 0;
    for (int64_t i = 0; i < p.rows; ++i) {
      EXPECT_EQ(FloatToBits(glosses[i]), FloatToBits(losses[i])) << "row " << i;
      for (int64_t j = 0; j < p.vocab; ++j)
        differ += FloatToBits(gprobs[i * p.ld + j]) != FloatToBits(probs[i * p.vocab + j]);
    }
    EXPECT_EQ(differ, 0u) << "probabilities";

    // The gradients in bf16, scale / count, from the probabilities (fused
    // kernel) and from the logits (one kernel), against the CPU's.
    for (const float count : {5.0f, 0.0f}) {
      const float k = count > 0 ? 512.0f / count : 0.0f;
      std::vector<uint16_t> fused(n, 0xffff), direct(n, 0xffff);
      const unsigned across = static_cast<unsigned>(std::min<int64_t>(64, (p.vocab + 1023) / 1024));
      ASSERT_TRUE(Emulate({across, static_cast<unsigned>(p.rows), 1}, 256, seed, [&] {
                    loss::SoftmaxCrossEntropyBackwardBf16Kernel(gprobs.data(), p.targets.data(), fused.data(), p.rows,
                                                                p.vocab, p.ld, 512.0f, &count);
                  }).ok());
      ASSERT_TRUE(Emulate({loss::BlocksForRows(p.rows), 1, 1}, loss::kLossThreads, seed, [&] {
                    loss::SoftmaxCrossEntropyGradBf16Kernel(p.logits.data(), p.targets.data(), direct.data(), p.rows,
                                                            p.vocab, p.ld, 512.0f, &count);
                  }).ok());
      size_t fused_differ = 0, direct_differ = 0;
      for (int64_t i = 0; i < p.rows; ++i) {
        const int32_t t = p.targets[i];
        for (int64_t j = 0; j < p.vocab; ++j) {
          const float g = t < 0 ? 0.0f : math::CrossEntropyLogitGrad(probs[i * p.vocab + j], j == t, 1.0f);
          const uint16_t want = FloatToBf16Bits(k * g);
          fused_differ += fused[i * p.ld + j] != want;
          direct_differ += direct[i * p.ld + j] != want;
        }
      }
      EXPECT_EQ(fused_differ, 0u) << "fused gradient, count " << count;
      EXPECT_EQ(direct_differ, 0u) << "one-kernel gradient, count " << count;
    }
  }
}

// Inside one 2048-element tile, the lanes ending one element into a second
// tile, several tiles.
INSTANTIATE_TEST_SUITE_P(Vocabularies, LossKernelsEmuTest, ::testing::Values(1, 17, 2049, 2065, 5003),
                         [](const ::testing::TestParamInfo<int64_t>& i) { return "V" + std::to_string(i.param); });

}  // namespace
}  // namespace zinf::gpu
