// The decoder family's shape and its parameter layout: GptConfig, the named
// presets, and how the parameters split into units — the granularity at
// which the engine fetches, shards, offloads and frees them. The model never
// owns parameters; whoever calls it (a test, `zinf bench model`, the engine)
// hands in one flat buffer per unit laid out as described here.
//
// One decoder design covers GPT-2 (Radford et al. 2019; the code of
// openai/gpt-2) and the Llama family (Llama 2/3, Mistral, Qwen2/2.5/3,
// SmolLM), with the variations named by the config:
//   x = wte[token] (+ wpe[position] with learned positions)
//   for each block:  x = x + attn_proj(attention(norm1(x)))
//                    x = x + fc_proj(act(fc(norm2(x))))
//   logits = norm_f(x) · headᵀ              head: wte (tied) or lm_head_w
// - norm: LayerNorm with bias (GPT-2; eps 1e-5) or RMSNorm without bias
//   (y = x / sqrt(mean(x²) + eps) · w; Zhang & Sennrich 2019).
// - positions: learned (wpe) or rotary (RoPE, Su et al. 2021) on q and k in
//   the rotate-half layout of Hugging Face's Llama: element i of a head
//   pairs with element i + D/2 at angle t · inv_freq[i], inv_freq[i] =
//   theta^(-2i/D), optionally rescaled as Llama 3.1 does (RopeScaling).
// - attention: causal, scale 1/sqrt(D), H query heads and H_kv key/value
//   heads (grouped-query attention when H_kv < H: query head h reads
//   key/value head h / (H / H_kv)); q/k/v biases on or off; optionally an
//   RMSNorm over each head's D elements of q and of k before RoPE (Qwen3),
//   one weight vector of D for q and one for k, shared by all heads.
// - MLP: fc C -> I, GELU (tanh form), fc_proj I -> C (GPT-2; I = 4C); or
//   SwiGLU: fc C -> 2I fused as gate | up, silu(gate) · up, fc_proj I -> C.
// - linear_bias: biases on attn_proj, fc and fc_proj (GPT-2) or none.
//
// Units, for L blocks (NumUnits = L + 2):
//   unit 0        embeddings   wte [V, C], then wpe [T_max, C] (learned positions)
//   unit 1 .. L   block l = unit - 1, in this order (each a contiguous run,
//                 row-major, no padding; Linear weights are [in, out] so the
//                 product is x · W, as GPT-2's Conv1D stores them; a tensor
//                 the config leaves out takes no space):
//                   ln1_w [C]   ln1_b [C] (LayerNorm)
//                   qkv_w [C, Q + 2K]   qkv_b [Q + 2K] (qkv_bias)
//                                       Q = H·D, K = H_kv·D; columns q | k | v,
//                                       head h at columns h·D .. h·D+D-1 of its part
//                   q_norm_w [D]   k_norm_w [D] (qk_norm)
//                   attn_proj_w [Q, C]   attn_proj_b [C] (linear_bias)
//                   ln2_w [C]   ln2_b [C] (LayerNorm)
//                   fc_w [C, I] or [C, 2I] (SwiGLU: gate | up)   fc_b (linear_bias)
//                   fc_proj_w [I, C]   fc_proj_b [C] (linear_bias)
//                 GPT-2: 12 C² + 13 C elements.
//   unit L + 1    final norm   lnf_w [C], lnf_b [C] (LayerNorm), then
//                 lm_head_w [V, C] when the head is not tied
// Offsets and counts are in elements, independent of the dtype. With a tied
// head the LM head has no parameters of its own: its gradient accumulates
// into unit 0's wte.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::model {

enum class NormKind { kLayerNorm, kRmsNorm };
enum class PositionKind { kLearned, kRope };
enum class MlpKind { kGelu, kSwiGlu };

// Llama 3.1's rescaling of RoPE's frequencies (Hugging Face rope_type
// "llama3"): with wavelength w = 2π / inv_freq, frequencies with
// w < original_max_position / high_freq_factor stay, those with
// w > original_max_position / low_freq_factor are divided by factor, and the
// band between blends the two linearly in original_max_position / w.
struct RopeScaling {
  bool llama3 = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct GptConfig {
  std::string name = "custom";
  int64_t vocab_size = 0;   // V
  int64_t max_seq_len = 0;  // T_max: the context length (rows of wpe)
  int64_t num_layers = 0;   // L
  int64_t num_heads = 0;    // H, the query heads
  int64_t embed_dim = 0;    // C

  // The family's variations; the defaults are GPT-2.
  NormKind norm = NormKind::kLayerNorm;
  double norm_eps = 1e-5;  // LayerNorm takes 1e-5 only
  PositionKind positions = PositionKind::kLearned;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  MlpKind mlp = MlpKind::kGelu;
  int64_t intermediate_size = 0;  // I; 0 means 4C
  int64_t num_kv_heads = 0;       // H_kv; 0 means H
  int64_t head_dim_size = 0;      // D; 0 means C / H
  bool qkv_bias = true;
  bool linear_bias = true;  // attn_proj, fc, fc_proj
  bool qk_norm = false;
  bool tied_head = true;

  int64_t head_dim() const { return head_dim_size > 0 ? head_dim_size : embed_dim / num_heads; }  // D
  int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }                // H_kv
  int64_t q_dim() const { return num_heads * head_dim(); }                                        // Q = H·D
  int64_t kv_dim() const { return kv_heads() * head_dim(); }                                      // K = H_kv·D
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  int64_t mlp_dim() const { return intermediate_size > 0 ? intermediate_size : 4 * embed_dim; }  // I
  int64_t fc_dim() const { return mlp == MlpKind::kSwiGlu ? 2 * mlp_dim() : mlp_dim(); }         // fc's outputs
  // GPT-2's architecture (any size): what the original kernels cover.
  bool IsGpt2Family() const;

