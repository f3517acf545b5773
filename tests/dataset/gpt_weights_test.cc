// GPT weights in safetensors: the zinf and Hugging Face GPT-2 name maps,
// import of a generated HF-named checkpoint giving the same logits as the
// same weights under zinf names (bit for bit), exports in fp32/bf16/fp16
// that load back to the same loss, and one error listing every difference.
#include "data/gpt_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "common/float16.h"
#include "data_test_util.h"
#include "model/gpt.h"
#include "model/model_test_util.h"

namespace zinf::data {
namespace {

using model::GptConfig;
using model::GptModel;
using model::GptRunOptions;
using model::test::ConstPtrs;
using model::test::MakeArena;
using model::test::MakeParams;
using model::test::RandomTokens;
using model::test::Tiny;
using test::FreshDir;

using Units = std::vector<std::vector<float>>;

struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

void WriteTensors(const std::string& path, const std::vector<Tensor>& tensors) {
  std::vector<SafetensorsTensorSpec> specs;
  for (const Tensor& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  auto w = SafetensorsWriter::Begin(path, specs);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (const Tensor& t : tensors) ASSERT_TRUE(w->Write(t.name, t.bytes).ok());
  ASSERT_TRUE(w->Finish().ok());
}

std::vector<std::byte> F32Bytes(const float* p, int64_t n) {
  std::vector<std::byte> b(4 * n);
  std::memcpy(b.data(), p, 4 * n);
  return b;
}

// The tensors of `units` under `naming`, as F32.
std::vector<Tensor> TensorsOf(const GptConfig& c, const Units& units, WeightNaming naming) {
  std::vector<Tensor> out;
  for (const GptWeightName& w : GptWeightNames(c, naming)) {
    out.push_back(
        {w.name, "F32", w.shape, F32Bytes(units[w.unit].data() + w.tensor.offset_elems, w.tensor.num_elems())});
  }
  return out;
}

UnitSource SourceOf(const Units& units) {
  return [&units](int unit) -> Result<std::span<const float>> { return std::span<const float>(units[unit]); };
}

Units Import(const std::string& path, const GptConfig& c) {
  auto reader = SafetensorsReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (!reader.ok()) return {};
  auto units = ImportGptWeights(*reader, c);
  EXPECT_TRUE(units.ok()) << units.status().ToString();
  return units.ok() ? std::move(units).value() : Units{};
}

bool BitEqual(const Units& a, const Units& b) {
  if (a.size() != b.size()) return false;
  for (size_t u = 0; u < a.size(); ++u) {
    if (a[u].size() != b[u].size() || std::memcmp(a[u].data(), b[u].data(), 4 * a[u].size()) != 0) return false;
  }
  return true;
}

struct Outputs {
  float loss = 0;
  std::vector<float> probs;
};

// One forward of the tiny model, B = 2, T = 16: the loss and the softmax of
// the logits.
template <class P>
Outputs Forward(const GptConfig& c, const std::vector<std::vector<P>>& params, DType param_dtype = DType::kFloat32) {
  GptRunOptions o;
  o.batch_size = 2;
  o.seq_len = c.max_seq_len;
  o.param_dtype = param_dtype;
  auto model = GptModel::Create(c, o);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  auto arena = MakeArena((*model)->activation_bytes());
  (*model)->BindActivations(arena.get());
  const int64_t n = o.batch_size * o.seq_len;
  const std::vector<int32_t> tokens = RandomTokens(n, c.vocab_size, 3), targets = RandomTokens(n, c.vocab_size, 4);
  auto loss = (*model)->Forward(tokens.data(), targets.data(), ConstPtrs(params));
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  Outputs out;
  out.loss = loss.value_or(0);
  const float* p = (*model)->probabilities();
  out.probs.assign(p, p + n * c.vocab_size);
  return out;
}

void ExpectSameOutputs(const Outputs& a, const Outputs& b) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, 4), 0) << a.loss << " vs " << b.loss;
  ASSERT_EQ(a.probs.size(), b.probs.size());
  EXPECT_EQ(std::memcmp(a.probs.data(), b.probs.data(), 4 * a.probs.size()), 0);
}

