// Hugging Face Llama-family folders: export then import gives the same
// parameters (fp32 bit for bit, bf16 rounded once), sharded or not, with
// config.json describing the same model; and every folder zinf cannot
// honour is one error naming the key or the tensor.
#include "data/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <random>

#include "common/float16.h"
#include "data_test_util.h"

namespace zinf::data {
namespace {

using model::GptConfig;
using test::FreshDir;
using test::ReadFile;
using test::WriteFile;

GptConfig Preset(const char* name) { return std::move(model::GptPreset(name)).value(); }

std::vector<std::vector<float>> RandomUnits(const GptConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<std::vector<float>> units(model::NumUnits(c));
  for (int u = 0; u < model::NumUnits(c); ++u) {
    units[u].resize(model::UnitNumParams(c, u));
    for (float& v : units[u]) v = d(rng);
  }
  return units;
}

Status Export(const std::vector<std::vector<float>>& units, const GptConfig& c, const std::string& dir,
              HfExportOptions o = {}) {
  return ExportHfCheckpoint([&](int u) -> Result<std::span<const float>> { return std::span<const float>(units[u]); },
                            c, dir, o);
}

std::vector<std::vector<float>> Import(const GptConfig& c, const std::string& dir) {
  auto ck = HfCheckpoint::Open(dir, c);
  EXPECT_TRUE(ck.ok()) << ck.status().ToString();
  std::vector<std::vector<float>> units(model::NumUnits(c));
  for (int u = 0; u < model::NumUnits(c); ++u) {
    units[u].resize(model::UnitNumParams(c, u));
    if (ck.ok()) {
      EXPECT_TRUE(ck->ReadUnit(u, units[u]).ok());
    }
  }
  return units;
}

void ExpectSameShape(const GptConfig& a, const GptConfig& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.embed_dim, b.embed_dim);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.kv_heads(), b.kv_heads());
  EXPECT_EQ(a.head_dim(), b.head_dim());
  EXPECT_EQ(a.mlp_dim(), b.mlp_dim());
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.llama3, b.rope_scaling.llama3);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.tied_head, b.tied_head);
  EXPECT_EQ(NumParams(a), NumParams(b));
}

TEST(HfCheckpointTest, ExportThenImportRoundTripsEveryVariantSharded) {
  GptConfig scaled = Preset("tiny-llama");
  scaled.rope_scaling.llama3 = true;
  scaled.rope_scaling.factor = 8;
  scaled.rope_scaling.original_max_position = 8;
  for (const GptConfig& c : {Preset("tiny-llama"), Preset("tiny-qwen2"), Preset("tiny-qwen3"), scaled}) {
    SCOPED_TRACE(c.ToString());
    const std::string dir = FreshDir() + "/" + c.name;
    const auto units = RandomUnits(c, 5);
    HfExportOptions o;
    o.dtype = DType::kFloat32;
    o.max_shard_bytes = static_cast<uint64_t>(model::NumParams(c)) * 4 / 4;  // four or five shards
    ASSERT_TRUE(Export(units, c, dir, o).ok());
    EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/model-00002-of-00005.safetensors") ||
                std::filesystem::exists(dir + "/model-00002-of-00004.safetensors"));
    auto hf = ReadHfConfig(dir);
    ASSERT_TRUE(hf.ok()) << hf.status().ToString();
    ExpectSameShape(hf->config, c);
    EXPECT_EQ(Import(hf->config, dir), units);
  }
}

TEST(HfCheckpointTest, Bf16ExportRoundsOnceAndOneShardIsModelSafetensors) {
  const GptConfig c = Preset("tiny-qwen3");
  const std::string dir = FreshDir();
  const auto units = RandomUnits(c, 6);
  ASSERT_TRUE(Export(units, c, dir).ok());  // bf16, one shard
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  EXPECT_NE(ReadFile(dir + "/config.json").find("\"bfloat16\""), std::string::npos);
  const auto back = Import(c, dir);
  for (int u = 0; u < model::NumUnits(c); ++u) {
    for (size_t i = 0; i < units[u].size(); ++i) {
      ASSERT_EQ(back[u][i], Bf16BitsToFloat(FloatToBf16Bits(units[u][i]))) << "unit " << u << " element " << i;
    }
  }
}

