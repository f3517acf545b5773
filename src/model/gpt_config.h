// The GPT reference model's shape and its parameter layout: GptConfig, the
// named presets, and how the parameters split into units — the granularity
// at which the engine fetches, shards, offloads and frees them. The model
// never owns parameters; whoever calls it (a test, `zinf bench model`, the
// engine) hands in one flat buffer per unit laid out as described here.
//
// Architecture (GPT-2, Radford et al. 2019; the code of openai/gpt-2):
//   x = wte[token] + wpe[position]
//   for each block:  x = x + attn_proj(causal_mha(ln1(x)))
//                    x = x + fc_proj(gelu_tanh(fc(ln2(x))))      fc: C -> 4C
//   logits = ln_f(x) · wteᵀ                                      (LM head tied to wte)
// LayerNorm eps is 1e-5; attention scales by 1/sqrt(head_dim).
//
// Units, for L blocks (NumUnits = L + 2):
//   unit 0        embeddings   wte [V, C], then wpe [T_max, C]
//   unit 1 .. L   block l = unit - 1, in this order (each a contiguous run,
//                 row-major, no padding; Linear weights are [in, out] so the
//                 product is x · W, as GPT-2's Conv1D stores them):
//                   ln1_w [C]   ln1_b [C]
//                   qkv_w [C, 3C]   qkv_b [3C]       columns: q | k | v, head h
//                                                    at columns h*D .. h*D+D-1 of each
//                   attn_proj_w [C, C]   attn_proj_b [C]
//                   ln2_w [C]   ln2_b [C]
//                   fc_w [C, 4C]   fc_b [4C]
//                   fc_proj_w [4C, C]   fc_proj_b [C]
//                 12 C² + 13 C elements.
//   unit L + 1    final LayerNorm   lnf_w [C], lnf_b [C]
// Offsets and counts are in elements, independent of the dtype. The LM head
// has no parameters of its own: its gradient accumulates into unit 0's wte.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::model {

struct GptConfig {
  std::string name = "custom";
  int64_t vocab_size = 0;   // V
  int64_t max_seq_len = 0;  // T_max: the context length, rows of wpe
  int64_t num_layers = 0;   // L
  int64_t num_heads = 0;    // H
  int64_t embed_dim = 0;    // C, a multiple of H

  int64_t head_dim() const { return embed_dim / num_heads; }  // D = C / H
  int64_t mlp_dim() const { return 4 * embed_dim; }

  // kInvalidArgument naming the field: every dimension >= 1, C % H == 0, and
  // dimensions the 32-bit BLAS interface can take (V, T_max, 4C < 2^31).
  Status Validate() const;
  // "gpt2: V=50257 T=1024 C=768 L=12 H=12 (124.44 M parameters)".
  std::string ToString() const;
};

// tiny (V=64 T=16 C=32 L=2 H=4: for tests), gpt2 (124M), gpt2-medium (350M),
// gpt2-large (774M), gpt2-xl (1.5B); for scale runs GPT-3 shapes with dense
// attention, T=2048 and GPT-2's vocabulary: gpt-1.3b, gpt-3b (2.7B), gpt-7b
// (6.7B), gpt-13b. kNotFound lists the names.
Result<GptConfig> GptPreset(std::string_view name);
std::vector<std::string> GptPresetNames();

// ---- Units -----------------------------------------------------------------

enum class UnitKind { kEmbedding, kBlock, kFinalNorm };

inline int NumUnits(const GptConfig& c) { return static_cast<int>(c.num_layers) + 2; }
inline int EmbeddingUnit() { return 0; }
inline int BlockUnit(int layer) { return layer + 1; }
inline int FinalNormUnit(const GptConfig& c) { return static_cast<int>(c.num_layers) + 1; }
UnitKind KindOfUnit(const GptConfig& c, int unit);  // ZINF_CHECKs 0 <= unit < NumUnits

// Element offsets inside each unit's flat buffer (the order above).
struct EmbeddingLayout {
  int64_t wte = 0, wpe = 0;
  int64_t num_elems = 0;
  static EmbeddingLayout For(const GptConfig& c);
};
struct BlockLayout {
  int64_t ln1_w = 0, ln1_b = 0, qkv_w = 0, qkv_b = 0, attn_proj_w = 0, attn_proj_b = 0;
  int64_t ln2_w = 0, ln2_b = 0, fc_w = 0, fc_b = 0, fc_proj_w = 0, fc_proj_b = 0;
  int64_t num_elems = 0;  // 12 C² + 13 C
  static BlockLayout For(const GptConfig& c);
};
struct FinalNormLayout {
  int64_t w = 0, b = 0;
  int64_t num_elems = 0;  // 2 C
  static FinalNormLayout For(const GptConfig& c);
};

// One named tensor of a unit: [rows, cols] row-major (cols = 1 for vectors).
struct UnitTensor {
  std::string name;  // "wte", "ln1_w", "qkv_w", ...
  int64_t offset_elems = 0;
  int64_t rows = 0, cols = 1;
  int64_t num_elems() const { return rows * cols; }
};
// The tensors of `unit` in buffer order; offsets are contiguous from 0.
std::vector<UnitTensor> UnitTensors(const GptConfig& c, int unit);

int64_t UnitNumParams(const GptConfig& c, int unit);
int64_t NumParams(const GptConfig& c);  // every unit; wte counted once
int64_t MaxUnitNumParams(const GptConfig& c);

// ---- Initialisation ----------------------------------------------------------

// GPT-2's initialisation of one unit, in fp32, deterministic in (seed, unit):
// weights ~ N(0, 0.02), the two residual projections (attn_proj_w,
// fc_proj_w) ~ N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1 and
// biases 0. `out` holds UnitNumParams(c, unit) floats.
void InitUnitParams(const GptConfig& c, int unit, uint64_t seed, float* out);

// ---- Work --------------------------------------------------------------------

// Floating-point operations of one training step (forward + backward) on
// batch × seq_len tokens, the convention of Kaplan et al. 2020 and PaLM
// (Chowdhery et al. 2022, appendix B): 6 N per token for the matrix products
// with the parameters (N = NumParams: wte counted once, as the LM head's
// product; wpe, biases and LayerNorm are in N though they cost no product,
// 0.7% of gpt2), plus 12 L C seq_len per token for attention's two products
// (QKᵀ and PV) over the full seq_len² scores, as computed. The forward is
// one third: 2 N + 4 L C seq_len per token.
double TrainingFlops(const GptConfig& c, int64_t batch, int64_t seq_len);
double ForwardFlops(const GptConfig& c, int64_t batch, int64_t seq_len);

}  // namespace zinf::model
