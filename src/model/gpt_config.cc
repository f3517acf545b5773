// GptConfig presets, the unit layout and GPT-2's initialisation.
#include "model/gpt_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>

#include "common/check.h"
#include "common/units.h"
#include "math/gpt_math.h"

namespace zinf::model {
namespace {

struct Preset {
  const char* name;
  int64_t vocab_size, max_seq_len, num_layers, num_heads, embed_dim;
};

// GPT-2's sizes are those of the released checkpoints (openai/gpt-2,
// hparams.json); the larger ones are GPT-3's table 2.1 (Brown et al. 2020),
// with 16 heads for 1.3B (as GPT-Neo 1.3B; the table's 24 × 128 is not its
// d_model) and d_model 5120 for 13B (the table's 5140 is not 40 × 128).
constexpr Preset kPresets[] = {
    {"tiny", 64, 16, 2, 4, 32},
    {"gpt2", 50257, 1024, 12, 12, 768},
    {"gpt2-medium", 50257, 1024, 24, 16, 1024},
    {"gpt2-large", 50257, 1024, 36, 20, 1280},
    {"gpt2-xl", 50257, 1024, 48, 25, 1600},
    {"gpt-1.3b", 50257, 2048, 24, 16, 2048},
    {"gpt-3b", 50257, 2048, 32, 32, 2560},
    {"gpt-7b", 50257, 2048, 32, 32, 4096},
    {"gpt-13b", 50257, 2048, 40, 40, 5120},
};

enum class Family { kLlama, kQwen2, kQwen3, kMistral };

struct LlamaPreset {
  const char* name;
  Family family;
  int64_t vocab_size, max_seq_len, num_layers, num_heads, kv_heads, embed_dim, head_dim, intermediate;
  double rope_theta, norm_eps;
  double llama3_factor;  // 0: no Llama 3 frequency scaling
  bool tied;
};

// The shapes of the released checkpoints' config.json (Hugging Face:
// meta-llama/Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B, Qwen/Qwen2.5-7B,
// Qwen/Qwen3-8B, mistralai/Mistral-7B-v0.3, HuggingFaceTB/SmolLM2-1.7B).
// The tiny ones are test shapes of each variant (GQA, biases, q/k norm).
constexpr LlamaPreset kLlamaPresets[] = {
    {"llama-3.2-1b", Family::kLlama, 128256, 131072, 16, 32, 8, 2048, 64, 8192, 500000.0, 1e-5, 32.0, true},
    {"llama-3.2-3b", Family::kLlama, 128256, 131072, 28, 24, 8, 3072, 128, 8192, 500000.0, 1e-5, 32.0, true},
    {"llama-3.1-8b", Family::kLlama, 128256, 131072, 32, 32, 8, 4096, 128, 14336, 500000.0, 1e-5, 8.0, false},
    {"qwen2.5-7b", Family::kQwen2, 152064, 131072, 28, 28, 4, 3584, 128, 18944, 1000000.0, 1e-6, 0.0, false},
    {"qwen3-8b", Family::kQwen3, 151936, 40960, 36, 32, 8, 4096, 128, 12288, 1000000.0, 1e-6, 0.0, false},
    {"mistral-7b", Family::kMistral, 32768, 32768, 32, 32, 8, 4096, 128, 14336, 1000000.0, 1e-5, 0.0, false},
    {"smollm2-1.7b", Family::kLlama, 49152, 8192, 24, 32, 32, 2048, 64, 8192, 130000.0, 1e-5, 0.0, true},
    {"tiny-llama", Family::kLlama, 64, 16, 2, 4, 2, 32, 8, 48, 10000.0, 1e-5, 0.0, false},
    {"tiny-qwen2", Family::kQwen2, 64, 16, 2, 4, 2, 32, 8, 48, 10000.0, 1e-6, 0.0, true},
    {"tiny-qwen3", Family::kQwen3, 64, 16, 2, 4, 2, 32, 16, 48, 10000.0, 1e-6, 0.0, false},
};

// The five dimensions every preset names.
GptConfig Dimensions(const char* name, int64_t vocab_size, int64_t max_seq_len, int64_t num_layers, int64_t num_heads,
                     int64_t embed_dim) {
  GptConfig c;
  c.name = name;
  c.vocab_size = vocab_size;
  c.max_seq_len = max_seq_len;
  c.num_layers = num_layers;
  c.num_heads = num_heads;
  c.embed_dim = embed_dim;
  return c;
}

GptConfig FromLlamaPreset(const LlamaPreset& p) {
  GptConfig c = Dimensions(p.name, p.vocab_size, p.max_seq_len, p.num_layers, p.num_heads, p.embed_dim);
  c.norm = NormKind::kRmsNorm;
  c.norm_eps = p.norm_eps;
  c.positions = PositionKind::kRope;
  c.rope_theta = p.rope_theta;
  if (p.llama3_factor > 0) {
    c.rope_scaling.llama3 = true;
    c.rope_scaling.factor = p.llama3_factor;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position = 8192;
  }
  c.mlp = MlpKind::kSwiGlu;
  c.intermediate_size = p.intermediate;
  c.num_kv_heads = p.kv_heads;
  c.head_dim_size = p.head_dim;
  c.qkv_bias = p.family == Family::kQwen2;
  c.linear_bias = false;
  c.qk_norm = p.family == Family::kQwen3;
  c.tied_head = p.tied;
  return c;
}

std::string KnownPresetNames() {
  std::string names;
  for (const Preset& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  for (const LlamaPreset& p : kLlamaPresets) names += std::string(", ") + p.name;
  return names;
}

}  // namespace

Status GptConfig::Validate() const {
  auto positive = [&](const char* field, int64_t v) -> Status {
    if (v < 1)
      return InvalidArgument("gpt config '" + name + "': " + field + " must be >= 1, got " + std::to_string(v));
    return Status::Ok();
  };
  ZINF_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  ZINF_RETURN_IF_ERROR(positive("max_seq_len", max_seq_len));
  ZINF_RETURN_IF_ERROR(positive("num_layers", num_layers));
  ZINF_RETURN_IF_ERROR(positive("num_heads", num_heads));
  ZINF_RETURN_IF_ERROR(positive("embed_dim", embed_dim));
  auto bad = [&](const std::string& what) { return InvalidArgument("gpt config '" + name + "': " + what); };
  // BLAS takes 32-bit dimensions and a unit index is an int. Each dimension
  // is bounded before any product of them is formed, so none overflows.
  constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
  constexpr int64_t kMaxLayers = int64_t{1} << 20;
  for (const auto& [field, v] :
       {std::pair{"vocab_size", vocab_size}, std::pair{"max_seq_len", max_seq_len}, std::pair{"embed_dim", embed_dim},
        std::pair{"num_heads", num_heads}, std::pair{"num_kv_heads", num_kv_heads},
        std::pair{"head_dim", head_dim_size}, std::pair{"intermediate_size", intermediate_size}}) {
    if (v > kMaxDim) return bad(std::string(field) + " " + std::to_string(v) + " is not below 2^31");
  }
  if (num_layers > kMaxLayers) return bad("num_layers " + std::to_string(num_layers) + " is above 2^20");
  if (intermediate_size < 0) return bad("intermediate_size must be >= 1 (or 0 for 4 × embed_dim)");
  if (num_kv_heads < 0) return bad("num_kv_heads must be >= 1 (or 0 for num_heads)");
  if (head_dim_size < 0) return bad("head_dim must be >= 1 (or 0 for embed_dim / num_heads)");
  if (head_dim_size == 0 && embed_dim % num_heads != 0) {
    return bad("embed_dim " + std::to_string(embed_dim) + " is not a multiple of num_heads " +
               std::to_string(num_heads));
  }
  if (num_heads % kv_heads() != 0) {
    return bad("num_heads " + std::to_string(num_heads) + " is not a multiple of num_key_value_heads " +
               std::to_string(kv_heads()));
  }
  if (!(norm_eps > 0.0 && std::isfinite(norm_eps))) return bad("the norm's eps must be > 0");
  if (norm == NormKind::kLayerNorm && norm_eps != math::kLayerNormEps) {
    return bad("LayerNorm takes eps 1e-5 only, got " + std::to_string(norm_eps));
  }
  if (positions == PositionKind::kRope) {
    if (head_dim() % 2 != 0) return bad("RoPE needs an even head_dim, got " + std::to_string(head_dim()));
    if (!(rope_theta > 1.0 && std::isfinite(rope_theta))) return bad("rope_theta must be > 1");
    const RopeScaling& r = rope_scaling;
    if (r.llama3 && !(r.factor >= 1.0 && r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor &&
                      r.original_max_position >= 1)) {
      return bad(
          "llama3 rope_scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and "
          "original_max_position_embeddings >= 1");
    }
  }
  // Leading dimensions too (H·D and the fused q|k|v width, in double first).
  if (static_cast<double>(num_heads) * static_cast<double>(head_dim()) * 3.0 > static_cast<double>(kMaxDim)) {
    return bad("num_heads x head_dim " + std::to_string(num_heads) + " x " + std::to_string(head_dim()) +
               " is not below 2^31");
  }
  if (vocab_size > kMaxDim || max_seq_len > kMaxDim || fc_dim() > kMaxDim || qkv_dim() > kMaxDim ||
      embed_dim > kMaxDim) {
    return bad("dimensions must stay below 2^31");
  }
  // Every element count below is a product of at most three dimensions.
  const double C = static_cast<double>(embed_dim);
  const double largest = static_cast<double>(2 * vocab_size + max_seq_len) * C +
                         (static_cast<double>(qkv_dim() + q_dim()) * C + 3.0 * static_cast<double>(mlp_dim()) * C) *
                             static_cast<double>(num_layers + 1);
  if (largest > 1e17) return bad("too many parameters");
  return Status::Ok();
}

bool GptConfig::IsGpt2Family() const {
  return norm == NormKind::kLayerNorm && positions == PositionKind::kLearned && mlp == MlpKind::kGelu &&
         mlp_dim() == 4 * embed_dim && kv_heads() == num_heads && head_dim() * num_heads == embed_dim && qkv_bias &&
         linear_bias && !qk_norm && tied_head;
}

std::string GptConfig::ToString() const {
  std::string s = name + ": V=" + std::to_string(vocab_size) + " T=" + std::to_string(max_seq_len) +
                  " C=" + std::to_string(embed_dim) + " L=" + std::to_string(num_layers) +
                  " H=" + std::to_string(num_heads);
  if (!IsGpt2Family()) {
    s += " H_kv=" + std::to_string(kv_heads()) + " D=" + std::to_string(head_dim()) + " I=" + std::to_string(mlp_dim());
    s += norm == NormKind::kRmsNorm ? " rmsnorm" : " layernorm";
    s += positions == PositionKind::kRope ? " rope" : " learned-positions";
    s += mlp == MlpKind::kSwiGlu ? " swiglu" : " gelu";
    if (qkv_bias) s += " qkv-bias";
    if (linear_bias) s += " linear-bias";
    if (qk_norm) s += " qk-norm";
    if (!tied_head) s += " untied";
  }
  // The exact count with thousands separators after the rounded one.
  std::string exact = std::to_string(NumParams(*this));
  for (int i = static_cast<int>(exact.size()) - 3; i > 0; i -= 3) exact.insert(static_cast<size_t>(i), ",");
  return s + " (" + FormatCount(static_cast<double>(NumParams(*this))) + " parameters: " + exact + ")";
}

Result<GptConfig> GptPreset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) return Dimensions(p.name, p.vocab_size, p.max_seq_len, p.num_layers, p.num_heads, p.embed_dim);
  }
  for (const LlamaPreset& p : kLlamaPresets) {
    if (name == p.name) return FromLlamaPreset(p);
  }
  return NotFound("unknown model preset '" + std::string(name) + "'; known: " + KnownPresetNames());
}

