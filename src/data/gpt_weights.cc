#include "data/gpt_weights.h"

#include <cstring>
#include <map>
#include <set>

#include "common/float16.h"

namespace zinf::data {
namespace {

using model::GptConfig;
using model::UnitTensor;

// zinf tensor name inside a block -> HF suffix after "h.N.".
const std::map<std::string, std::string>& BlockHfNames() {
  static const std::map<std::string, std::string> m = {
      {"ln1_w", "ln_1.weight"},
      {"ln1_b", "ln_1.bias"},
      {"qkv_w", "attn.c_attn.weight"},
      {"qkv_b", "attn.c_attn.bias"},
      {"attn_proj_w", "attn.c_proj.weight"},
      {"attn_proj_b", "attn.c_proj.bias"},
      {"ln2_w", "ln_2.weight"},
      {"ln2_b", "ln_2.bias"},
      {"fc_w", "mlp.c_fc.weight"},
      {"fc_b", "mlp.c_fc.bias"},
      {"fc_proj_w", "mlp.c_proj.weight"},
      {"fc_proj_b", "mlp.c_proj.bias"},
  };
  return m;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

constexpr std::string_view kPrefix = "transformer.";

// h.N.attn.bias / h.N.attn.masked_bias: HF's mask buffers.
bool IsHfBuffer(std::string_view name) {
  if (!name.starts_with("h.")) return false;
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

}  // namespace

Result<WeightNaming> ParseWeightNaming(std::string_view name) {
  if (name == "zinf") return WeightNaming::kZinf;
  if (name == "hf" || name == "huggingface") return WeightNaming::kHuggingFace;
  if (name == "hf-transformer") return WeightNaming::kHuggingFaceTransformer;
  return InvalidArgument("unknown weight naming '" + std::string(name) + "'; expected zinf, hf or hf-transformer");
}

std::vector<GptWeightName> GptWeightNames(const GptConfig& c, WeightNaming naming) {
  std::vector<GptWeightName> out;
  const std::string prefix = naming == WeightNaming::kHuggingFaceTransformer ? std::string(kPrefix) : "";
  const bool hf = naming != WeightNaming::kZinf;
  for (int unit = 0; unit < model::NumUnits(c); ++unit) {
    const model::UnitKind kind = model::KindOfUnit(c, unit);
    for (const UnitTensor& t : model::UnitTensors(c, unit)) {
      GptWeightName w;
      w.unit = unit;
      w.tensor = t;
      w.shape = t.cols == 1 ? std::vector<int64_t>{t.rows} : std::vector<int64_t>{t.rows, t.cols};
      if (kind == model::UnitKind::kEmbedding) {
        w.name = hf ? prefix + t.name + ".weight" : t.name;
      } else if (kind == model::UnitKind::kFinalNorm) {
        w.name = hf ? prefix + (t.name == "lnf_w" ? "ln_f.weight" : "ln_f.bias") : t.name;
      } else {
        const std::string layer = std::to_string(unit - 1);
        w.name = hf ? prefix + "h." + layer + "." + BlockHfNames().at(t.name) : "blocks." + layer + "." + t.name;
      }
      out.push_back(std::move(w));
    }
  }
  return out;
}

Result<std::vector<std::vector<float>>> ImportGptWeights(const SafetensorsReader& reader, const GptConfig& c) {
  ZINF_RETURN_IF_ERROR(c.Validate());
  // Naming: HF when any tensor has an HF name (prefixed or not), else zinf.
  bool hf = false;
  for (const SafetensorsTensor& t : reader.tensors()) {
    std::string_view n = t.name;
    if (n.starts_with(kPrefix)) n.remove_prefix(kPrefix.size());
    for (std::string_view p : {"h.", "wte.", "wpe.", "ln_f.", "lm_head."}) hf = hf || n.starts_with(p);
  }
  const std::vector<GptWeightName> expected = GptWeightNames(c, hf ? WeightNaming::kHuggingFace : WeightNaming::kZinf);

  // File names, with HF's optional prefix removed.
  std::map<std::string, const SafetensorsTensor*> present;
  std::vector<std::string> differences;
  for (const SafetensorsTensor& t : reader.tensors()) {
    std::string key = t.name;
    if (hf && key.starts_with(kPrefix)) key = key.substr(kPrefix.size());
    if (!present.emplace(key, &t).second) {
      differences.push_back("tensor '" + key + "' is present both with and without the 'transformer.' prefix");
    }
  }

  std::vector<std::vector<float>> units(model::NumUnits(c));
  for (int u = 0; u < model::NumUnits(c); ++u) units[u].assign(model::UnitNumParams(c, u), 0.0f);
  std::set<std::string> used;
  for (const GptWeightName& w : expected) {
    auto it = present.find(w.name);
    if (it == present.end()) {
      differences.push_back("missing tensor '" + w.name + "' " + ShapeString(w.shape));
      continue;
    }
    used.insert(w.name);
    const SafetensorsTensor& t = *it->second;
    if (t.shape != w.shape) {
      differences.push_back("tensor '" + t.name + "' has shape " + t.ShapeString() + ", expected " +
                            ShapeString(w.shape));
      continue;
    }
    const std::span<float> dst(units[w.unit].data() + w.tensor.offset_elems, w.tensor.num_elems());
    if (Status st = SafetensorsReader::ReadAsFloat32(t, dst); !st.ok()) {
      differences.push_back("tensor '" + t.name + "' has dtype " + t.dtype + ", expected F32, F16, BF16 or F64");
    }
  }
  for (const auto& [key, t] : present) {
    if (used.count(key)) continue;
    if (hf && IsHfBuffer(key)) continue;
    if (hf && key == "lm_head.weight") {
      // Tied to wte: accepted only when it is wte.
      const SafetensorsTensor* wte = present.count("wte.weight") ? present.at("wte.weight") : nullptr;
      const bool same = wte && t->dtype == wte->dtype && t->shape == wte->shape && t->data.size() == wte->data.size() &&
                        std::memcmp(t->data.data(), wte->data.data(), t->data.size()) == 0;
      if (!same) {
        differences.push_back("tensor '" + t->name +
                              "' differs from wte.weight; zinf ties the LM head to wte and cannot load a separate one");
      }
      continue;
    }
    differences.push_back("unexpected tensor '" + t->name + "' " + t->ShapeString());
  }
  if (!differences.empty()) {
    std::string msg = reader.name() + ": " + std::to_string(differences.size()) + " difference" +
                      (differences.size() == 1 ? "" : "s") + " from " + c.ToString() + " (" +
                      (hf ? "Hugging Face" : "zinf") + " names):";
    for (const std::string& d : differences) msg += "\n  " + d;
    return InvalidArgument(msg);
  }
  return units;
}

Status ExportGptWeights(const UnitSource& units, const GptConfig& c, WeightNaming naming, DType dtype,
                        const std::string& path) {
  ZINF_RETURN_IF_ERROR(c.Validate());
  const char* st_dtype = dtype == DType::kFloat32 ? "F32" : dtype == DType::kBFloat16 ? "BF16" : "F16";
  const std::vector<GptWeightName> names = GptWeightNames(c, naming);
  std::vector<SafetensorsTensorSpec> specs;
  for (const GptWeightName& w : names) specs.push_back({w.name, st_dtype, w.shape});
  ZINF_ASSIGN_OR_RETURN(
      SafetensorsWriter writer,
      SafetensorsWriter::Begin(path, std::move(specs), {{"format", "pt"}, {"zinf_config", c.ToString()}}));

  constexpr size_t kChunkElems = 64 * 1024;  // 256 KiB of fp32 at most
  std::vector<uint16_t> narrow(dtype == DType::kFloat32 ? 0 : kChunkElems);
  int loaded_unit = -1;
  std::span<const float> unit_data;
  for (const GptWeightName& w : names) {
    if (w.unit != loaded_unit) {
      auto got = units(w.unit);
      if (!got.ok()) return std::move(got).status().WithContext("export unit " + std::to_string(w.unit));
      unit_data = *got;
      if (static_cast<int64_t>(unit_data.size()) != model::UnitNumParams(c, w.unit)) {
        return InvalidArgument("export unit " + std::to_string(w.unit) + ": got " + std::to_string(unit_data.size()) +
                               " floats, expected " + std::to_string(model::UnitNumParams(c, w.unit)));
      }
      loaded_unit = w.unit;
    }
    const float* src = unit_data.data() + w.tensor.offset_elems;
    const size_t n = static_cast<size_t>(w.tensor.num_elems());
    for (size_t i = 0; i < n; i += kChunkElems) {
      const size_t m = std::min(kChunkElems, n - i);
      if (dtype == DType::kFloat32) {
        ZINF_RETURN_IF_ERROR(writer.Write(w.name, std::as_bytes(std::span<const float>(src + i, m))));
        continue;
      }
      for (size_t k = 0; k < m; ++k) {
        narrow[k] = dtype == DType::kBFloat16 ? FloatToBf16Bits(src[i + k]) : FloatToHalfBits(src[i + k]);
      }
      ZINF_RETURN_IF_ERROR(writer.Write(w.name, std::as_bytes(std::span<const uint16_t>(narrow.data(), m))));
    }
  }
  return writer.Finish();
}

}  // namespace zinf::data
