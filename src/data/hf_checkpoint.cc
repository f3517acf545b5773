// Hugging Face Llama-family folders: config.json, the tensor map between
// Hugging Face's names and zinf's units, sharded import and export.
#include "data/hf_checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/float16.h"
#include "common/json_text.h"

namespace zinf::data {
namespace fs = std::filesystem;
using model::GptConfig;

namespace {

// One Hugging Face tensor and where its elements go in a unit's buffer: a
// plain copy to `offset`, or (transpose) element (r, i) of the [rows, in]
// tensor to offset + i · ld + r.
struct Piece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  bool transpose = false;
  int64_t ld = 0;
  int64_t num_elems() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

Status CheckLlamaFamily(const GptConfig& c) {
  if (c.norm != model::NormKind::kRmsNorm || c.positions != model::PositionKind::kRope ||
      c.mlp != model::MlpKind::kSwiGlu || c.linear_bias) {
    return InvalidArgument("Hugging Face folders: " + c.name +
                           " is not of the Llama family (RMSNorm, RoPE, SwiGLU, no MLP biases); GPT-2 weights go "
                           "through --init / zinf export --names hf");
  }
  return Status::Ok();
}

std::vector<Piece> PiecesOf(const GptConfig& c, int unit) {
  const int64_t C = c.embed_dim, V = c.vocab_size, D = c.head_dim(), Q = c.q_dim(), K = c.kv_dim();
  const int64_t S = c.qkv_dim(), I = c.mlp_dim();
  std::vector<Piece> p;
  switch (model::KindOfUnit(c, unit)) {
    case model::UnitKind::kEmbedding:
      p.push_back({"model.embed_tokens.weight", {V, C}, model::EmbeddingLayout::For(c).wte});
      break;
    case model::UnitKind::kFinalNorm: {
      const auto f = model::FinalNormLayout::For(c);
      p.push_back({"model.norm.weight", {C}, f.w});
      if (!c.tied_head) p.push_back({"lm_head.weight", {V, C}, f.lm_head});
      break;
    }
    case model::UnitKind::kBlock: {
      const auto b = model::BlockLayout::For(c);
      const std::string n = "model.layers." + std::to_string(unit - 1) + ".";
      p.push_back({n + "input_layernorm.weight", {C}, b.ln1_w});
      p.push_back({n + "self_attn.q_proj.weight", {Q, C}, b.qkv_w, true, S});
      p.push_back({n + "self_attn.k_proj.weight", {K, C}, b.qkv_w + Q, true, S});
      p.push_back({n + "self_attn.v_proj.weight", {K, C}, b.qkv_w + Q + K, true, S});
      if (c.qkv_bias) {
        p.push_back({n + "self_attn.q_proj.bias", {Q}, b.qkv_b});
        p.push_back({n + "self_attn.k_proj.bias", {K}, b.qkv_b + Q});
        p.push_back({n + "self_attn.v_proj.bias", {K}, b.qkv_b + Q + K});
      }
      if (c.qk_norm) {
        p.push_back({n + "self_attn.q_norm.weight", {D}, b.q_norm_w});
        p.push_back({n + "self_attn.k_norm.weight", {D}, b.k_norm_w});
      }
      p.push_back({n + "self_attn.o_proj.weight", {C, Q}, b.attn_proj_w, true, C});
      p.push_back({n + "post_attention_layernorm.weight", {C}, b.ln2_w});
      p.push_back({n + "mlp.gate_proj.weight", {I, C}, b.fc_w, true, 2 * I});
      p.push_back({n + "mlp.up_proj.weight", {I, C}, b.fc_w + I, true, 2 * I});
      p.push_back({n + "mlp.down_proj.weight", {C, I}, b.fc_proj_w, true, C});
      break;
    }
  }
  return p;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

float WidenAt(const SafetensorsTensor& t, int64_t i) {
  const std::byte* p = t.data.data();
  if (t.dtype == "F32") {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  if (t.dtype == "F64") {
    double d;
    std::memcpy(&d, p + 8 * i, 8);
    return static_cast<float>(d);
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return t.dtype == "BF16" ? Bf16BitsToFloat(h) : HalfBitsToFloat(h);
}

Result<std::string> ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound(path + ": cannot be read");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A JSON object from `text`; errors name `path` (and the line, column and key).
Result<nlohmann::json> ParseObject(std::string_view text, const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(ParsedJson parsed, ParseJsonText(text, path));
  if (!parsed.value.is_object()) return InvalidArgument(path + ": not a JSON object");
  return std::move(parsed.value);
}

Result<nlohmann::json> ReadJson(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadText(path));
  return ParseObject(text, path);
}

// A shard named by an index: a file of the folder, never a path elsewhere.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

Result<HfModel> ReadHfConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadText(path));
  ZINF_ASSIGN_OR_RETURN(HfModel m, ParseHfConfig(text, path));
  if (std::string name = fs::path(dir).filename().string(); !name.empty()) m.config.name = name;
  return m;
}

Result<HfModel> ParseHfConfig(const std::string& text, const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject(text, path));
  auto bad = [&](const std::string& key, const std::string& what) {
    return InvalidArgument(path + ": \"" + key + "\" " + what);
  };
  auto integer = [&](const char* key, int64_t& out, bool required = true) -> Status {
    if (!j.contains(key) || j[key].is_null()) return required ? bad(key, "is missing") : Status::Ok();
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1) return bad(key, "must be a positive integer");
    out = j[key].get<int64_t>();
    return Status::Ok();
  };
  auto number = [&](const char* key, double& out, bool required) -> Status {
    if (!j.contains(key) || j[key].is_null()) return required ? bad(key, "is missing") : Status::Ok();
    if (!j[key].is_number()) return bad(key, "must be a number");
    out = j[key].get<double>();
    return Status::Ok();
  };
  auto boolean = [&](const char* key, bool fallback) -> Result<bool> {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) return bad(key, "must be true or false");
    return j[key].get<bool>();
  };
  HfModel m;
  m.config_json = text;
  if (!j.contains("model_type") || !j["model_type"].is_string()) return bad("model_type", "is missing");
  m.model_type = j["model_type"].get<std::string>();
  if (m.model_type != "llama" && m.model_type != "mistral" && m.model_type != "qwen2" && m.model_type != "qwen3") {
    return bad("model_type", "is '" + m.model_type + "'; zinf reads llama, mistral, qwen2 and qwen3");
  }
  GptConfig& c = m.config;
  c.name = m.model_type;
  c.norm = model::NormKind::kRmsNorm;
  c.positions = model::PositionKind::kRope;
  c.mlp = model::MlpKind::kSwiGlu;
  c.linear_bias = false;
  ZINF_RETURN_IF_ERROR(integer("vocab_size", c.vocab_size));
  ZINF_RETURN_IF_ERROR(integer("hidden_size", c.embed_dim));
  ZINF_RETURN_IF_ERROR(integer("intermediate_size", c.intermediate_size));
  ZINF_RETURN_IF_ERROR(integer("num_hidden_layers", c.num_layers));
  ZINF_RETURN_IF_ERROR(integer("num_attention_heads", c.num_heads));
  c.num_kv_heads = c.num_heads;
  ZINF_RETURN_IF_ERROR(integer("num_key_value_heads", c.num_kv_heads, false));
  ZINF_RETURN_IF_ERROR(integer("head_dim", c.head_dim_size, false));
  ZINF_RETURN_IF_ERROR(integer("max_position_embeddings", c.max_seq_len));
  c.norm_eps = 1e-6;
  ZINF_RETURN_IF_ERROR(number("rms_norm_eps", c.norm_eps, true));
  c.rope_theta = 10000.0;
  ZINF_RETURN_IF_ERROR(number("rope_theta", c.rope_theta, false));
  ZINF_ASSIGN_OR_RETURN(c.tied_head, boolean("tie_word_embeddings", false));  // transformers' default
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    return bad("hidden_act", "is " + JsonSnippet(j["hidden_act"]) + "; the Llama family's MLP is SwiGLU (silu)");
  }
  ZINF_ASSIGN_OR_RETURN(const bool mlp_bias, boolean("mlp_bias", false));
  if (mlp_bias) return bad("mlp_bias", "is true; zinf's Llama MLP has no biases");
  ZINF_ASSIGN_OR_RETURN(c.qkv_bias, boolean("attention_bias", m.model_type == "qwen2"));
  if (c.qkv_bias && m.model_type != "qwen2") {
    return bad("attention_bias", "is true; zinf takes q/k/v biases (without an o_proj bias) for qwen2 only");
  }
  c.qk_norm = m.model_type == "qwen3";
  // transformers 5 writes RoPE's settings as one object, "rope_parameters"
  // ({"rope_type", "rope_theta", and the type's own keys}), where 4.x wrote a
  // top-level "rope_theta" and "rope_scaling"; the object wins when present.
  std::string rope_key = "rope_scaling";
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    rope_key = "rope_parameters";
    if (!j[rope_key].is_object()) return bad(rope_key, "must be an object");
    if (j[rope_key].contains("rope_theta")) {
      if (!j[rope_key]["rope_theta"].is_number()) return bad(rope_key + ".rope_theta", "must be a number");
      c.rope_theta = j[rope_key]["rope_theta"].get<double>();
    }
  }
  if (j.contains(rope_key) && !j[rope_key].is_null()) {
    const nlohmann::json& r = j[rope_key];
    if (!r.is_object()) return bad(rope_key, "must be an object");
    // "rope_type", or "type" in older files; value() would throw for a non-string.
    std::string type = "?";
    for (const char* key : {"type", "rope_type"}) {
      auto it = r.find(key);
      if (it == r.end()) continue;
      if (!it->is_string()) return bad(rope_key + "." + key, "must be a string");
      type = it->get<std::string>();
    }
    if (type == "llama3") {
      auto get = [&](const char* key, double& out) -> Status {
        if (!r.contains(key) || !r[key].is_number()) return bad(rope_key + "." + key, "is missing");
        out = r[key].get<double>();
        return Status::Ok();
      };
      double old_len = 0;
      c.rope_scaling.llama3 = true;
      ZINF_RETURN_IF_ERROR(get("factor", c.rope_scaling.factor));
      ZINF_RETURN_IF_ERROR(get("low_freq_factor", c.rope_scaling.low_freq_factor));
      ZINF_RETURN_IF_ERROR(get("high_freq_factor", c.rope_scaling.high_freq_factor));
      ZINF_RETURN_IF_ERROR(get("original_max_position_embeddings", old_len));
      // A length: a whole number that fits (a double beyond int64 does not convert).
      if (!(old_len >= 1 && old_len <= 1e15 && old_len == std::floor(old_len))) {
        return bad(rope_key + ".original_max_position_embeddings", "must be a positive whole number");
      }
      c.rope_scaling.original_max_position = static_cast<int64_t>(old_len);
    } else if (type != "default") {
      return bad(rope_key + ".rope_type", "is '" + type + "'; zinf applies default and llama3 RoPE");
    }
  }
  if (j.contains("sliding_window") && j["sliding_window"].is_number_integer()) {
    ZINF_ASSIGN_OR_RETURN(const bool use, boolean("use_sliding_window", false));
    if (m.model_type == "mistral" || use) {
      if (j["sliding_window"].get<int64_t>() < 0) return bad("sliding_window", "must be >= 0 or null");
      m.sliding_window = j["sliding_window"].get<int64_t>();
    }
  }
  if (Status st = c.Validate(); !st.ok()) return InvalidArgument(path + ": " + st.message());
  return m;
}

