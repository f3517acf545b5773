// GptModel: forward and backward of the GPT reference model (gpt_config.h)
// with CPU kernels on host pointers, for one micro-batch shape
// (batch × seq_len). It owns no parameters: every stage takes the buffers of
// the units it reads (each laid out as gpt_config.h documents, in the
// parameter dtype) and the gradient buffers it writes, so an engine can hand
// in whatever it fetched for that unit, and free it after the stage.
//
// One step, unit by unit (the engine's fetch order):
//   EmbedForward(unit 0) → BlockForward(0 .. L-1, units 1 .. L) →
//   HeadForward(unit L+1, unit 0) = loss →
//   HeadBackward(unit L+1, unit 0) → BlockBackward(L-1 .. 0) → EmbedBackward.
// Out-of-order calls are kFailedPrecondition. The LM head is tied to wte, so
// unit 0's gradient is written by HeadBackward and EmbedBackward both: pass
// the same buffer to both and treat it as ready only after EmbedBackward.
// Forward and Backward run the whole sequence from per-unit pointer arrays.
//
// Numerics: fp32 compute. 16-bit parameters are widened to fp32 per unit
// as a stage starts (exactly: the results equal an fp32 run on the widened
// values). Gradients are accumulated in fp32 and, for a 16-bit grad dtype,
// rounded (to nearest even) once per unit at the end of its backward. Results
// do not depend on num_threads (see parallel.h, gemm.h), nor on activation
// checkpointing (the recomputed forward is the same computation).
//
// Memory: every activation lives in one caller-provided arena of
// activation_layout().total_bytes (host address, 64-byte aligned; GptDevice
// allocates it through the Device so the budget counts it). Nothing else is
// allocated per step.
//
// Thread-safety: one GptModel serves one caller at a time (a stream); the
// stages block until done, using num_threads threads of its own arena.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "math/attention_math.h"
#include "model/decoder_layers.h"
#include "model/gpt_config.h"
#include "model/op_profile.h"
#include "model/parallel.h"
#include "zinf/config.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::model {

// The attention's algorithm. kPlain keeps each head's T × T probabilities
// from forward to backward (model/layers.h); kFlash keeps one log-sum-exp
// per row and recomputes the rest in backward (model/flash_attention.h, and
// on CUDA the tensor-core kernels of gpu/kernels.h). kAuto is kFlash when
// the products take bf16 operands and the head size is 64 or 128 (those the
// CUDA kernels take), kPlain otherwise.
enum class AttentionKernel { kAuto, kPlain, kFlash };
std::string_view AttentionKernelName(AttentionKernel a);    // "auto", "plain", "flash"
AttentionKernel ToAttentionKernel(AttentionChoice choice);  // zinf.attention

struct GptRunOptions {
  int64_t batch_size = 1;  // B
  int64_t seq_len = 0;     // T, 1 .. max_seq_len; 0 means max_seq_len
  int num_threads = 1;     // the kernel pool's size (and BLAS runs inside it)
  // Keep only each block's input during the forward; recompute the block's
  // forward in its backward.
  bool activation_checkpointing = false;
  DType param_dtype = DType::kFloat32;
  DType grad_dtype = DType::kFloat32;
  // false: backward overwrites the gradient buffers; true: adds to them
  // (for a 16-bit grad dtype the sum is formed in fp32 and rounded once).
  bool accumulate_grads = false;
  // The matrix products' operands: kFloat32, or kBFloat16 — each operand
  // rounded to bf16, the sums in fp32 (tensor cores on CUDA; the same
  // rounding before OpenBLAS's fp32 product on the CPU: gemm.h).
  DType matmul_dtype = DType::kFloat32;
  AttentionKernel attention = AttentionKernel::kAuto;
  // Rows of the LM head's logits held at once: 0 chooses (all B·T rows when
  // their fp32 logits take at most kLossChunkBytes, else as many whole
  // multiples of kLossChunkAlign rows as fit there); fewer rows than B·T compute the loss chunk by chunk and compute
  // each chunk's logits again in backward (one more head product), so no
  // [B·T, V] tensor is ever held.
  int64_t loss_chunk_rows = 0;
  // zinf bench model --breakdown: every stage marks its ops here (it must
  // outlive the model); null: no marks.
  OpProfile* profile = nullptr;
};