TEST(HfCheckpointTest, TokenizerFilesAndTheSourceConfigAreCarriedOver) {
  const GptConfig c = Preset("tiny-llama");
  const std::string src = FreshDir() + "/src", out = FreshDir() + "/out";
  std::filesystem::create_directories(src);
  WriteFile(src + "/tokenizer.json", "{\"model\": {}}");
  WriteFile(src + "/tokenizer_config.json", "{}");
  const auto units = RandomUnits(c, 7);
  ASSERT_TRUE(Export(units, c, src).ok());
  auto hf = ReadHfConfig(src);
  ASSERT_TRUE(hf.ok());
  HfExportOptions o;
  o.config_json = hf->config_json;
  o.tokenizer_dir = src;
  o.dtype = DType::kFloat16;
  ASSERT_TRUE(Export(units, c, out, o).ok());
  EXPECT_EQ(ReadFile(out + "/tokenizer.json"), "{\"model\": {}}");
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer_config.json"));
  EXPECT_NE(ReadFile(out + "/config.json").find("\"float16\""), std::string::npos);
}

// Rewrites one key of DIR/config.json.
void SetConfigKey(const std::string& dir, const std::string& key, const nlohmann::json& value) {
  auto j = nlohmann::json::parse(ReadFile(dir + "/config.json"));
  j[key] = value;
  WriteFile(dir + "/config.json", j.dump());
}