std::vector<std::string> GptPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  for (const LlamaPreset& p : kLlamaPresets) names.emplace_back(p.name);
  return names;
}

int64_t DefaultSeqLen(const GptConfig& c) {
  return c.positions == PositionKind::kRope ? std::min<int64_t>(c.max_seq_len, 4096) : c.max_seq_len;
}

UnitKind KindOfUnit(const GptConfig& c, int unit) {
  ZINF_CHECK(unit >= 0 && unit < NumUnits(c));
  if (unit == EmbeddingUnit()) return UnitKind::kEmbedding;
  if (unit == FinalNormUnit(c)) return UnitKind::kFinalNorm;
  return UnitKind::kBlock;
}

namespace {

// Hands out consecutive element offsets.
class Offsets {
 public:
  int64_t Take(int64_t n) {
    const int64_t offset = at_;
    at_ += n;
    return offset;
  }
  int64_t TakeIf(bool present, int64_t n) { return present ? Take(n) : kAbsent; }
  int64_t at() const { return at_; }

 private:
  int64_t at_ = 0;
};

}  // namespace

EmbeddingLayout EmbeddingLayout::For(const GptConfig& c) {
  EmbeddingLayout l;
  Offsets o;
  l.wte = o.Take(c.vocab_size * c.embed_dim);
  l.wpe = o.TakeIf(c.positions == PositionKind::kLearned, c.max_seq_len * c.embed_dim);
  l.num_elems = o.at();
  return l;
}