  // kInvalidArgument naming the field: every dimension >= 1, C % H == 0
  // unless D is given, H % H_kv == 0, D even with RoPE, eps > 0 (1e-5 for
  // LayerNorm), and dimensions the 32-bit BLAS interface can take.
  Status Validate() const;
  // "gpt2: V=50257 T=1024 C=768 L=12 H=12 (124.44 M parameters: 124,439,808)"; other
  // members of the family add what differs from GPT-2, e.g. "H_kv=8 D=128
  // I=14336 rmsnorm rope swiglu untied".
  std::string ToString() const;
};

// tiny (V=64 T=16 C=32 L=2 H=4: for tests), gpt2 (124M), gpt2-medium (350M),
// gpt2-large (774M), gpt2-xl (1.5B); for scale runs GPT-3 shapes with dense
// attention, T=2048 and GPT-2's vocabulary: gpt-1.3b, gpt-3b (2.7B), gpt-7b
// (6.7B), gpt-13b. The Llama family at the shapes of the released
// checkpoints (their config.json): llama-3.2-1b, llama-3.2-3b,
// llama-3.1-8b, qwen2.5-7b, qwen3-8b, mistral-7b (v0.3), smollm2-1.7b;
// and tiny-llama, tiny-qwen2, tiny-qwen3 (tests). kNotFound lists the names.
Result<GptConfig> GptPreset(std::string_view name);
std::vector<std::string> GptPresetNames();

// The sequence length a run takes when none is given: the context with
// learned positions (it sizes wpe); with RoPE the context, at most 4096 (a
// Llama 3.1 context of 131072 tokens is for runs that ask for it).
int64_t DefaultSeqLen(const GptConfig& c);

// ---- Units -----------------------------------------------------------------

enum class UnitKind { kEmbedding, kBlock, kFinalNorm };

inline int NumUnits(const GptConfig& c) { return static_cast<int>(c.num_layers) + 2; }
inline int EmbeddingUnit() { return 0; }
inline int BlockUnit(int layer) { return layer + 1; }
inline int FinalNormUnit(const GptConfig& c) { return static_cast<int>(c.num_layers) + 1; }
UnitKind KindOfUnit(const GptConfig& c, int unit);  // ZINF_CHECKs 0 <= unit < NumUnits

// Element offsets inside each unit's flat buffer (the order above).
// A tensor the config leaves out has offset kAbsent.
inline constexpr int64_t kAbsent = -1;
// base + offset, or null for an absent tensor.
template <class P>
P* TensorAt(P* base, int64_t offset) {
  return offset == kAbsent ? nullptr : base + offset;
}

struct EmbeddingLayout {
  int64_t wte = 0, wpe = kAbsent;
  int64_t num_elems = 0;
  static EmbeddingLayout For(const GptConfig& c);
};
struct BlockLayout {
  int64_t ln1_w = 0, ln1_b = kAbsent, qkv_w = 0, qkv_b = kAbsent, q_norm_w = kAbsent, k_norm_w = kAbsent;
  int64_t attn_proj_w = 0, attn_proj_b = kAbsent;
  int64_t ln2_w = 0, ln2_b = kAbsent, fc_w = 0, fc_b = kAbsent, fc_proj_w = 0, fc_proj_b = kAbsent;
  int64_t num_elems = 0;  // GPT-2: 12 C² + 13 C
  static BlockLayout For(const GptConfig& c);
};
struct FinalNormLayout {
  int64_t w = 0, b = kAbsent, lm_head = kAbsent;
  int64_t num_elems = 0;  // GPT-2: 2 C
  static FinalNormLayout For(const GptConfig& c);
};

// One named tensor of a unit: [rows, cols] row-major (cols = 1 for vectors).
struct UnitTensor {
  std::string name;  // "wte", "ln1_w", "qkv_w", ... (the layout's names)
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
// fc_proj_w) ~ N(0, 0.02 / sqrt(2 L)), biases 0, norm weights 1 and
// biases 0 (the same rule for every member of the family). `out` holds UnitNumParams(c, unit) floats.
void InitUnitParams(const GptConfig& c, int unit, uint64_t seed, float* out);

// ---- Work --------------------------------------------------------------------

// Floating-point operations of one training step (forward + backward) on
// batch × seq_len tokens, the convention of Kaplan et al. 2020 and PaLM
// (Chowdhery et al. 2022, appendix B): 6 N per token for the matrix products
// with the parameters (N = NumParams less the embedding table when the head
// is untied: a tied wte is counted once, as the LM head's product; wpe,
// biases and norms are in N though they cost no product, 0.7% of gpt2), plus
// 12 L H D seq_len per token for attention's two products (QKᵀ and PV) over
// the full seq_len² scores, as computed. The forward is
// one third: 2 N + 4 L C seq_len per token.
double TrainingFlops(const GptConfig& c, int64_t batch, int64_t seq_len);
double ForwardFlops(const GptConfig& c, int64_t batch, int64_t seq_len);

}  // namespace zinf::model