TEST(GptWeightNamesTest, Gpt2NamesAndShapesAreHuggingFaces) {
  const GptConfig c = std::move(model::GptPreset("gpt2")).value();
  const auto names = GptWeightNames(c, WeightNaming::kHuggingFace);
  EXPECT_EQ(names.size(), 2u + 12u * 12u + 2u);
  std::map<std::string, std::vector<int64_t>> shape;
  int64_t total = 0;
  for (const auto& w : names) {
    shape[w.name] = w.shape;
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    total += n;
  }
  EXPECT_EQ(total, 124'439'808);  // GPT-2 small, tied head
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape["wte.weight"], (S{50257, 768}));
  EXPECT_EQ(shape["wpe.weight"], (S{1024, 768}));
  EXPECT_EQ(shape["h.0.ln_1.weight"], (S{768}));
  EXPECT_EQ(shape["h.0.attn.c_attn.weight"], (S{768, 2304}));
  EXPECT_EQ(shape["h.0.attn.c_attn.bias"], (S{2304}));
  EXPECT_EQ(shape["h.5.attn.c_proj.weight"], (S{768, 768}));
  EXPECT_EQ(shape["h.11.mlp.c_fc.weight"], (S{768, 3072}));
  EXPECT_EQ(shape["h.11.mlp.c_proj.weight"], (S{3072, 768}));
  EXPECT_EQ(shape["h.11.ln_2.bias"], (S{768}));
  EXPECT_EQ(shape["ln_f.bias"], (S{768}));
  EXPECT_EQ(GptWeightNames(c, WeightNaming::kHuggingFaceTransformer)[2].name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(GptWeightNames(c, WeightNaming::kZinf)[4].name, "blocks.0.qkv_w");
  EXPECT_EQ(*ParseWeightNaming("hf"), WeightNaming::kHuggingFace);
  EXPECT_FALSE(ParseWeightNaming("pytorch").ok());
}

// A checkpoint laid out as HF's GPT2LMHeadModel saves it — "transformer."
// prefix, the attn.bias mask buffers, a tied lm_head.weight, its own tensor
// order — imports to the same weights, and the same logits bit for bit, as
// those weights under zinf names.
TEST(GptWeightsTest, HuggingFaceCheckpointGivesTheSameLogitsAsZinfNames) {
  const std::string dir = FreshDir();
  const GptConfig c = Tiny();
  const Units params = MakeParams(c, 42);

  std::vector<Tensor> hf = TensorsOf(c, params, WeightNaming::kHuggingFaceTransformer);
  std::reverse(hf.begin(), hf.end());
  const int64_t T = c.max_seq_len;
  std::vector<float> mask(T * T);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j <= i; ++j) mask[i * T + j] = 1.0f;
  for (int l = 0; l < c.num_layers; ++l) {
    hf.push_back(
        {"transformer.h." + std::to_string(l) + ".attn.bias", "F32", {1, 1, T, T}, F32Bytes(mask.data(), T * T)});
  }
  hf.push_back(
      {"lm_head.weight", "F32", {c.vocab_size, c.embed_dim}, F32Bytes(params[0].data(), c.vocab_size * c.embed_dim)});
  WriteTensors(dir + "/hf.safetensors", hf);
  ASSERT_TRUE(
      ExportGptWeights(SourceOf(params), c, WeightNaming::kZinf, DType::kFloat32, dir + "/zinf.safetensors").ok());

  const Units from_hf = Import(dir + "/hf.safetensors", c);
  const Units from_zinf = Import(dir + "/zinf.safetensors", c);
  ASSERT_TRUE(BitEqual(from_hf, params));
  ASSERT_TRUE(BitEqual(from_zinf, params));
  const Outputs a = Forward(c, from_hf), b = Forward(c, from_zinf);
  ExpectSameOutputs(a, b);
  ExpectSameOutputs(a, Forward(c, params));
  EXPECT_GT(a.loss, 0.0f);
}

TEST(GptWeightsTest, ExportsLoadBackToTheSameLoss) {
  const std::string dir = FreshDir();
  const GptConfig c = Tiny();
  const Units params = MakeParams(c, 7);
  for (WeightNaming naming : {WeightNaming::kZinf, WeightNaming::kHuggingFace, WeightNaming::kHuggingFaceTransformer}) {
    const std::string path = dir + "/fp32.safetensors";
    ASSERT_TRUE(ExportGptWeights(SourceOf(params), c, naming, DType::kFloat32, path).ok());
    auto reader = SafetensorsReader::Open(path);
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ(reader->metadata().at("format"), "pt");
    EXPECT_EQ(reader->tensors().size(), GptWeightNames(c, naming).size());
    const Units back = Import(path, c);
    ASSERT_TRUE(BitEqual(back, params));
    ExpectSameOutputs(Forward(c, back), Forward(c, params));
  }
  // 16-bit: what a bf16/fp16 run computes with is the rounded copy; its
  // export loads back to exactly that copy, so the loss is the same bit for bit.
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<std::vector<uint16_t>> bits(params.size());
    Units rounded(params.size());
    for (size_t u = 0; u < params.size(); ++u) {
      for (float v : params[u]) {
        const uint16_t h = dtype == DType::kBFloat16 ? FloatToBf16Bits(v) : FloatToHalfBits(v);
        bits[u].push_back(h);
        rounded[u].push_back(dtype == DType::kBFloat16 ? Bf16BitsToFloat(h) : HalfBitsToFloat(h));
      }
    }
    const std::string path = dir + "/" + std::string(DTypeName(dtype)) + ".safetensors";
    ASSERT_TRUE(ExportGptWeights(SourceOf(params), c, WeightNaming::kHuggingFace, dtype, path).ok());
    auto reader = SafetensorsReader::Open(path);
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ(reader->Find("wte.weight")->dtype, dtype == DType::kBFloat16 ? "BF16" : "F16");
    const Units back = Import(path, c);
    ASSERT_TRUE(BitEqual(back, rounded)) << DTypeName(dtype);
    ExpectSameOutputs(Forward(c, back), Forward(c, bits, dtype));
  }
}