// The logits bytes above which the loss is computed in row chunks (when
// GptRunOptions::loss_chunk_rows is 0).
inline constexpr uint64_t kLossChunkBytes = uint64_t{256} << 20;
// The row multiple the chosen chunk is rounded down to (when it holds at
// least that many rows and fewer than B·T).
inline constexpr int64_t kLossChunkAlign = 64;
// The rows of logits held at once for this model and batch (1 .. B·T).
int64_t LossChunkRows(const GptConfig& c, const GptRunOptions& o);

// Whether the SwiGLU MLP's fc output and the gradient of its activation
// are kept as bf16 values (rounded to nearest even as their products write
// them): with bf16 products, a SwiGLU MLP without an fc bias, whose fc
// output only SwiGLU reads and whose activation gradient only SwiGLU's
// backward reads. The CPU model rounds both in place, the CUDA model's
// products write them in bf16 and its SwiGLU kernels read them so, which
// halves the MLP's largest memory traffic.
bool SwiGluInBf16(const GptConfig& c, const GptRunOptions& o);

// Whether the attention's output O and its gradient dO are kept as bf16
// values (rounded to nearest even): with bf16 products and flash
// attention, where only products read O and dO besides flash backward's
// δ = dO · O, which then sums the rounded values. The CPU model rounds both
// in place; the CUDA model's flash forward and attn_proj's input-gradient
// product write them in bf16.
bool AttentionInBf16(const GptConfig& c, const GptRunOptions& o);

// Whether the fused q, k, v and their gradient are kept as bf16 values:
// with bf16 products and flash attention, no q/k norm and no qkv bias, where
// only the attention's products read them and only the qkv products read
// their gradient (RoPE rotates both first). The qkv product's output is
// rounded to nearest even, and again after RoPE; so is the attention's
// gradient of them, and again after RoPE's backward. The CPU model rounds in
// place; the CUDA model's product and flash attention write them in bf16,
// RoPE rotates them so, and the products read them as their operand copies.
bool QkvInBf16(const GptConfig& c, const GptRunOptions& o);

// Whether a block's norm outputs (ln1, ln2) and its MLP activation
// (fch_gelu) are stored as bf16 in the activation arena, 2 bytes an element:
// with bf16 products, where only the products read them (the qkv and fc
// products their forward and weight-gradient products; the fc_proj product
// the activation), so their bf16 rounding is all any reader takes. With
// SwiGluInBf16 the fc output (fch) is stored so too. The CUDA model's
// kernels write them in bf16; the CPU model computes them in fp32 into
// backward scratch, which forward does not use, and stores their rounding.
bool ProductInputsInBf16(const GptConfig& c, const GptRunOptions& o);

// kPlain or kFlash: what `o.attention` means for this model.
AttentionKernel ResolveAttention(const GptConfig& c, const GptRunOptions& o);

// Where each buffer lives in the activation arena (byte offsets, each
// 64-byte aligned), and how the bytes split.
struct ActivationLayout {
  // Kept from forward to backward: the token ids, the residual stream
  // (L + 1 × [B·T, C]), each block's saved tensors (one set with
  // checkpointing), the final LayerNorm and the LM head's probabilities.
  uint64_t saved_bytes = 0;
  // Backward work buffers, reused by every block.
  uint64_t scratch_bytes = 0;
  // fp32 copies of 16-bit parameters (unit 0 and the largest other unit),
  // fp32 gradient accumulators for a 16-bit grad dtype, and the bf16
  // operand copies of bf16 matmul; 0 for fp32 throughout.
  uint64_t conversion_bytes = 0;
  uint64_t total_bytes = 0;

