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

// The Llama family at the shapes of the released checkpoints: the parameter
// counts their model cards and safetensors indexes give.
TEST(GptConfigTest, LlamaFamilyPresetsHaveTheReleasedParameterCounts) {
  EXPECT_EQ(NumParams(Preset("llama-3.1-8b")), 8'030'261'248);
  EXPECT_EQ(NumParams(Preset("llama-3.2-1b")), 1'235'814'400);
  EXPECT_EQ(NumParams(Preset("llama-3.2-3b")), 3'212'749'824);
  EXPECT_EQ(NumParams(Preset("qwen2.5-7b")), 7'615'616'512);
  EXPECT_EQ(NumParams(Preset("qwen3-8b")), 8'190'735'360);
  EXPECT_EQ(NumParams(Preset("mistral-7b")), 7'248'023'552);
  EXPECT_EQ(NumParams(Preset("smollm2-1.7b")), 1'711'376'384);
  const GptConfig l = Preset("llama-3.1-8b");
  EXPECT_FALSE(l.IsGpt2Family());
  EXPECT_TRUE(Preset("gpt2").IsGpt2Family());
  EXPECT_EQ(Preset("tiny").ToString(), "tiny: V=64 T=16 C=32 L=2 H=4 (28.03 K parameters: 28,032)");
  EXPECT_EQ(l.ToString(),
            "llama-3.1-8b: V=128256 T=131072 C=4096 L=32 H=32 H_kv=8 D=128 I=14336 rmsnorm rope swiglu untied "
            "(8.03 G parameters: 8,030,261,248)");
  // Untied: the head is in the last unit; no learned positions.
  EXPECT_EQ(UnitNumParams(l, FinalNormUnit(l)), 4096 + 128256LL * 4096);
  EXPECT_EQ(EmbeddingLayout::For(l).wpe, kAbsent);
  // The LM head's product counts once; the embedding table is a lookup.
  EXPECT_DOUBLE_EQ(ForwardFlops(l, 1, 1), 2.0 * (8'030'261'248 - 128256.0 * 4096) + 4.0 * 32 * 4096);
}

TEST(GptConfigTest, LlamaBlockLayoutLeavesOutWhatTheConfigDoesNotHave) {
  auto names = [](const GptConfig& c) {
    std::vector<std::string> n;
    for (const UnitTensor& t : UnitTensors(c, 1)) n.push_back(t.name);
    return n;
  };
  EXPECT_EQ(names(Preset("tiny-llama")),
            (std::vector<std::string>{"ln1_w", "qkv_w", "attn_proj_w", "ln2_w", "fc_w", "fc_proj_w"}));
  EXPECT_EQ(names(Preset("tiny-qwen2")),
            (std::vector<std::string>{"ln1_w", "qkv_w", "qkv_b", "attn_proj_w", "ln2_w", "fc_w", "fc_proj_w"}));
  EXPECT_EQ(names(Preset("tiny-qwen3")), (std::vector<std::string>{"ln1_w", "qkv_w", "q_norm_w", "k_norm_w",
                                                                   "attn_proj_w", "ln2_w", "fc_w", "fc_proj_w"}));
  const GptConfig q = Preset("tiny-qwen3");  // C 32, H 4, H_kv 2, D 16 (H·D != C), I 48
  const BlockLayout b = BlockLayout::For(q);
  EXPECT_EQ(b.qkv_w, 32);
  EXPECT_EQ(b.q_norm_w, 32 + 32 * (4 + 2 * 2) * 16);
  EXPECT_EQ(b.attn_proj_w, b.k_norm_w + 16);
  EXPECT_EQ(b.fc_w, b.ln2_w + 32);
  EXPECT_EQ(b.num_elems, 32 + 32 * 128 + 2 * 16 + 64 * 32 + 32 + 32 * 96 + 48 * 32);
  EXPECT_EQ(b.ln1_b, kAbsent);
  EXPECT_EQ(b.fc_b, kAbsent);
  // Norm weights start at 1, q/k norms included.
  std::vector<float> block(b.num_elems);
  InitUnitParams(q, 1, 3, block.data());
  EXPECT_EQ(block[b.q_norm_w], 1.0f);
  EXPECT_EQ(block[b.k_norm_w + 15], 1.0f);
  EXPECT_EQ(block[b.ln2_w], 1.0f);
}

TEST(GptConfigTest, InvalidFamilyShapesNameTheField) {
  auto message = [](const GptConfig& c) { return c.Validate().message(); };
  GptConfig c = Preset("tiny-llama");
  c.num_kv_heads = 3;  // 4 % 3 != 0
  EXPECT_NE(message(c).find("num_key_value_heads"), std::string::npos);
  c = Preset("tiny-llama");
  c.head_dim_size = 7;
  EXPECT_NE(message(c).find("even head_dim"), std::string::npos);
  c = Preset("tiny-llama");
  c.norm_eps = 0;
  EXPECT_NE(message(c).find("eps"), std::string::npos);
  c = Preset("tiny");
  c.norm_eps = 1e-6;  // LayerNorm's eps is fixed
  EXPECT_NE(message(c).find("LayerNorm"), std::string::npos);
  c = Preset("tiny-llama");
  c.rope_scaling.llama3 = true;
  c.rope_scaling.high_freq_factor = 0.5;
  EXPECT_NE(message(c).find("rope_scaling"), std::string::npos);
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