Result<HfCheckpoint> HfCheckpoint::Open(const std::string& dir, const GptConfig& config) {
  ZINF_RETURN_IF_ERROR(config.Validate());
  ZINF_RETURN_IF_ERROR(CheckLlamaFamily(config));
  HfCheckpoint ck;
  ck.config_ = config;
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> file
  std::set<std::string> listed;
  if (fs::exists(index_path)) {
    ZINF_ASSIGN_OR_RETURN(nlohmann::json index, ReadJson(index_path));
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      return InvalidArgument(index_path + ": \"weight_map\" is missing");
    }
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string() || !IsPlainFileName(file.get<std::string>())) {
        return InvalidArgument(index_path + ": weight_map[\"" + name + "\"] is " + JsonSnippet(file) +
                               ", not the name of a file in the folder");
      }
      weight_map[name] = file.get<std::string>();
      // In order of first mention, each once (a set: an index may name many files).
      if (listed.insert(file.get<std::string>()).second) ck.files_.push_back(file.get<std::string>());
    }
  } else {
    ck.files_.push_back("model.safetensors");
  }
  for (size_t f = 0; f < ck.files_.size(); ++f) {
    ZINF_ASSIGN_OR_RETURN(SafetensorsReader r, SafetensorsReader::Open(dir + "/" + ck.files_[f]));
    ck.readers_.push_back(std::make_shared<SafetensorsReader>(std::move(r)));
    for (const SafetensorsTensor& t : ck.readers_.back()->tensors()) {
      if (!weight_map.empty() && weight_map.count(t.name) && weight_map[t.name] != ck.files_[f]) continue;
      ck.tensors_[t.name] = {static_cast<int>(f), &t};
    }
  }
  // Every tensor the config needs, with its shape and a float dtype.
  std::map<std::string, bool> needed;
  for (int u = 0; u < model::NumUnits(config); ++u) {
    for (const Piece& p : PiecesOf(config, u)) {
      needed[p.name] = true;
      auto it = ck.tensors_.find(p.name);
      if (it == ck.tensors_.end()) {
        return InvalidArgument(dir + ": tensor '" + p.name + "' is missing (" + config.ToString() + ")");
      }
      const SafetensorsTensor& t = *it->second.second;
      const std::string& file = ck.files_[it->second.first];
      if (t.shape != p.shape) {
        return InvalidArgument(dir + "/" + file + ": tensor '" + p.name + "' has shape " + t.ShapeString() +
                               ", config.json implies " + ShapeString(p.shape));
      }
      if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16" && t.dtype != "F64") {
        return InvalidArgument(dir + "/" + file + ": tensor '" + p.name + "' is " + t.dtype +
                               "; zinf reads F32, F16, BF16 and F64");
      }
    }
  }
  for (const auto& [name, where] : ck.tensors_) {
    if (needed.count(name) || name.ends_with("rotary_emb.inv_freq")) continue;
    if (name == "lm_head.weight" && config.tied_head) continue;  // a tied head's copy
    return InvalidArgument(dir + "/" + ck.files_[where.first] + ": tensor '" + name + "' has no place in " +
                           config.ToString());
  }
  return ck;
}

