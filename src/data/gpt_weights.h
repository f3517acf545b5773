// GPT weights in safetensors files, under zinf's names or Hugging Face's
// GPT-2 names, to and from the per-unit fp32 buffers of gpt_config.h.
//
// Names and shapes, for block N (0-based), C = embed_dim, V = vocab_size,
// T = max_seq_len:
//   zinf                    Hugging Face GPT-2              shape
//   wte                     wte.weight                      [V, C]
//   wpe                     wpe.weight                      [T, C]
//   blocks.N.ln1_w / _b     h.N.ln_1.weight / .bias         [C]
//   blocks.N.qkv_w          h.N.attn.c_attn.weight          [C, 3C]
//   blocks.N.qkv_b          h.N.attn.c_attn.bias            [3C]
//   blocks.N.attn_proj_w    h.N.attn.c_proj.weight          [C, C]
//   blocks.N.attn_proj_b    h.N.attn.c_proj.bias            [C]
//   blocks.N.ln2_w / _b     h.N.ln_2.weight / .bias         [C]
//   blocks.N.fc_w           h.N.mlp.c_fc.weight             [C, 4C]
//   blocks.N.fc_b           h.N.mlp.c_fc.bias               [4C]
//   blocks.N.fc_proj_w      h.N.mlp.c_proj.weight           [4C, C]
//   blocks.N.fc_proj_b      h.N.mlp.c_proj.bias             [C]
//   lnf_w / lnf_b           ln_f.weight / .bias             [C]
// HF's Conv1D stores a weight as [in, out] and computes x · W, which is
// exactly zinf's layout (qkv columns q | k | v, heads in order inside each),
// so the mapping renames and never transposes. HF names may carry the
// "transformer." prefix (GPT2LMHeadModel's state dict) or not (GPT2Model's,
// and the released model.safetensors); both are accepted on import.
//
// Import ignores, and says so here: h.N.attn.bias and h.N.attn.masked_bias
// (HF's causal-mask buffers, not parameters; older files carry them), and
// lm_head.weight when it equals wte.weight bit for bit (the LM head is tied
// to wte in GPT-2 and in zinf; a different lm_head cannot be represented and
// is reported). Any other extra tensor, a missing one, a wrong shape or a
// non-float dtype is a difference; import reports all of them in one error.
// F32, F16, BF16 and F64 data are widened to fp32.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "data/safetensors.h"
#include "model/gpt_config.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::data {

enum class WeightNaming {
  kZinf,
  kHuggingFace,             // no prefix: "wte.weight", as GPT-2's released file
  kHuggingFaceTransformer,  // "transformer.wte.weight", as GPT2LMHeadModel's state dict
};

// "zinf", "hf" / "huggingface", "hf-transformer".
Result<WeightNaming> ParseWeightNaming(std::string_view name);

struct GptWeightName {
  std::string name;
  std::vector<int64_t> shape;
  int unit = 0;
  model::UnitTensor tensor;  // where it lives in the unit's buffer
};

// Every parameter tensor of `config` in unit and buffer order.
std::vector<GptWeightName> GptWeightNames(const model::GptConfig& config, WeightNaming naming);

// Reads every parameter of `config` from `reader`; the naming is detected
// (zinf, or HF with or without the prefix). Returns one fp32 buffer per
// unit, UnitNumParams(config, unit) floats each, laid out as gpt_config.h
// documents. kInvalidArgument listing every difference (see above).
Result<std::vector<std::vector<float>>> ImportGptWeights(const SafetensorsReader& reader,
                                                         const model::GptConfig& config);

// The fp32 buffer of one unit (UnitNumParams floats), valid until the next
// call. Export asks for each unit once, in order, so a caller can fetch
// units from wherever they live one at a time.
using UnitSource = std::function<Result<std::span<const float>>(int unit)>;

// Writes every parameter of `config` to `path` (atomically) under `naming`,
// as `dtype` (fp32, or bf16/fp16 rounded to nearest even), one tensor at a
// time: memory beyond the caller's unit is one 256 KiB conversion buffer.
// Metadata: "format": "pt" (what transformers' loader requires) and
// "zinf_config": config.ToString().
Status ExportGptWeights(const UnitSource& units, const model::GptConfig& config, WeightNaming naming, DType dtype,
                        const std::string& path);

}  // namespace zinf::data
