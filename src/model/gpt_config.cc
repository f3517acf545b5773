// GptConfig presets, the unit layout and GPT-2's initialisation.
#include "model/gpt_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>

#include "common/check.h"
#include "common/units.h"

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

}  // namespace

Status GptConfig::Validate() const {
  auto positive = [&](const char* field, int64_t v) -> Status {
    if (v < 1) return InvalidArgument("gpt config '" + name + "': " + field + " must be >= 1, got " + std::to_string(v));
    return Status::Ok();
  };
  ZINF_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  ZINF_RETURN_IF_ERROR(positive("max_seq_len", max_seq_len));
  ZINF_RETURN_IF_ERROR(positive("num_layers", num_layers));
  ZINF_RETURN_IF_ERROR(positive("num_heads", num_heads));
  ZINF_RETURN_IF_ERROR(positive("embed_dim", embed_dim));
  if (embed_dim % num_heads != 0) {
    return InvalidArgument("gpt config '" + name + "': embed_dim " + std::to_string(embed_dim) +
                           " is not a multiple of num_heads " + std::to_string(num_heads));
  }
  // BLAS takes 32-bit dimensions and leading dimensions (the widest is V or 4C).
  constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
  if (vocab_size > kMaxDim || max_seq_len > kMaxDim || 4 * embed_dim > kMaxDim) {
    return InvalidArgument("gpt config '" + name + "': dimensions must stay below 2^31");
  }
  // Every element count below is a product of at most three dimensions.
  const double largest = static_cast<double>(vocab_size + max_seq_len) * static_cast<double>(embed_dim) +
                         12.0 * static_cast<double>(embed_dim) * static_cast<double>(embed_dim) *
                             static_cast<double>(num_layers + 1);
  if (largest > 1e17) return InvalidArgument("gpt config '" + name + "': too many parameters");
  return Status::Ok();
}

std::string GptConfig::ToString() const {
  return name + ": V=" + std::to_string(vocab_size) + " T=" + std::to_string(max_seq_len) +
         " C=" + std::to_string(embed_dim) + " L=" + std::to_string(num_layers) + " H=" + std::to_string(num_heads) +
         " (" + FormatCount(static_cast<double>(NumParams(*this))) + " parameters)";
}

Result<GptConfig> GptPreset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name == p.name) {
      GptConfig c;
      c.name = p.name;
      c.vocab_size = p.vocab_size;
      c.max_seq_len = p.max_seq_len;
      c.num_layers = p.num_layers;
      c.num_heads = p.num_heads;
      c.embed_dim = p.embed_dim;
      return c;
    }
  }
  std::string names;
  for (const Preset& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  return NotFound("unknown model preset '" + std::string(name) + "'; known: " + names);
}

std::vector<std::string> GptPresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

UnitKind KindOfUnit(const GptConfig& c, int unit) {
  ZINF_CHECK(unit >= 0 && unit < NumUnits(c));
  if (unit == EmbeddingUnit()) return UnitKind::kEmbedding;
  if (unit == FinalNormUnit(c)) return UnitKind::kFinalNorm;
  return UnitKind::kBlock;
}

EmbeddingLayout EmbeddingLayout::For(const GptConfig& c) {
  EmbeddingLayout l;
  l.wte = 0;
  l.wpe = c.vocab_size * c.embed_dim;
  l.num_elems = l.wpe + c.max_seq_len * c.embed_dim;
  return l;
}

BlockLayout BlockLayout::For(const GptConfig& c) {
  const int64_t C = c.embed_dim;
  BlockLayout l;
  int64_t at = 0;
  auto take = [&](int64_t n) {
    int64_t offset = at;
    at += n;
    return offset;
  };
  l.ln1_w = take(C);
  l.ln1_b = take(C);
  l.qkv_w = take(C * 3 * C);
  l.qkv_b = take(3 * C);
  l.attn_proj_w = take(C * C);
  l.attn_proj_b = take(C);
  l.ln2_w = take(C);
  l.ln2_b = take(C);
  l.fc_w = take(C * 4 * C);
  l.fc_b = take(4 * C);
  l.fc_proj_w = take(4 * C * C);
  l.fc_proj_b = take(C);
  l.num_elems = at;
  return l;
}

FinalNormLayout FinalNormLayout::For(const GptConfig& c) {
  FinalNormLayout l;
  l.w = 0;
  l.b = c.embed_dim;
  l.num_elems = 2 * c.embed_dim;
  return l;
}

std::vector<UnitTensor> UnitTensors(const GptConfig& c, int unit) {
  const int64_t C = c.embed_dim;
  switch (KindOfUnit(c, unit)) {
    case UnitKind::kEmbedding: {
      auto l = EmbeddingLayout::For(c);
      return {{"wte", l.wte, c.vocab_size, C}, {"wpe", l.wpe, c.max_seq_len, C}};
    }
    case UnitKind::kFinalNorm: {
      auto l = FinalNormLayout::For(c);
      return {{"lnf_w", l.w, C, 1}, {"lnf_b", l.b, C, 1}};
    }
    case UnitKind::kBlock: {
      auto l = BlockLayout::For(c);
      return {{"ln1_w", l.ln1_w, C, 1},           {"ln1_b", l.ln1_b, C, 1},
              {"qkv_w", l.qkv_w, C, 3 * C},       {"qkv_b", l.qkv_b, 3 * C, 1},
              {"attn_proj_w", l.attn_proj_w, C, C}, {"attn_proj_b", l.attn_proj_b, C, 1},
              {"ln2_w", l.ln2_w, C, 1},           {"ln2_b", l.ln2_b, C, 1},
              {"fc_w", l.fc_w, C, 4 * C},         {"fc_b", l.fc_b, 4 * C, 1},
              {"fc_proj_w", l.fc_proj_w, 4 * C, C}, {"fc_proj_b", l.fc_proj_b, C, 1}};
    }
  }
  return {};
}

int64_t UnitNumParams(const GptConfig& c, int unit) {
  switch (KindOfUnit(c, unit)) {
    case UnitKind::kEmbedding: return EmbeddingLayout::For(c).num_elems;
    case UnitKind::kBlock: return BlockLayout::For(c).num_elems;
    case UnitKind::kFinalNorm: return FinalNormLayout::For(c).num_elems;
  }
  return 0;
}

int64_t NumParams(const GptConfig& c) {
  return EmbeddingLayout::For(c).num_elems + c.num_layers * BlockLayout::For(c).num_elems +
         FinalNormLayout::For(c).num_elems;
}

int64_t MaxUnitNumParams(const GptConfig& c) {
  return std::max({EmbeddingLayout::For(c).num_elems, BlockLayout::For(c).num_elems,
                   FinalNormLayout::For(c).num_elems});
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
    const bool is_norm = t.name.starts_with("ln");
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
  return tokens * (2.0 * static_cast<double>(NumParams(c)) +
                   4.0 * static_cast<double>(c.num_layers * c.embed_dim) * static_cast<double>(seq_len));
}

double TrainingFlops(const GptConfig& c, int64_t batch, int64_t seq_len) { return 3.0 * ForwardFlops(c, batch, seq_len); }

}  // namespace zinf::model