Status HfCheckpoint::ReadUnit(int unit, std::span<float> out) const {
  if (unit < 0 || unit >= model::NumUnits(config_) ||
      static_cast<int64_t>(out.size()) != model::UnitNumParams(config_, unit)) {
    return InvalidArgument("HfCheckpoint::ReadUnit: unit " + std::to_string(unit) + " with a buffer of " +
                           std::to_string(out.size()) + " floats");
  }
  for (const Piece& p : PiecesOf(config_, unit)) {
    const SafetensorsTensor& t = *tensors_.at(p.name).second;
    if (!p.transpose) {
      ZINF_RETURN_IF_ERROR(SafetensorsReader::ReadAsFloat32(t, out.subspan(p.offset, p.num_elems())));
      continue;
    }
    const int64_t rows = p.shape[0], in = p.shape[1];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < in; ++i) out[p.offset + i * p.ld + r] = WidenAt(t, r * in + i);
    }
  }
  return Status::Ok();
}

std::string HfConfigJson(const GptConfig& c) {
  const std::string type = c.qk_norm ? "qwen3" : c.qkv_bias ? "qwen2" : "llama";
  const std::string arch = type == "qwen3"   ? "Qwen3ForCausalLM"
                           : type == "qwen2" ? "Qwen2ForCausalLM"
                                             : "LlamaForCausalLM";
  nlohmann::json j = {{"architectures", {arch}},
                      {"model_type", type},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.embed_dim},
                      {"intermediate_size", c.mlp_dim()},
                      {"num_hidden_layers", c.num_layers},
                      {"num_attention_heads", c.num_heads},
                      {"num_key_value_heads", c.kv_heads()},
                      {"head_dim", c.head_dim()},
                      {"max_position_embeddings", c.max_seq_len},
                      {"rms_norm_eps", c.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", c.tied_head},
                      {"attention_bias", c.qkv_bias},
                      {"mlp_bias", false}};
  if (c.rope_scaling.llama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j.dump(2);
}

namespace {

Status WriteText(const std::string& path, const std::string& text) {
  ZINF_ASSIGN_OR_RETURN(FileWriter w, FileWriter::Create(path));
  ZINF_RETURN_IF_ERROR(w.Write(text.data(), text.size()));
  return w.Commit();
}

}  // namespace

Status ExportHfCheckpoint(const UnitSource& units, const GptConfig& c, const std::string& dir,
                          const HfExportOptions& o) {
  ZINF_RETURN_IF_ERROR(c.Validate());
  ZINF_RETURN_IF_ERROR(CheckLlamaFamily(c));
  if (o.dtype != DType::kFloat32 && o.dtype != DType::kBFloat16 && o.dtype != DType::kFloat16) {
    return InvalidArgument("Hugging Face export: dtype must be fp32, bf16 or fp16");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError(dir + ": cannot create the directory: " + ec.message());
  const size_t elem_bytes = DTypeSizeBytes(o.dtype);
  const char* st_dtype = o.dtype == DType::kFloat32 ? "F32" : o.dtype == DType::kBFloat16 ? "BF16" : "F16";

  // Tensors in unit order, cut into shards of at most max_shard_bytes.
  struct Item {
    Piece piece;
    int unit;
    int shard;
  };
  std::vector<Item> items;
  std::vector<uint64_t> shard_bytes;
  for (int u = 0; u < model::NumUnits(c); ++u) {
    for (Piece& p : PiecesOf(c, u)) {
      const uint64_t bytes = static_cast<uint64_t>(p.num_elems()) * elem_bytes;
      if (shard_bytes.empty() || (shard_bytes.back() > 0 && shard_bytes.back() + bytes > o.max_shard_bytes)) {
        shard_bytes.push_back(0);
      }
      shard_bytes.back() += bytes;
      items.push_back({std::move(p), u, static_cast<int>(shard_bytes.size()) - 1});
    }
  }
  const int num_shards = static_cast<int>(shard_bytes.size());
  auto shard_name = [&](int s) {
    if (num_shards == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", s + 1, num_shards);
    return std::string(buf);
  };

  nlohmann::json weight_map = nlohmann::json::object();
  int loaded_unit = -1;
  std::span<const float> unit_data;
  std::vector<unsigned char> row;
  size_t next = 0;
  for (int s = 0; s < num_shards; ++s) {
    std::vector<SafetensorsTensorSpec> specs;
    for (size_t i = next; i < items.size() && items[i].shard == s; ++i) {
      specs.push_back({items[i].piece.name, st_dtype, items[i].piece.shape});
      weight_map[items[i].piece.name] = shard_name(s);
    }
    ZINF_ASSIGN_OR_RETURN(SafetensorsWriter writer,
                          SafetensorsWriter::Begin(dir + "/" + shard_name(s), std::move(specs), {{"format", "pt"}}));
    for (; next < items.size() && items[next].shard == s; ++next) {
      const Item& it = items[next];
      if (it.unit != loaded_unit) {
        auto got = units(it.unit);
        if (!got.ok()) return std::move(got).status().WithContext("export unit " + std::to_string(it.unit));
        unit_data = *got;
        if (static_cast<int64_t>(unit_data.size()) != model::UnitNumParams(c, it.unit)) {
          return InvalidArgument("export unit " + std::to_string(it.unit) + ": got " +
                                 std::to_string(unit_data.size()) + " floats");
        }
        loaded_unit = it.unit;
      }
      // One Hugging Face row at a time: [in] elements of a transposed
      // weight, or a run of a plain tensor.
      const Piece& p = it.piece;
      const int64_t rows = p.transpose ? p.shape[0] : 1;
      const int64_t width = p.transpose ? p.shape[1] : p.num_elems();
      constexpr int64_t kChunk = 1 << 16;
      row.resize(static_cast<size_t>(std::min(width, kChunk)) * elem_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i0 = 0; i0 < width; i0 += kChunk) {
          const int64_t n = std::min(kChunk, width - i0);
          for (int64_t i = 0; i < n; ++i) {
            const float v = p.transpose ? unit_data[p.offset + (i0 + i) * p.ld + r] : unit_data[p.offset + i0 + i];
            if (o.dtype == DType::kFloat32) {
              std::memcpy(row.data() + 4 * i, &v, 4);
            } else {
              const uint16_t h = o.dtype == DType::kBFloat16 ? FloatToBf16Bits(v) : FloatToHalfBits(v);
              std::memcpy(row.data() + 2 * i, &h, 2);
            }
          }
          ZINF_RETURN_IF_ERROR(
              writer.Write(p.name, std::as_bytes(std::span<const unsigned char>(row.data(), n * elem_bytes))));
        }
      }
    }
    ZINF_RETURN_IF_ERROR(writer.Finish());
  }
  if (num_shards > 1) {
    uint64_t total = 0;
    for (uint64_t b : shard_bytes) total += b;
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    ZINF_RETURN_IF_ERROR(WriteText(dir + "/model.safetensors.index.json", index.dump(2)));
  }
  std::string config_json = o.config_json.empty() ? HfConfigJson(c) : o.config_json;
  nlohmann::json cj = nlohmann::json::parse(config_json, nullptr, false);
  if (cj.is_discarded() || !cj.is_object())
    return InvalidArgument("Hugging Face export: config_json is not a JSON object");
  const char* dtype_name = o.dtype == DType::kFloat32    ? "float32"
                           : o.dtype == DType::kBFloat16 ? "bfloat16"
                                                         : "float16";
  cj["torch_dtype"] = dtype_name;
  if (cj.contains("dtype")) cj["dtype"] = dtype_name;  // transformers 5's name for it
  ZINF_RETURN_IF_ERROR(WriteText(dir + "/config.json", cj.dump(2)));
  if (!o.tokenizer_dir.empty()) {
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                             "generation_config.json"}) {
      const fs::path from = fs::path(o.tokenizer_dir) / name;
      if (!fs::exists(from)) continue;
      fs::copy_file(from, fs::path(dir) / name, fs::copy_options::overwrite_existing, ec);
      if (ec) return IoError(from.string() + ": cannot copy to " + dir + ": " + ec.message());
    }
  }
  return Status::Ok();
}

}  // namespace zinf::data