BlockLayout BlockLayout::For(const GptConfig& c) {
  const int64_t C = c.embed_dim, D = c.head_dim(), I = c.mlp_dim();
  const bool layer_norm = c.norm == NormKind::kLayerNorm;
  BlockLayout l;
  Offsets o;
  l.ln1_w = o.Take(C);
  l.ln1_b = o.TakeIf(layer_norm, C);
  l.qkv_w = o.Take(C * c.qkv_dim());
  l.qkv_b = o.TakeIf(c.qkv_bias, c.qkv_dim());
  l.q_norm_w = o.TakeIf(c.qk_norm, D);
  l.k_norm_w = o.TakeIf(c.qk_norm, D);
  l.attn_proj_w = o.Take(c.q_dim() * C);
  l.attn_proj_b = o.TakeIf(c.linear_bias, C);
  l.ln2_w = o.Take(C);
  l.ln2_b = o.TakeIf(layer_norm, C);
  l.fc_w = o.Take(C * c.fc_dim());
  l.fc_b = o.TakeIf(c.linear_bias, c.fc_dim());
  l.fc_proj_w = o.Take(I * C);
  l.fc_proj_b = o.TakeIf(c.linear_bias, C);
  l.num_elems = o.at();
  return l;
}

FinalNormLayout FinalNormLayout::For(const GptConfig& c) {
  FinalNormLayout l;
  Offsets o;
  l.w = o.Take(c.embed_dim);
  l.b = o.TakeIf(c.norm == NormKind::kLayerNorm, c.embed_dim);
  l.lm_head = o.TakeIf(!c.tied_head, c.vocab_size * c.embed_dim);
  l.num_elems = o.at();
  return l;
}