  // Per-block saved tensors, fp32 unless said. att: the attention
  // probabilities [B, H, T, T] (plain), or each row's log-sum-exp [B, H, T]
  // (flash). qkv is attention's input (after q/k norm and RoPE); qk_pre and
  // qk_rstd (used with qk_norm only) the linear output and each head's
  // 1/rms. fch is fc's output, fch_gelu the activation's (GELU or SwiGLU).
  // ln*_mean is unused with RMSNorm. ln1, ln2 and fch_gelu hold bf16 bits
  // with ProductInputsInBf16, fch with SwiGluInBf16, qkv with QkvInBf16 and
  // atty with AttentionInBf16.
  struct Block {
    uint64_t ln1, ln1_mean, ln1_rstd, qkv, qk_pre, qk_rstd, att, atty, res_mid, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };
  uint64_t tokens = 0, targets = 0;  // int32 [B·T]
  uint64_t residual = 0;             // (L + 1) × [B·T, C]: residual l is block l's input
  uint64_t blocks = 0;               // block_sets × Block
  uint64_t block_stride = 0;         // bytes between consecutive block sets
  int64_t block_sets = 0;            // L, or 1 with checkpointing
  Block block{};                     // offsets inside a block set
  // probs: loss_chunk_rows rows of logits, then probabilities, then their
  // gradient ([loss_chunk_rows, V]); losses: every row's [B·T]. probs holds
  // loss_chunk_rows · logits_ld floats: the CPU model's rows are dense (V
  // apart), the CUDA stages' logits_ld apart (V rounded up to a multiple of
  // 8, so that a row of the bf16 copy starts 16-byte aligned, as cuBLAS's
  // fast products need).
  uint64_t lnf = 0, lnf_mean = 0, lnf_rstd = 0, probs = 0, losses = 0;
  int64_t loss_chunk_rows = 0, logits_ld = 0;
  // datt: scratch of att's size (plain), or flash's δ [B, H, T].
  uint64_t dres = 0, dbuf = 0, dqkv = 0, datt = 0, dfch = 0;
  uint64_t wide_embedding = 0, wide_unit = 0, grad_embedding = 0, grad_unit = 0;  // conversion, when used
  // With bf16 matmul operands: two bf16 copies (a product's A and B, each
  // rounded to nearest even) of bf16_operand_elems elements, the span of the
  // largest operand any product takes. The CUDA stages round into them; the
  // CPU model rounds into per-thread copies of its own (gemm.h).
  uint64_t bf16_a = 0, bf16_b = 0;
  int64_t bf16_operand_elems = 0;

  static ActivationLayout For(const GptConfig& c, const GptRunOptions& o);
  // Block `layer`'s saved tensors: the offsets of its block set (the one set
  // every layer shares with checkpointing).
  Block BlockAt(int layer) const;
  std::string ToString() const;  // "1.02 GiB (saved 901 MiB, scratch 120 MiB, conversion 0 B)"
};

// The attention of block set `a` as flash attention sees it, over the
// activation arena at `arena` (a host or a device address): q, k, v from
// the fused qkv, out = atty, lse = att; with backward also dout = dbuf,
// delta = datt and dq, dk, dv in dqkv. Where qkv and atty are stored in
// bf16 (QkvInBf16, AttentionInBf16) their pointers name the places of bf16
// bits (element offsets as in fp32): a caller that reads fp32 points them
// at fp32 values of its own.
math::AttentionShape FlashAttentionShape(const GptConfig& c, const GptRunOptions& o);
math::AttentionTensors FlashAttentionTensors(const GptConfig& c, const ActivationLayout& l,
                                             const ActivationLayout::Block& a, void* arena, bool backward);

class GptModel {
 public:
  // kInvalidArgument for a bad config or options. Sets OpenBLAS to one
  // thread (gemm.h).
  static Result<std::unique_ptr<GptModel>> Create(const GptConfig& config, const GptRunOptions& options);

  const GptConfig& config() const { return config_; }
  const GptRunOptions& options() const { return options_; }
  const ActivationLayout& activation_layout() const { return layout_; }
  uint64_t activation_bytes() const { return layout_.total_bytes; }