TEST(GptWeightsTest, ExportFetchesEachUnitOnceInOrder) {
  const GptConfig c = Tiny();
  const Units params = MakeParams(c, 1);
  std::vector<int> asked;
  UnitSource source = [&](int unit) -> Result<std::span<const float>> {
    asked.push_back(unit);
    return std::span<const float>(params[unit]);
  };
  ASSERT_TRUE(ExportGptWeights(source, c, WeightNaming::kZinf, DType::kFloat32, FreshDir() + "/w.safetensors").ok());
  EXPECT_EQ(asked, (std::vector<int>{0, 1, 2, 3}));

  UnitSource short_unit = [&](int unit) -> Result<std::span<const float>> {
    return std::span<const float>(params[unit]).first(params[unit].size() - 1);
  };
  Status s = ExportGptWeights(short_unit, c, WeightNaming::kZinf, DType::kFloat32, FreshDir() + "/w.safetensors");
  EXPECT_NE(s.message().find("export unit 0: got 2559 floats, expected 2560"), std::string::npos) << s.ToString();
  UnitSource failing = [&](int) -> Result<std::span<const float>> { return IoError("pread /nvme/x: EIO"); };
  s = ExportGptWeights(failing, c, WeightNaming::kZinf, DType::kFloat32, FreshDir() + "/w.safetensors");
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("export unit 0: pread /nvme/x"), std::string::npos) << s.ToString();
}

TEST(GptWeightsTest, ImportListsEveryDifference) {
  const std::string dir = FreshDir();
  const GptConfig c = Tiny();
  const Units params = MakeParams(c, 5);
  std::vector<Tensor> t = TensorsOf(c, params, WeightNaming::kHuggingFace);
  std::vector<Tensor> kept;
  for (Tensor& x : t) {
    if (x.name == "h.1.mlp.c_fc.bias") continue;  // missing
    if (x.name == "wpe.weight") {                 // mis-shaped: 8 positions instead of 16
      x.shape = {8, c.embed_dim};
      x.bytes.resize(4 * 8 * c.embed_dim);
    }
    if (x.name == "ln_f.bias") x.dtype = "I32";  // not a float
    kept.push_back(std::move(x));
  }
  kept.push_back({"h.1.mlp.gate.weight", "F32", {2}, std::vector<std::byte>(8)});  // extra
  kept.push_back(
      {"lm_head.weight", "F32", {c.vocab_size, c.embed_dim}, std::vector<std::byte>(4 * c.vocab_size * c.embed_dim)});
  WriteTensors(dir + "/bad.safetensors", kept);
  auto reader = SafetensorsReader::Open(dir + "/bad.safetensors");
  ASSERT_TRUE(reader.ok());
  auto r = ImportGptWeights(*reader, c);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  for (const char* needle :
       {"bad.safetensors: 5 differences from tiny", "(Hugging Face names)", "missing tensor 'h.1.mlp.c_fc.bias' [128]",
        "tensor 'wpe.weight' has shape [8, 32], expected [16, 32]",
        "tensor 'ln_f.bias' has dtype I32, expected F32, F16, BF16 or F64",
        "unexpected tensor 'h.1.mlp.gate.weight' [2]", "tensor 'lm_head.weight' differs from wte.weight"}) {
    EXPECT_NE(m.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << m;
  }

  // zinf names into another config: every tensor of the wrong size is named.
  ASSERT_TRUE(ExportGptWeights(SourceOf(params), c, WeightNaming::kZinf, DType::kFloat32, dir + "/z.safetensors").ok());
  GptConfig wider = c;
  wider.embed_dim = 64;
  auto z = SafetensorsReader::Open(dir + "/z.safetensors");
  auto wrong = ImportGptWeights(*z, wider);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("28 differences"), std::string::npos) << wrong.status().message();
  EXPECT_NE(wrong.status().message().find("tensor 'blocks.1.fc_proj_w' has shape [128, 32], expected [256, 64]"),
            std::string::npos);

  // The same tensor with and without the prefix.
  std::vector<Tensor> both = TensorsOf(c, params, WeightNaming::kHuggingFace);
  both.push_back(both[0]);
  both.back().name = "transformer.wte.weight";
  WriteTensors(dir + "/both.safetensors", both);
  auto b = SafetensorsReader::Open(dir + "/both.safetensors");
  auto dup = ImportGptWeights(*b, c);
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("'wte.weight' is present both with and without the 'transformer.' prefix"),
            std::string::npos)
      << dup.status().message();
}

}  // namespace
}  // namespace zinf::data