std::vector<UnitTensor> UnitTensors(const GptConfig& c, int unit) {
  const int64_t C = c.embed_dim, D = c.head_dim();
  std::vector<UnitTensor> out;
  auto add = [&](const char* name, int64_t offset, int64_t rows, int64_t cols) {
    if (offset != kAbsent) out.push_back({name, offset, rows, cols});
  };
  switch (KindOfUnit(c, unit)) {
    case UnitKind::kEmbedding: {
      const auto l = EmbeddingLayout::For(c);
      add("wte", l.wte, c.vocab_size, C);
      add("wpe", l.wpe, c.max_seq_len, C);
      break;
    }
    case UnitKind::kFinalNorm: {
      const auto l = FinalNormLayout::For(c);
      add("lnf_w", l.w, C, 1);
      add("lnf_b", l.b, C, 1);
      add("lm_head_w", l.lm_head, c.vocab_size, C);
      break;
    }
    case UnitKind::kBlock: {
      const auto l = BlockLayout::For(c);
      add("ln1_w", l.ln1_w, C, 1);
      add("ln1_b", l.ln1_b, C, 1);
      add("qkv_w", l.qkv_w, C, c.qkv_dim());
      add("qkv_b", l.qkv_b, c.qkv_dim(), 1);
      add("q_norm_w", l.q_norm_w, D, 1);
      add("k_norm_w", l.k_norm_w, D, 1);
      add("attn_proj_w", l.attn_proj_w, c.q_dim(), C);
      add("attn_proj_b", l.attn_proj_b, C, 1);
      add("ln2_w", l.ln2_w, C, 1);
      add("ln2_b", l.ln2_b, C, 1);
      add("fc_w", l.fc_w, C, c.fc_dim());
      add("fc_b", l.fc_b, c.fc_dim(), 1);
      add("fc_proj_w", l.fc_proj_w, c.mlp_dim(), C);
      add("fc_proj_b", l.fc_proj_b, C, 1);
      break;
    }
  }
  return out;
}

