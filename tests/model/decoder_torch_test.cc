// The decoder family on the CPU model against transformers' own models
// (torch_decoder.py, run with scripts/setup's Python in float64): the loss
// and every gradient of tiny GPT-2-, Llama-, Mistral-, Qwen2- and
// Qwen3-shaped models (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM: LayerNorm and RMSNorm, learned
// positions and RoPE with and without Llama 3 scaling, GELU and SwiGLU,
// grouped-query attention, q/k/v biases, q/k norm, tied and untied heads),
// with the plain and the flash attention and with activation checkpointing.
// The oracle maps zinf's unit tensors to the model's parameter names as
// views, so the unit layout is checked too; for the Llama family zinf's
// export of the same parameters as a Hugging Face folder must load with
// from_pretrained and give the oracle's logits. Skips, saying so, when that
// Python lacks torch, transformers or safetensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/hf_checkpoint.h"
#include "model/gpt.h"
#include "model_test_util.h"
#include "test_util.h"

namespace zinf::model {
namespace {

using test::MakeGrads;
using test::MakeModel;
using test::MakeParams;
using test::RandomTokens;
using test::Step;

constexpr const char* kModules = "torch transformers safetensors";

// `model_type` names the transformers class where the shape alone does not
// (mistral, with its attention window); "" lets the oracle go by the shape.
nlohmann::json ConfigJson(const GptConfig& c, const std::string& model_type, int64_t sliding_window) {
  nlohmann::json j = {{"vocab_size", c.vocab_size},
                      {"max_seq_len", c.max_seq_len},
                      {"num_layers", c.num_layers},
                      {"embed_dim", c.embed_dim},
                      {"num_heads", c.num_heads},
                      {"kv_heads", c.kv_heads()},
                      {"head_dim", c.head_dim()},
                      {"mlp_dim", c.mlp_dim()},
                      {"norm", c.norm == NormKind::kRmsNorm ? "rmsnorm" : "layernorm"},
                      {"norm_eps", c.norm_eps},
                      {"positions", c.positions == PositionKind::kRope ? "rope" : "learned"},
                      {"rope_theta", c.rope_theta},
                      {"mlp", c.mlp == MlpKind::kSwiGlu ? "swiglu" : "gelu"},
                      {"qkv_bias", c.qkv_bias},
                      {"linear_bias", c.linear_bias},
                      {"qk_norm", c.qk_norm},
                      {"tied_head", c.tied_head}};
  if (c.rope_scaling.llama3) {
    j["rope_scaling"] = {{"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position", c.rope_scaling.original_max_position}};
  }
  if (!model_type.empty()) j["model_type"] = model_type;
  if (sliding_window > 0) j["sliding_window"] = sliding_window;
  return j;
}

template <class T>
void WriteFile(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  ASSERT_TRUE(f.good()) << path;
}

struct TorchCase {
  const char* name;
  GptConfig config;
  int64_t batch, seq_len;
  AttentionKernel attention = AttentionKernel::kPlain;
  bool checkpointing = false;
  const char* model_type = "";
  int64_t sliding_window = 0;
  // transformers refuses the config.json zinf exports for this shape (see
  // torch_decoder.py); the oracle must say so, and loads the weights anyway.
  bool export_config_refused = false;
};

void PrintTo(const TorchCase& c, std::ostream* os) { *os << c.name; }

GptConfig Preset(const char* name) { return std::move(GptPreset(name)).value(); }

// Llama 3's frequency scaling on a tiny shape: an original context of 8
// positions puts the head's four frequencies in all three bands.
GptConfig ScaledRope() {
  GptConfig c = Preset("tiny-llama");
  c.name = "tiny-llama-scaled";
  c.rope_theta = 500000.0;
  c.rope_scaling.llama3 = true;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position = 8;
  return c;
}

// Sizes off the kernels' 16 lanes: D = 6, three query heads per key/value
// head, an intermediate size of 37, and H * D = 36 != C = 20 (which
// transformers 5's LlamaConfig refuses in a config.json).
GptConfig OddLlama() {
  GptConfig c = Preset("tiny-llama");
  c.name = "odd-llama";
  c.vocab_size = 53;
  c.max_seq_len = 11;
  c.embed_dim = 20;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim_size = 6;
  c.intermediate_size = 37;
  return c;
}

// Mistral's shape (Llama's blocks, one key/value head for four query heads
// here, theta 1e6) with its attention window as long as the run: zinf's
// attention is full causal, and `zinf train` takes a Mistral folder only when
// --seq-len is at most the window.
GptConfig TinyMistral() {
  GptConfig c = Preset("tiny-llama");
  c.name = "tiny-mistral";
  c.num_kv_heads = 1;
  c.intermediate_size = 56;
  c.rope_theta = 1000000.0;
  return c;
}

class DecoderTorchTest : public ::testing::TestWithParam<TorchCase> {};

// float32 against float64, as GptReferenceTest: the loss to 1e-5 relative,
// each gradient tensor to 1e-5 of its largest magnitude.
TEST_P(DecoderTorchTest, LossAndGradientsMatchPyTorch) {
  if (!zinf::test::PythonHas(kModules)) GTEST_SKIP() << zinf::test::PythonMissing(kModules);
  const TorchCase& tc = GetParam();
  const GptConfig& c = tc.config;
  ASSERT_TRUE(c.Validate().ok()) << c.Validate().ToString();
  const int64_t BT = tc.batch * tc.seq_len;
  auto params = MakeParams(c, 21);
  auto tokens = RandomTokens(BT, c.vocab_size, 22);
  auto targets = RandomTokens(BT, c.vocab_size, 23);
  targets[1] = -1;

  GptRunOptions o;
  o.batch_size = tc.batch;
  o.seq_len = tc.seq_len;
  o.attention = tc.attention;
  o.activation_checkpointing = tc.checkpointing;
  auto model = MakeModel(c, o);
  ASSERT_EQ(ResolveAttention(c, model->options()), tc.attention);
  auto grads = MakeGrads<float>(c, 7.0f);  // overwritten
  const float loss = Step(*model, params, grads, tokens, targets);

  const std::string dir = zinf::test::TestDir() + "/decoder_torch_" + tc.name;
  ASSERT_EQ(zinf::test::RunCommand("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").exit_code, 0);
  std::vector<float> flat;
  for (const auto& u : params) flat.insert(flat.end(), u.begin(), u.end());
  WriteFile(dir + "/params.bin", flat);
  WriteFile(dir + "/tokens.bin", tokens);
  WriteFile(dir + "/targets.bin", targets);
  // Llama-family shapes: the same parameters as a Hugging Face folder, in
  // shards of about a third of the model, which the oracle loads with
  // from_pretrained.
  const bool llama = c.norm == NormKind::kRmsNorm;
  if (llama) {
    data::HfExportOptions eo;
    eo.dtype = DType::kFloat32;
    eo.max_shard_bytes = static_cast<uint64_t>(NumParams(c)) * 4 / 3;
    ASSERT_TRUE(data::ExportHfCheckpoint(
                    [&](int u) -> Result<std::span<const float>> { return std::span<const float>(params[u]); }, c,
                    dir + "/hf", eo)
                    .ok());
  }
  {
    std::ofstream f(dir + "/case.json");
    f << nlohmann::json{{"config", ConfigJson(c, tc.model_type, tc.sliding_window)},
                        {"batch", tc.batch},
                        {"seq_len", tc.seq_len}}
             .dump(1);
  }
  const auto run = zinf::test::RunCommand("'" + zinf::test::Python() + "' '" + zinf::test::SourceDir() +
                                          "/tests/model/torch_decoder.py' '" + dir + "' 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  if (llama) {
    EXPECT_NE(run.output.find("safetensors file(s) match by name; from_pretrained gives"), std::string::npos)
        << run.output;
    EXPECT_EQ(run.output.find("from_pretrained refuses its config.json") != std::string::npos, tc.export_config_refused)
        << run.output;
  }
  double ref_loss = 0;
  std::ifstream(dir + "/loss.txt") >> ref_loss;
  std::ifstream gf(dir + "/grads.bin", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(gf)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size() % sizeof(double), 0u);
  std::vector<double> ref_grads(bytes.size() / sizeof(double));
  std::memcpy(ref_grads.data(), bytes.data(), bytes.size());
  ASSERT_EQ(static_cast<int64_t>(ref_grads.size()), NumParams(c));

  EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);
  double worst = 0;
  int64_t base = 0;
  for (int unit = 0; unit < NumUnits(c); ++unit) {
    for (const UnitTensor& t : UnitTensors(c, unit)) {
      double scale = 0, err = 0;
      for (int64_t i = 0; i < t.num_elems(); ++i) {
        const int64_t k = t.offset_elems + i;
        scale = std::max(scale, std::abs(ref_grads[base + k]));
        err = std::max(err, std::abs(grads[unit][k] - ref_grads[base + k]));
      }
      ASSERT_GT(scale, 0.0) << "unit " << unit << " " << t.name << ": the oracle's gradient is all zero";
      EXPECT_LE(err, 1e-5 * scale) << "unit " << unit << " " << t.name << ": max error " << err << " of scale "
                                   << scale;
      worst = std::max(worst, err / scale);
    }
    base += UnitNumParams(c, unit);
  }
  std::printf("  %s: loss %.8f vs torch %.8f (rel %.2e); worst gradient error %.2e of its tensor's scale\n%s",
              c.ToString().c_str(), loss, ref_loss, std::abs(loss - ref_loss) / ref_loss, worst, run.output.c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Family, DecoderTorchTest,
    ::testing::Values(TorchCase{"gpt2_tiny", Preset("tiny"), 2, 16}, TorchCase{"llama", Preset("tiny-llama"), 2, 16},
                      TorchCase{"llama_scaled_rope", ScaledRope(), 2, 16},
                      TorchCase{"qwen2", Preset("tiny-qwen2"), 2, 16}, TorchCase{"qwen3", Preset("tiny-qwen3"), 2, 16},
                      TorchCase{"mistral", TinyMistral(), 2, 16, AttentionKernel::kPlain, false, "mistral", 16},
                      TorchCase{"odd_llama", OddLlama(), 3, 11, AttentionKernel::kPlain, false, "", 0, true},
                      TorchCase{"llama_flash", Preset("tiny-llama"), 2, 16, AttentionKernel::kFlash},
                      TorchCase{"qwen3_flash_checkpointed", Preset("tiny-qwen3"), 2, 16, AttentionKernel::kFlash, true},
                      TorchCase{"qwen2_checkpointed", Preset("tiny-qwen2"), 2, 16, AttentionKernel::kPlain, true}),
    [](const auto& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace zinf::model
