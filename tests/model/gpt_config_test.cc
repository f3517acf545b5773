// Presets, the unit layout and the FLOP count.
#include "model/gpt_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace zinf::model {
namespace {

GptConfig Preset(const char* name) { return std::move(GptPreset(name)).value(); }

// The parameter counts of the released GPT-2 checkpoints (tied LM head).
TEST(GptConfigTest, Gpt2PresetsHaveTheReleasedParameterCounts) {
  EXPECT_EQ(NumParams(Preset("gpt2")), 124'439'808);
  EXPECT_EQ(NumParams(Preset("gpt2-medium")), 354'823'168);
  EXPECT_EQ(NumParams(Preset("gpt2-large")), 774'030'080);
  EXPECT_EQ(NumParams(Preset("gpt2-xl")), 1'557'611'200);
  EXPECT_NEAR(NumParams(Preset("gpt-7b")) / 1e9, 6.66, 0.01);
  for (const std::string& name : GptPresetNames()) EXPECT_TRUE(Preset(name.c_str()).Validate().ok()) << name;
  EXPECT_EQ(GptPreset("gpt5").status().code(), StatusCode::kNotFound);
}

TEST(GptConfigTest, UnitsTileTheirBuffersInTheDocumentedOrder) {
  const GptConfig c = Preset("tiny");
  ASSERT_EQ(NumUnits(c), 4);
  EXPECT_EQ(KindOfUnit(c, 0), UnitKind::kEmbedding);
  EXPECT_EQ(KindOfUnit(c, 1), UnitKind::kBlock);
  EXPECT_EQ(KindOfUnit(c, 3), UnitKind::kFinalNorm);
  int64_t total = 0;
  for (int unit = 0; unit < NumUnits(c); ++unit) {
    int64_t at = 0;
    for (const UnitTensor& t : UnitTensors(c, unit)) {
      EXPECT_EQ(t.offset_elems, at) << t.name;
      at += t.num_elems();
    }
    EXPECT_EQ(at, UnitNumParams(c, unit));
    total += at;
  }
  EXPECT_EQ(total, NumParams(c));
  const int64_t C = c.embed_dim;
  EXPECT_EQ(UnitNumParams(c, 1), 12 * C * C + 13 * C);
  std::vector<std::string> names;
  for (const UnitTensor& t : UnitTensors(c, 1)) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"ln1_w", "ln1_b", "qkv_w", "qkv_b", "attn_proj_w", "attn_proj_b", "ln2_w",
                                             "ln2_b", "fc_w", "fc_b", "fc_proj_w", "fc_proj_b"}));
  const BlockLayout b = BlockLayout::For(c);
  EXPECT_EQ(b.qkv_w, 2 * C);
  EXPECT_EQ(b.fc_proj_b, 12 * C * C + 12 * C);
  EXPECT_EQ(EmbeddingLayout::For(c).wpe, c.vocab_size * C);
}

TEST(GptConfigTest, InvalidShapesAreRejected) {
  GptConfig c = Preset("tiny");
  c.num_heads = 5;  // 32 % 5 != 0
  EXPECT_EQ(c.Validate().code(), StatusCode::kInvalidArgument);
  c = Preset("tiny");
  c.vocab_size = 0;
  Status st = c.Validate();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("vocab_size"), std::string::npos);
}

TEST(GptConfigTest, InitialisationFollowsGpt2) {
  const GptConfig c = Preset("tiny");
  std::vector<float> block(UnitNumParams(c, 1));
  InitUnitParams(c, 1, 7, block.data());
  const BlockLayout b = BlockLayout::For(c);
  EXPECT_EQ(block[b.ln1_w], 1.0f);
  EXPECT_EQ(block[b.ln1_b], 0.0f);
  EXPECT_EQ(block[b.qkv_b], 0.0f);
  double sum_sq = 0;
  const int64_t n = c.embed_dim * 4 * c.embed_dim;
  for (int64_t i = 0; i < n; ++i) sum_sq += block[b.fc_w + i] * block[b.fc_w + i];
  EXPECT_NEAR(std::sqrt(sum_sq / n), 0.02, 0.002);
  std::vector<float> again(block.size());
  InitUnitParams(c, 1, 7, again.data());
  EXPECT_EQ(block, again);
}

// 6 N per token plus 12 L C T for attention: gpt2 at T=256, 1024 tokens.
TEST(GptConfigTest, TrainingFlops) {
  const GptConfig c = Preset("gpt2");
  const double expected = 1024.0 * (6.0 * 124'439'808 + 12.0 * 12 * 768 * 256);
  EXPECT_DOUBLE_EQ(TrainingFlops(c, 4, 256), expected);
  EXPECT_DOUBLE_EQ(ForwardFlops(c, 4, 256) * 3, expected);
}

}  // namespace
}  // namespace zinf::model