int64_t UnitNumParams(const GptConfig& c, int unit) {
  switch (KindOfUnit(c, unit)) {
    case UnitKind::kEmbedding:
      return EmbeddingLayout::For(c).num_elems;
    case UnitKind::kBlock:
      return BlockLayout::For(c).num_elems;
    case UnitKind::kFinalNorm:
      return FinalNormLayout::For(c).num_elems;
  }
  return 0;
}

int64_t NumParams(const GptConfig& c) {
  return EmbeddingLayout::For(c).num_elems + c.num_layers * BlockLayout::For(c).num_elems +
         FinalNormLayout::For(c).num_elems;
}

int64_t MaxUnitNumParams(const GptConfig& c) {
  return std::max(
      {EmbeddingLayout::For(c).num_elems, BlockLayout::For(c).num_elems, FinalNormLayout::For(c).num_elems});
}

void InitUnitParams(const GptConfig& c, int unit, uint64_t seed, float* out) {
  // One generator per unit, so a unit's values do not depend on which other
  // units were initialised (the engine initialises shards independently).
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(unit) + 1);
  // Box-Muller on our own uniforms: std::normal_distribution's algorithm is
  // not specified, and the values must not change with the standard library.
  // Each draw gives two independent normals (r cos θ, r sin θ).
  auto fill_normal = [&](int64_t offset, int64_t n, double std_dev) {
    constexpr double kScale = 1.0 / 9007199254740992.0;  // 2^-53
    for (int64_t i = 0; i < n; i += 2) {
      const double u1 = (static_cast<double>(rng() >> 11) + 1.0) * kScale;  // (0, 1]
      const double u2 = static_cast<double>(rng() >> 11) * kScale;
      const double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * std::numbers::pi * u2;
      out[offset + i] = static_cast<float>(std_dev * r * std::cos(theta));
      if (i + 1 < n) out[offset + i + 1] = static_cast<float>(std_dev * r * std::sin(theta));
    }
  };
  auto fill = [&](int64_t offset, int64_t n, float v) {
    for (int64_t i = 0; i < n; ++i) out[offset + i] = v;
  };
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.num_layers));
  for (const UnitTensor& t : UnitTensors(c, unit)) {
    const bool is_norm = t.name.starts_with("ln") || t.name.ends_with("_norm_w");
    const bool is_bias = t.name.ends_with("_b");
    if (is_norm) {
      fill(t.offset_elems, t.num_elems(), is_bias ? 0.0f : 1.0f);
    } else if (is_bias) {
      fill(t.offset_elems, t.num_elems(), 0.0f);
    } else if (t.name == "attn_proj_w" || t.name == "fc_proj_w") {
      fill_normal(t.offset_elems, t.num_elems(), proj_std);
    } else {
      fill_normal(t.offset_elems, t.num_elems(), 0.02);
    }
  }
}

double ForwardFlops(const GptConfig& c, int64_t batch, int64_t seq_len) {
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq_len);
  // An untied head's product is lm_head_w's; the embedding table is a lookup.
  const int64_t product_params = NumParams(c) - (c.tied_head ? 0 : c.vocab_size * c.embed_dim);
  return tokens * (2.0 * static_cast<double>(product_params) +
                   4.0 * static_cast<double>(c.num_layers * c.q_dim()) * static_cast<double>(seq_len));
}

double TrainingFlops(const GptConfig& c, int64_t batch, int64_t seq_len) {
  return 3.0 * ForwardFlops(c, batch, seq_len);
}

}  // namespace zinf::model