// transformers 5's save_pretrained writes RoPE's settings as one
// "rope_parameters" object, without "rope_theta" or "rope_scaling", and the
// dtype as "dtype".
TEST(HfCheckpointTest, Transformers5RopeParametersAndDtypeAreRead) {
  GptConfig c = Preset("tiny-llama");
  c.rope_theta = 500000.0;
  c.rope_scaling.llama3 = true;
  c.rope_scaling.factor = 8;
  c.rope_scaling.original_max_position = 8;
  const std::string dir = FreshDir();
  ASSERT_TRUE(Export(RandomUnits(c, 9), c, dir).ok());
  auto j = nlohmann::json::parse(ReadFile(dir + "/config.json"));
  nlohmann::json rope = j["rope_scaling"];
  rope["rope_theta"] = 500000.0;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j.erase("torch_dtype");
  j["rope_parameters"] = rope;
  j["dtype"] = "float32";
  WriteFile(dir + "/config.json", j.dump());
  auto hf = ReadHfConfig(dir);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  ExpectSameShape(hf->config, c);
  EXPECT_EQ(hf->config.rope_scaling.original_max_position, 8);

  SetConfigKey(dir, "rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}});
  hf = ReadHfConfig(dir);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  EXPECT_EQ(hf->config.rope_theta, 1000000.0);
  EXPECT_FALSE(hf->config.rope_scaling.llama3);

  SetConfigKey(dir, "rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 1000000.0}, {"factor", 4.0}});
  hf = ReadHfConfig(dir);
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("\"rope_parameters.rope_type\" is 'yarn'"), std::string::npos)
      << hf.status().message();

  // An export keeps the source's config.json with both dtype keys set.
  SetConfigKey(dir, "rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1000000.0}});
  hf = ReadHfConfig(dir);
  ASSERT_TRUE(hf.ok());
  HfExportOptions o;
  o.config_json = hf->config_json;
  o.dtype = DType::kBFloat16;
  const std::string out = dir + "/out";
  ASSERT_TRUE(Export(RandomUnits(hf->config, 10), hf->config, out, o).ok());
  const auto exported = nlohmann::json::parse(ReadFile(out + "/config.json"));
  EXPECT_EQ(exported["dtype"], "bfloat16");
  EXPECT_EQ(exported["torch_dtype"], "bfloat16");
  EXPECT_EQ(exported["rope_parameters"]["rope_theta"], 1000000.0);
}

TEST(HfCheckpointTest, FoldersZinfCannotHonourAreOneLineNamingTheKeyOrTensor) {
  const GptConfig c = Preset("tiny-llama");
  const std::string dir = FreshDir();
  ASSERT_TRUE(Export(RandomUnits(c, 8), c, dir).ok());
  auto expect_error = [&](const std::string& needle) {
    auto hf = ReadHfConfig(dir);
    Status st = hf.status();
    if (hf.ok()) st = HfCheckpoint::Open(dir, hf->config).status();
    ASSERT_FALSE(st.ok()) << "expected an error naming " << needle;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  };
  const std::string original = ReadFile(dir + "/config.json");
  auto restore = [&] { WriteFile(dir + "/config.json", original); };

  SetConfigKey(dir, "model_type", "gpt_neox");
  expect_error("\"model_type\" is 'gpt_neox'");
  restore();
  SetConfigKey(dir, "rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}});
  expect_error("rope_scaling.rope_type");
  restore();
  SetConfigKey(dir, "hidden_act", "gelu");
  expect_error("hidden_act");
  restore();
  SetConfigKey(dir, "num_hidden_layers", 3);
  expect_error("tensor 'model.layers.2.input_layernorm.weight' is missing");
  restore();
  SetConfigKey(dir, "intermediate_size", 40);
  expect_error("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [48, 32], config.json implies [40, 32]");
  restore();
  SetConfigKey(dir, "num_key_value_heads", 3);
  expect_error("num_key_value_heads");
  restore();
  SetConfigKey(dir, "tie_word_embeddings", true);  // lm_head.weight then has no place... it is a tied copy
  {
    auto hf = ReadHfConfig(dir);
    ASSERT_TRUE(hf.ok());
    EXPECT_TRUE(HfCheckpoint::Open(dir, hf->config).ok()) << "a tied model's lm_head copy is ignored";
  }
  restore();
  // A tensor that belongs nowhere.
  {
    auto hf = ReadHfConfig(dir);
    ASSERT_TRUE(hf.ok());
    GptConfig fewer = hf->config;
    fewer.num_layers = 1;
    EXPECT_NE(HfCheckpoint::Open(dir, fewer).status().message().find("has no place"), std::string::npos);
  }
  std::filesystem::remove(dir + "/config.json");
  const Status missing = ReadHfConfig(dir).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(dir + "/config.json"), std::string::npos) << missing.message();
}

// config.json files that threw out of ParseHfConfig (nlohmann's value() on
// a non-string), converted a double beyond int64 (UB), or overflowed int64
// inside GptConfig::Validate: each is now one InvalidArgument naming the key.
TEST(HfCheckpointInputTest, HostileConfigsAreOneLineNamingTheKey) {
  nlohmann::json base = nlohmann::json::parse(HfConfigJson(Preset("tiny-llama")));
  auto error_of = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = base;
    edit(j);
    auto hf = ParseHfConfig(j.dump(), "config.json");
    EXPECT_FALSE(hf.ok()) << j.dump();
    if (hf.ok()) return std::string();
    EXPECT_EQ(hf.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(hf.status().message().rfind("config.json", 0), 0u) << hf.status().message();
    EXPECT_EQ(hf.status().message().find('\n'), std::string::npos) << hf.status().message();
    return hf.status().message();
  };
  EXPECT_NE(error_of([](auto& j) {
              j["rope_scaling"] = {{"rope_type", 3}};
            }).find("rope_scaling.rope_type"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& j) {
              j["rope_scaling"] = {{"type", nullptr}};
            }).find("rope_scaling.type"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& j) { j["rope_scaling"] = "llama3"; }).find("\"rope_scaling\" must be an object"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& j) {
              j["model_type"] = "qwen2";
              j["sliding_window"] = 4;
              j["use_sliding_window"] = "yes";
            }).find("\"use_sliding_window\" must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& j) {
              j["rope_scaling"] = {{"rope_type", "llama3"},
                                   {"factor", 8.0},
                                   {"low_freq_factor", 1.0},
                                   {"high_freq_factor", 4.0},
                                   {"original_max_position_embeddings", 1e300}};
            }).find("rope_scaling.original_max_position_embeddings"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& j) {
              j["num_attention_heads"] = 2147483647;
              j["num_key_value_heads"] = 1;
              j["head_dim"] = 2147483646;
            }).find("num_heads x head_dim"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& j) { j["intermediate_size"] = int64_t{1} << 62; }).find("intermediate_size"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& j) { j["num_hidden_layers"] = int64_t{1} << 40; }).find("num_layers"), std::string::npos);
  EXPECT_NE(error_of([](auto& j) {
              j["sliding_window"] = -5;
              j["model_type"] = "mistral";
            }).find("sliding_window"),
            std::string::npos);
  auto deep = ParseHfConfig(std::string(100000, '[') + std::string(100000, ']'), "config.json");
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("config.json:1:65: JSON nests deeper than 64 levels"), std::string::npos);
  auto huge = ParseHfConfig(R"({"model_type": "llama", "rms_norm_eps": 1e999})", "config.json");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("(at rms_norm_eps)"), std::string::npos) << huge.status().message();
}

// An index may only name files of the folder: "../x" opened files anywhere.
TEST(HfCheckpointInputTest, IndexNamesOnlyFilesOfTheFolder) {
  const GptConfig c = Preset("tiny-llama");
  const std::string dir = FreshDir();
  HfExportOptions sharded;
  sharded.max_shard_bytes = 1 << 12;
  ASSERT_TRUE(Export(RandomUnits(c, 3), c, dir, sharded).ok());
  for (const char* name : {"../model.safetensors", "/dev/zero", "", "."}) {
    const nlohmann::json index = {{"weight_map", {{"model.embed_tokens.weight", name}}}};
    WriteFile(dir + "/model.safetensors.index.json", index.dump());
    Status st = HfCheckpoint::Open(dir, c).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(st.message().find("not the name of a file in the folder"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace zinf::data
