// Hugging Face model folders of the Llama family, in and out: config.json
// plus model.safetensors, or a sharded set (model-0000k-of-0000n.safetensors
// with model.safetensors.index.json), under Hugging Face's tensor names and
// layouts, to and from the per-unit fp32 buffers of model/gpt_config.h.
//
// Architectures (config.json "model_type"): llama (Llama 2, 3, 3.1, 3.2,
// SmolLM), mistral (without a sliding window shorter than the run, checked
// by the caller through HfModel::sliding_window), qwen2 (q/k/v biases) and
// qwen3 (q/k RMSNorm). RoPE: default, or rope_type "llama3", from
// "rope_theta" and "rope_scaling" (transformers 4) or "rope_parameters"
// (transformers 5). The activation must be silu, attention_bias and mlp_bias
// as the architecture has them.
//
// Names and layouts, block N, C = hidden_size, Q = H·D, K = H_kv·D,
// I = intermediate_size (nn.Linear weights are [out, in]; zinf's are
// [in, out], so every projection is transposed on the way in and out):
//   model.embed_tokens.weight [V, C]                 wte
//   model.layers.N.input_layernorm.weight [C]        ln1_w
//   model.layers.N.self_attn.{q,k,v}_proj.weight     qkv_w columns q | k | v
//     [Q, C], [K, C], [K, C]                         (and .bias: qkv_b)
//   model.layers.N.self_attn.{q,k}_norm.weight [D]   q_norm_w, k_norm_w
//   model.layers.N.self_attn.o_proj.weight [C, Q]    attn_proj_w
//   model.layers.N.post_attention_layernorm.weight   ln2_w
//   model.layers.N.mlp.{gate,up}_proj.weight [I, C]  fc_w columns gate | up
//   model.layers.N.mlp.down_proj.weight [C, I]       fc_proj_w
//   model.norm.weight [C]                            lnf_w
//   lm_head.weight [V, C]                            lm_head_w (untied; ignored
//                                                    when tie_word_embeddings)
// Import reads F32, F16, BF16 and F64 and widens to fp32; it ignores the
// rotary buffers some files carry (…rotary_emb.inv_freq). A missing tensor,
// a wrong shape, another dtype or any other extra tensor is an error naming
// the tensor and its file, found when the folder is opened, before anything
// loads.
//
// Memory: ReadUnit fills one unit's buffer from the mapped files, one tensor
// at a time; nothing holds the model.
//
// Thread-safety: HfCheckpoint is immutable after Open; ReadUnit may run
// concurrently on different buffers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/gpt_weights.h"
#include "data/safetensors.h"
#include "model/gpt_config.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::data {

struct HfModel {
  model::GptConfig config;
  std::string model_type;      // "llama", "mistral", "qwen2", "qwen3"
  int64_t sliding_window = 0;  // attention window (Mistral v0.1); 0 = none
  std::string config_json;     // config.json as read (exported again)
};

// Reads DIR/config.json. Errors are one line naming the file and the key:
// an unknown model_type, rope type or activation, a missing or ill-typed
// key, or a shape GptConfig::Validate refuses.
Result<HfModel> ReadHfConfig(const std::string& dir);
// The same from config.json's text; errors start with `origin`.
Result<HfModel> ParseHfConfig(const std::string& text, const std::string& origin);
// A config.json for `config` (model_type llama, or qwen2 / qwen3 when the
// config has q/k/v biases / q/k norm), as ExportHfCheckpoint writes when
// given none.
std::string HfConfigJson(const model::GptConfig& config);

class HfCheckpoint {
 public:
  // Opens DIR's safetensors (the index when there is one, else
  // model.safetensors) and checks every tensor `config` needs.
  static Result<HfCheckpoint> Open(const std::string& dir, const model::GptConfig& config);

  // Unit `unit`'s parameters into `out` (UnitNumParams floats).
  Status ReadUnit(int unit, std::span<float> out) const;

  const std::vector<std::string>& files() const { return files_; }

 private:
  model::GptConfig config_;
  std::vector<std::string> files_;
  std::vector<std::shared_ptr<SafetensorsReader>> readers_;
  std::map<std::string, std::pair<int, const SafetensorsTensor*>> tensors_;  // name -> (reader, tensor)
};

struct HfExportOptions {
  DType dtype = DType::kBFloat16;            // of the tensors: bf16, fp16 or fp32
  uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default shard size
  // config.json to write (HfModel::config_json, its torch_dtype updated);
  // empty: one is written from the config (model_type llama, or qwen2 / qwen3
  // when the config has q/k/v biases / q/k norm).
  std::string config_json;
  // Tokenizer files (tokenizer.json, tokenizer_config.json,
  // special_tokens_map.json, tokenizer.model, generation_config.json) copied
  // from here when present; empty: none.
  std::string tokenizer_dir;
};

// Writes DIR (created if missing): config.json, the weights in shards of at
// most max_shard_bytes (model.safetensors when one shard suffices, else
// model-0000k-of-0000n.safetensors plus model.safetensors.index.json), and
// the tokenizer files. `units` is asked for each unit once, in order.
Status ExportHfCheckpoint(const UnitSource& units, const model::GptConfig& config, const std::string& dir,
                          const HfExportOptions& options = {});

}  // namespace zinf::data