  // The arena every later stage uses: activation_bytes() at a host address,
  // 64-byte aligned. May be rebound between stages (same contents expected).
  void BindActivations(void* host_arena);

  // ---- Stages. Parameter pointers: the unit's buffer in param_dtype;
  // gradient pointers: the unit's buffer in grad_dtype. tokens and targets:
  // int32 [B, T], row-major; copied, so they may be freed after the call.
  // A target < 0 is ignored (contributes neither loss nor gradient).
  Status EmbedForward(const int32_t* tokens, const void* embedding);
  Status BlockForward(int layer, const void* block);
  // The mean cross-entropy over targets that are >= 0 (0 when there is none).
  Result<float> HeadForward(const int32_t* targets, const void* final_norm, const void* embedding);
  // Backpropagates loss_scale · loss (1 for plain gradients; a loss scale or
  // 1 / accumulation steps otherwise).
  Status HeadBackward(float loss_scale, const void* final_norm, const void* embedding, void* final_norm_grad,
                      void* embedding_grad);
  Status BlockBackward(int layer, const void* block, void* block_grad);
  Status EmbedBackward(void* embedding_grad);

  // The whole step: unit_params / unit_grads hold NumUnits() pointers.
  Result<float> Forward(const int32_t* tokens, const int32_t* targets, std::span<const void* const> unit_params);
  Status Backward(std::span<const void* const> unit_params, std::span<void* const> unit_grads, float loss_scale = 1.0f);

  // After HeadForward: the softmax of the logits of the last loss chunk,
  // rows [B·T − n, B·T) × V for its n rows (overwritten by HeadBackward):
  // every row when loss_chunk_rows ≥ B·T, as a caller reading any row sets.
  const float* probabilities() const;

 private:
  GptModel(const GptConfig& config, const GptRunOptions& options);

  float* F32(uint64_t offset) const { return reinterpret_cast<float*>(arena_ + offset); }
  int32_t* I32(uint64_t offset) const { return reinterpret_cast<int32_t*>(arena_ + offset); }
  uint16_t* U16(uint64_t offset) const { return reinterpret_cast<uint16_t*>(arena_ + offset); }
  // LinearBackward (dinp overwritten) with its input at `inp` in the arena,
  // stored as bf16 bits when inp16 (ProductInputsInBf16), else fp32.
  void LinearBackwardFrom(float* dinp, float* dw, float* dbias, const float* dout, uint64_t inp, bool inp16,
                          const float* w, int64_t in_dim, int64_t out_dim);
  const float* Widen(const void* params, int64_t num_elems, uint64_t wide_offset);
  float* BeginGrad(void* grad, int64_t num_elems, uint64_t accumulator_offset);
  void EndGrad(void* grad, const float* accumulator, int64_t num_elems);
  void RunBlockForward(int layer, const float* p);
  // The config's norm (LayerNorm or RMSNorm) over [B·T, C]; b, mean and the
  // gradient's gb are unused by RMSNorm.
  void NormForward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b);
  void NormBackward(float* dinp, float* gw, float* gb, const float* dout, const float* in, const float* w,
                    const float* mean, const float* rstd);
  // The q and k heads of a fused qkv [B·T, qkv_dim] as rows of D.
  RowSet QueryRows() const;
  RowSet KeyRows() const;
  Status CheckArena() const;

  GptConfig config_;
  GptRunOptions options_;
  ActivationLayout layout_;
  ModelThreads threads_;
  RopeTable rope_;  // RoPE only
  char* arena_ = nullptr;

  // Stage order.
  int forward_next_ = -1;  // next block to forward; -1 before EmbedForward
  bool head_forward_done_ = false;
  int backward_next_ = -2;     // next block to backward; -2 until HeadBackward
  int checkpoint_layer_ = -1;  // with checkpointing: whose tensors the single set holds
  int64_t num_targets_ = 0;
  float* embedding_grad32_ = nullptr;  // unit 0's fp32 accumulator between HeadBackward and EmbedBackward
};

}  // namespace zinf::model
