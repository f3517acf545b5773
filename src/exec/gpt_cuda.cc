// GptModel's stages (model/gpt.cc) on CUDA, one for one: the same buffers of
// the same layout, the same products in the same row-major shapes, the same
// variations of the decoder family (LayerNorm or RMSNorm, learned positions
// or RoPE, GELU or SwiGLU, grouped-query heads of any size, optional biases,
// q/k norm, a tied or an untied head) in the same order. A row-major product
// C = op(A) op(B) is cuBLAS's column-major Cᵀ = op(B)ᵀ op(A)ᵀ, so each call
// passes B before A with the transposes as given.
#include "exec/gpt_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "exec/gpt_cublas.h"
#include "gpu/cuda_check.h"
#include "gpu/decoder_kernels.h"
#include "gpu/kernels.h"
#include "model/gemm.h"

namespace zinf::gpu {
namespace {

using model::ActivationLayout;
using model::BlockLayout;
using model::EmbeddingLayout;
using model::FinalNormLayout;
using model::TensorAt;

class CudaStages final : public model::GptStages {
 public:
  CudaStages(Device& device, Stream& stream, const model::GptConfig& config, const model::GptRunOptions& options,
             const ActivationLayout& layout, void* arena)
      : device_(device),
        stream_(stream),
        s_(stream.native_handle()),
        config_(config),
        options_(options),
        layout_(layout),
        arena_(static_cast<char*>(arena)) {}
  ~CudaStages() override {
    if (bias_grad_) device_.Free(bias_grad_, stream_).IgnoreError();
    if (count_) device_.Free(count_, stream_).IgnoreError();
    if (rope_cos_) device_.Free(rope_cos_, stream_).IgnoreError();
  }

  Status Init() {
    if (!s_) return InvalidArgument("gpt model on CUDA: the stream has no CUDA stream");
    if (flash_) {
      const int64_t D = config_.head_dim();
      if (!bf16_) {
        return InvalidArgument("gpt model on CUDA: flash attention runs on tensor cores and takes bf16 operands "
                               "(zinf.matmul bf16, zinf train --matmul bf16)");
      }
      if (D != 64 && D != 128) {
        return InvalidArgument("gpt model on CUDA: flash attention takes head sizes 64 and 128, " + config_.name +
                               " has " + std::to_string(D) + " (zinf.attention plain, zinf train --attention plain)");
      }
      // dO in bf16 alone takes the kernels that read bf16 copies (else dO
      // stays fp32, rounded in place: the same values).
      ZINF_ASSIGN_OR_RETURN(dout16_only_, FlashAttentionCopiesFit(D));
      qkv16_only_ = qkv16_ && dout16_only_;
    }
    // Without cuBLASLt (its library missing, or no handle), the biases and
    // residual adds run as kernels beside the products, as with fp32
    // products.
    ZINF_RETURN_IF_ERROR(blas_.Init(s_, bf16_));
    ZINF_ASSIGN_OR_RETURN(void* c, device_.Allocate(sizeof(float), stream_));
    count_ = static_cast<float*>(c);
    if (blas_.has_lt() && (config_.linear_bias || config_.qkv_bias)) {
      bias_grad_elems_ = std::max({config_.embed_dim, config_.qkv_dim(), config_.fc_dim()});
      ZINF_ASSIGN_OR_RETURN(void* g, device_.Allocate(static_cast<uint64_t>(bias_grad_elems_) * sizeof(float),
                                                      stream_));
      bias_grad_ = static_cast<float*>(g);
    }
    if (config_.positions == model::PositionKind::kRope) {
      // The CPU model's table (fp32, built on the host), uploaded once; the
      // host copy stays with the stages while the copy is in flight.
      rope_ = model::RopeTable::For(config_, options_.seq_len);
      const uint64_t bytes = rope_.cos.size() * sizeof(float);
      ZINF_ASSIGN_OR_RETURN(void* table, device_.Allocate(2 * bytes, stream_));
      rope_cos_ = static_cast<float*>(table);
      rope_sin_ = rope_cos_ + rope_.cos.size();
      ZINF_RETURN_IF_ERROR(device_.CopyToDevice(rope_cos_, rope_.cos.data(), bytes, stream_));
      ZINF_RETURN_IF_ERROR(device_.CopyToDevice(rope_sin_, rope_.sin.data(), bytes, stream_));
    }
    return Status::Ok();
  }

  Status EmbedForward(const int32_t* tokens, const void* embedding) override {
    BeginStage();
    const int64_t B = options_.batch_size, T = options_.seq_len, C = config_.embed_dim;
    Op("embedding");
    ZINF_RETURN_IF_ERROR(device_.CopyOnDevice(I32(layout_.tokens), tokens, B * T * sizeof(int32_t), stream_));
    const EmbeddingLayout e = EmbeddingLayout::For(config_);
    // bf16 token embeddings are read in place, as bf16 rows: only the
    // batch's rows are widened, not the [V, C] table (the head's products
    // take the table as their operand, and widen it themselves where they
    // need fp32).
    const bool rows16 = options_.param_dtype == DType::kBFloat16;
    const Range wte[] = {{e.wte, config_.vocab_size * C}};
    ZINF_ASSIGN_OR_RETURN(const float* p, Widen(embedding, e.num_elems, layout_.wide_embedding,
                                                rows16 ? std::span<const Range>(wte) : std::span<const Range>{}));
    Op("embedding");
    ZINF_RETURN_IF_ERROR(rows16 ? EmbeddingForward(I32(layout_.tokens), static_cast<const uint16_t*>(embedding) + e.wte,
                                                   TensorAt(p, e.wpe), F32(layout_.residual), B * T, T, C, s_)
                                : EmbeddingForward(I32(layout_.tokens), p + e.wte, TensorAt(p, e.wpe),
                                                   F32(layout_.residual), B * T, T, C, s_));
    EndOps();
    forward_next_ = 0;
    head_forward_done_ = false;
    backward_next_ = -2;
    checkpoint_layer_ = -1;
    return Status::Ok();
  }

  Status BlockForward(int layer, const void* block) override {
    BeginStage();
    if (forward_next_ < 0 || layer != forward_next_ || layer >= config_.num_layers) {
      return FailedPrecondition("gpt model: BlockForward(" + std::to_string(layer) + ") out of order");
    }
    const BlockLayout w = BlockLayout::For(config_);
    ZINF_ASSIGN_OR_RETURN(const float* p, Widen(block, w.num_elems, layout_.wide_unit, BlockProducts(w)));
    ZINF_RETURN_IF_ERROR(RunBlockForward(layer, p));
    EndOps();
    ++forward_next_;
    return Status::Ok();
  }

  Status HeadForward(const int32_t* targets, const void* final_norm, const void* embedding, float* loss) override {
    BeginStage();
    if (forward_next_ != config_.num_layers) {
      return FailedPrecondition("gpt model: HeadForward before the forward of every block");
    }
    const int64_t B = options_.batch_size, T = options_.seq_len, C = config_.embed_dim, V = config_.vocab_size;
    const int64_t BT = B * T, L = config_.num_layers;
    Op("loss");
    ZINF_RETURN_IF_ERROR(device_.CopyOnDevice(I32(layout_.targets), targets, BT * sizeof(int32_t), stream_));
    const FinalNormLayout f = FinalNormLayout::For(config_);
    ZINF_ASSIGN_OR_RETURN(const float* pf, Widen(final_norm, f.num_elems, layout_.wide_unit, HeadProducts(f)));
    ZINF_ASSIGN_OR_RETURN(const float* head, Head(pf, embedding));
    float* lnf = F32(layout_.lnf);
    float* probs = F32(layout_.probs);
    const int64_t ld = layout_.logits_ld;  // rows of the logits, 16-byte-aligned in bf16
    Op("norm");
    ZINF_RETURN_IF_ERROR(NormForward(lnf, F32(layout_.lnf_mean), F32(layout_.lnf_rstd),
                                     F32(layout_.residual) + L * BT * C, pf + f.w, TensorAt(pf, f.b)));
    // The logits and the loss, loss_chunk_rows rows at a time (with several
    // chunks, backward computes each chunk's logits again).
    for (int64_t r0 = 0; r0 < BT; r0 += layout_.loss_chunk_rows) {
      const int64_t rows = std::min(layout_.loss_chunk_rows, BT - r0);
      Op("matmul");
      ZINF_RETURN_IF_ERROR(Gemm(false, true, rows, V, C, 1.0f, lnf + r0 * C, C, head, C, 0.0f, probs, ld));
      Op("loss");
      ZINF_RETURN_IF_ERROR(SoftmaxCrossEntropyForward(probs, I32(layout_.targets) + r0, probs,
                                                      F32(layout_.losses) + r0, rows, V, ld, s_));
    }
    ZINF_RETURN_IF_ERROR(MeanLoss(F32(layout_.losses), I32(layout_.targets), BT, loss, count_, s_));
    EndOps();
    head_forward_done_ = true;
    return Status::Ok();
  }

  Status HeadBackward(float loss_scale, const void* final_norm, const void* embedding, void* final_norm_grad,
                      void* embedding_grad) override {
    BeginStage();
    if (!head_forward_done_ || backward_next_ != -2) {
      return FailedPrecondition("gpt model: HeadBackward needs a completed forward (HeadForward) first");
    }
    const int64_t B = options_.batch_size, T = options_.seq_len, C = config_.embed_dim, V = config_.vocab_size;
    const int64_t BT = B * T, L = config_.num_layers;
    const FinalNormLayout f = FinalNormLayout::For(config_);
    const EmbeddingLayout e = EmbeddingLayout::For(config_);
    ZINF_ASSIGN_OR_RETURN(const float* pf, Widen(final_norm, f.num_elems, layout_.wide_unit, HeadProducts(f)));
    ZINF_ASSIGN_OR_RETURN(const float* head, Head(pf, embedding));
    ZINF_ASSIGN_OR_RETURN(float* gf, BeginGrad(final_norm_grad, f.num_elems, layout_.grad_unit));
    ZINF_ASSIGN_OR_RETURN(embedding_grad32_, BeginGrad(embedding_grad, e.num_elems, layout_.grad_embedding));
    // A tied head's gradient is wte's, in unit 0; an untied one is lm_head_w's.
    float* ghead = config_.tied_head ? embedding_grad32_ + e.wte : gf + f.lm_head;
    float* dlogits = F32(layout_.probs);  // in place over the probabilities
    const int64_t ld = layout_.logits_ld;
    float* dlnf = F32(layout_.dbuf);
    const float* lnf = F32(layout_.lnf);
    const int64_t chunk = layout_.loss_chunk_rows;
    const bool chunked = chunk < BT;
    // With bf16 products the chunks' bf16 logits gradients gather in the A
    // operand copy, as many whole chunks as it holds (4 of 512 rows at
    // llama-3.2-1b's shape, T = 2048, micro-batch 2), and the head's weight
    // gradient is one product a group: its [V, C] fp32 sum is read and
    // written once a group, not once a chunk (2.1 GB each time at V =
    // 128256, C = 2048). The CPU model adds chunk by chunk; the sums differ
    // only in their order.
    // The head's weights must be a kept copy (bf16 parameters), and the final
    // norm's output is rounded once into the B copy (each chunk's rows
    // 16-byte aligned in it: C a multiple of 8), so that no product rounds
    // an operand into either copy while the A copy gathers.
    auto* const dlogits16 = reinterpret_cast<uint16_t*>(arena_ + layout_.bf16_a);
    const bool gather = bf16_ && chunked && C % 8 == 0 && Bf16CopyOf(head, V * C) != nullptr;
    const int64_t group = gather ? std::max<int64_t>(1, layout_.bf16_operand_elems / (chunk * ld)) * chunk : chunk;
    if (gather) {
      Op("matmul operand cast");
      auto* lnf16 = reinterpret_cast<uint16_t*>(arena_ + layout_.bf16_b);
      ZINF_RETURN_IF_ERROR(Cast(lnf, DType::kFloat32, lnf16, DType::kBFloat16, static_cast<size_t>(BT * C), s_));
      bf16_copies_[kHeadInput] = Bf16Copy{lnf, lnf16, BT * C};
    }
    for (int64_t g0 = 0; g0 < BT; g0 += group) {
      const int64_t group_rows = std::min(group, BT - g0);
      for (int64_t r0 = g0; r0 < g0 + group_rows; r0 += chunk) {
        const int64_t rows = std::min(chunk, g0 + group_rows - r0);
        if (chunked) {  // this chunk's logits again (forward kept the last chunk's probabilities only)
          Op("matmul");
          ZINF_RETURN_IF_ERROR(Gemm(false, true, rows, V, C, 1.0f, lnf + r0 * C, C, head, C, 0.0f, dlogits, ld));
          if (!bf16_) {
            Op("loss");
            ZINF_RETURN_IF_ERROR(SoftmaxCrossEntropyForward(dlogits, I32(layout_.targets) + r0, dlogits,
                                                            F32(layout_.losses) + r0, rows, V, ld, s_));
          }
        }
        // scale · (p - onehot) with scale = loss_scale / targets, the count on the device.
        Op("loss");
        if (bf16_) {  // straight into the bf16 operand copy, which both products read
          uint16_t* rows16 = dlogits16 + (r0 - g0) * ld;
          const int32_t* targets = I32(layout_.targets) + r0;
          // From the logits when chunked (their probabilities not stored), else from forward's probabilities.
          ZINF_RETURN_IF_ERROR(
              chunked ? SoftmaxCrossEntropyGradBf16(dlogits, targets, rows16, rows, V, ld, loss_scale, count_, s_)
                      : SoftmaxCrossEntropyBackwardBf16(dlogits, targets, rows16, rows, V, ld, loss_scale, count_, s_));
          bf16_copies_[kProductInput] = Bf16Copy{dlogits, rows16, rows * ld};
        } else {
          ZINF_RETURN_IF_ERROR(
              SoftmaxCrossEntropyBackward(dlogits, I32(layout_.targets) + r0, dlogits, rows, V, ld, 1.0f, s_));
          ZINF_RETURN_IF_ERROR(ScaleByCount(dlogits, static_cast<size_t>(rows * ld), loss_scale, count_, s_));
        }
        Op("matmul");
        ZINF_RETURN_IF_ERROR(Gemm(false, false, rows, C, V, 1.0f, dlogits, ld, head, C, 0.0f, dlnf + r0 * C, C));
        if (!bf16_) ZINF_RETURN_IF_ERROR(Gemm(true, false, V, C, rows, 1.0f, dlogits, ld, lnf + r0 * C, C, 1.0f, ghead, C));
      }
      if (bf16_) {
        // The group's weight gradient: `dlogits` names its rows in the A copy.
        // That name spans group_rows · ld floats from probs, past the probs'
        // own place (one chunk's), so only this product runs while it is set;
        // its other operand, lnf, lies before probs.
        bf16_copies_[kProductInput] = Bf16Copy{dlogits, dlogits16, group_rows * ld};
        ZINF_RETURN_IF_ERROR(
            Gemm(true, false, V, C, group_rows, 1.0f, dlogits, ld, lnf + g0 * C, C, 1.0f, ghead, C));
      }
      bf16_copies_[kProductInput] = {};  // the next chunk's products overwrite the copy
    }
    bf16_copies_[kHeadInput] = {};
    float* dres = F32(layout_.dres);
    Op("norm");
    ZINF_RETURN_IF_ERROR(device_.Memset(dres, 0, BT * C * sizeof(float), stream_));
    ZINF_RETURN_IF_ERROR(NormBackward(dres, gf + f.w, TensorAt(gf, f.b), dlnf, F32(layout_.residual) + L * BT * C,
                                      pf + f.w, F32(layout_.lnf_mean), F32(layout_.lnf_rstd)));
    ZINF_RETURN_IF_ERROR(EndGrad(final_norm_grad, gf, f.num_elems));
    EndOps();
    head_forward_done_ = false;
    backward_next_ = static_cast<int>(L) - 1;
    return Status::Ok();
  }

  Status BlockBackward(int layer, const void* block, void* block_grad) override {
    BeginStage();
    if (backward_next_ < 0 || layer != backward_next_) {
      return FailedPrecondition("gpt model: BlockBackward(" + std::to_string(layer) + ") out of order");
    }
    const model::GptConfig& c = config_;
    const int64_t B = options_.batch_size, T = options_.seq_len, C = c.embed_dim;
    const int64_t BT = B * T, Q = c.q_dim(), S = c.qkv_dim(), I = c.mlp_dim(), FC = c.fc_dim();
    const BlockLayout w = BlockLayout::For(c);
    ZINF_ASSIGN_OR_RETURN(const float* p, Widen(block, w.num_elems, layout_.wide_unit, BlockProducts(w)));
    if (options_.activation_checkpointing && checkpoint_layer_ != layer) ZINF_RETURN_IF_ERROR(RunBlockForward(layer, p));
    const std::array<Range, 4> products = BlockProducts(w);
    const bool direct = DirectGrads();
    const std::span<const Range> direct_ranges = direct ? std::span<const Range>(products) : std::span<const Range>{};
    ZINF_ASSIGN_OR_RETURN(float* g, BeginGrad(block_grad, w.num_elems, layout_.grad_unit, direct_ranges));
    // A linear layer's weight gradient at offset `at` of the unit.
    const auto dw = [&](int64_t at) {
      return direct ? WeightGrad{nullptr, static_cast<uint16_t*>(block_grad) + at} : WeightGrad{g + at, nullptr};
    };
    const ActivationLayout::Block a = layout_.BlockAt(layer);
    const float* in = F32(layout_.residual) + layer * BT * C;
    float* dres = F32(layout_.dres);  // d(block output) on entry, d(block input) on exit
    float* dbuf = F32(layout_.dbuf);
    float* dfch = F32(layout_.dfch);
    float* dqkv = F32(layout_.dqkv);
    if (bf16_) {  // the block's tensors its forward kept in bf16 alone
      OnlyBf16(kLn1, F32(a.ln1), BT * C);
      OnlyBf16(kLn2, F32(a.ln2), BT * C);
      OnlyBf16(kActivation, F32(a.fch_gelu), BT * I);
      if (attention16_) OnlyBf16(kAttention, F32(a.atty), BT * Q);
    }
    // MLP: out = res_mid + fc_proj(act(fc(norm2(res_mid)))).
    if (model::SwiGluInBf16(c, options_)) {
      // The fc output and the activation's gradient in bf16 (model::SwiGluInBf16),
      // and dfch, only the fc products' operand, too.
      auto* dact16 = reinterpret_cast<uint16_t*>(dbuf);
      ZINF_RETURN_IF_ERROR(LinearBackward(dbuf, dw(w.fc_proj_w), TensorAt(g, w.fc_proj_b), dres, F32(a.fch_gelu),
                                          p + w.fc_proj_w, BT, I, C, dact16));
      Op("activation");
      ZINF_RETURN_IF_ERROR(SwiGluBackwardBf16(reinterpret_cast<const uint16_t*>(F32(a.fch)), dact16,
                                              OnlyBf16(kActivationGrad, dfch, BT * FC), BT, I, s_));
    } else if (c.mlp == model::MlpKind::kSwiGlu) {
      ZINF_RETURN_IF_ERROR(LinearBackward(dbuf, dw(w.fc_proj_w), TensorAt(g, w.fc_proj_b), dres, F32(a.fch_gelu),
                                          p + w.fc_proj_w, BT, I, C));
      Op("activation");
      // dfch is then only the fc products' operand (an fc bias's gradient
      // would read it in fp32).
      if (bf16_ && TensorAt(g, w.fc_b) == nullptr) {
        ZINF_RETURN_IF_ERROR(SwiGluBackwardBf16(F32(a.fch), dbuf, OnlyBf16(kActivationGrad, dfch, BT * FC), BT, I, s_));
      } else {
        ZINF_RETURN_IF_ERROR(SwiGluBackward(F32(a.fch), dbuf, dfch, BT, I, s_));
      }
    } else {
      ZINF_RETURN_IF_ERROR(LinearBackward(dfch, dw(w.fc_proj_w), TensorAt(g, w.fc_proj_b), dres, F32(a.fch_gelu),
                                          p + w.fc_proj_w, BT, I, C));
      Op("activation");
      ZINF_RETURN_IF_ERROR(GeluBackward(F32(a.fch), dfch, dfch, static_cast<size_t>(BT * I), s_));
    }
    ZINF_RETURN_IF_ERROR(
        LinearBackward(dbuf, dw(w.fc_w), TensorAt(g, w.fc_b), dfch, F32(a.ln2), p + w.fc_w, BT, C, FC));
    ZINF_RETURN_IF_ERROR(NormBackward(dres, g + w.ln2_w, TensorAt(g, w.ln2_b), dbuf, F32(a.res_mid), p + w.ln2_w,
                                      F32(a.ln2_mean), F32(a.ln2_rstd)));
    // Attention: res_mid = in + attn_proj(attention(rope(qk_norm(qkv(norm1(in)))))).
    // dO in bf16 alone where the attention keeps it so (attention16_, dout16_only_).
    ZINF_RETURN_IF_ERROR(LinearBackward(dbuf, dw(w.attn_proj_w), TensorAt(g, w.attn_proj_b), dres, F32(a.atty),
                                        p + w.attn_proj_w, BT, Q, C,
                                        attention16_ && dout16_only_ ? reinterpret_cast<uint16_t*>(dbuf) : nullptr));
    ZINF_RETURN_IF_ERROR(AttentionBackward(a));
    if (c.positions == model::PositionKind::kRope) {
      Op("rope");
      if (qkv16_) {  // d(qkv) in bf16 alone (model::QkvInBf16), the qkv products' operand
        auto* dqkv16 = reinterpret_cast<uint16_t*>(dqkv);
        ZINF_RETURN_IF_ERROR(RopeBackwardBf16(dqkv16, QueryRows(), T, rope_cos_, rope_sin_, s_));
        ZINF_RETURN_IF_ERROR(RopeBackwardBf16(dqkv16 + Q, KeyRows(), T, rope_cos_, rope_sin_, s_));
      } else {
        ZINF_RETURN_IF_ERROR(RopeBackward(dqkv, QueryRows(), T, rope_cos_, rope_sin_, s_));
        ZINF_RETURN_IF_ERROR(RopeBackward(dqkv + Q, KeyRows(), T, rope_cos_, rope_sin_, s_));
      }
    }
    if (c.qk_norm) {
      // dq and dk through their RMSNorm, in place over dqkv (weight gradients first).
      Op("qk norm");
      const float* pre = F32(a.qk_pre);
      ZINF_RETURN_IF_ERROR(RmsNormBackward(dqkv, pre, p + w.q_norm_w, F32(a.qk_rstd), dqkv, false, g + w.q_norm_w,
                                           QueryRows(), s_));
      ZINF_RETURN_IF_ERROR(RmsNormBackward(dqkv + Q, pre + Q, p + w.k_norm_w, F32(a.qk_rstd) + BT * c.num_heads,
                                           dqkv + Q, false, g + w.k_norm_w, KeyRows(), s_));
    }
    ZINF_RETURN_IF_ERROR(
        LinearBackward(dbuf, dw(w.qkv_w), TensorAt(g, w.qkv_b), dqkv, F32(a.ln1), p + w.qkv_w, BT, C, S));
    ZINF_RETURN_IF_ERROR(NormBackward(dres, g + w.ln1_w, TensorAt(g, w.ln1_b), dbuf, in, p + w.ln1_w,
                                      F32(a.ln1_mean), F32(a.ln1_rstd)));
    ZINF_RETURN_IF_ERROR(EndGrad(block_grad, g, w.num_elems, direct_ranges));
    EndOps();
    --backward_next_;
    return Status::Ok();
  }

  Status EmbedBackward(void* embedding_grad) override {
    BeginStage();
    if (backward_next_ != -1) return FailedPrecondition("gpt model: EmbedBackward before the backward of every block");
    const int64_t B = options_.batch_size, T = options_.seq_len, C = config_.embed_dim;
    const EmbeddingLayout e = EmbeddingLayout::For(config_);
    Op("embedding");
    // The rows' sort keys in dbuf, which no block needs any more (8 bytes a
    // row, rounded up to a power of two, against its 4 · max(C, Q, I)).
    const uint64_t dbuf_bytes = static_cast<uint64_t>(B * T) * std::max({C, config_.q_dim(), config_.mlp_dim()}) * 4;
    ZINF_RETURN_IF_ERROR(EmbeddingBackward(F32(layout_.dres), I32(layout_.tokens), embedding_grad32_ + e.wte,
                                           TensorAt(embedding_grad32_, e.wpe), B * T, T, C, F32(layout_.dbuf),
                                           dbuf_bytes, s_));
    ZINF_RETURN_IF_ERROR(EndGrad(embedding_grad, embedding_grad32_, e.num_elems));
    EndOps();
    embedding_grad32_ = nullptr;
    backward_next_ = -3;
    forward_next_ = -1;
    return Status::Ok();
  }

 private:
  float* F32(uint64_t offset) const { return reinterpret_cast<float*>(arena_ + offset); }
  // zinf bench model --breakdown: the op that starts here (until the next).
  void Op(const char* name) { model::MarkOp(options_.profile, name); }
  void EndOps() { model::EndOps(options_.profile); }
  // Products inside an op of their own (the plain attention's QKᵀ and PV)
  // are that op's time, not "matmul"'s.
  const char* product_op_ = nullptr;
  // bf16 roundings of fp32 ranges, for the products' operands (Bf16CopyOf):
  // the bf16 parameters widened last into the unit's and the embedding's
  // copies (Widen); a product's input rounded by the product before it
  // (LinearBackward's dout), or the loss gradient of HeadBackward's chunk;
  // and, with bf16 products, the tensors kept as bf16 alone (`only`: their
  // place holds no fp32 values; an operand names one by its start), which
  // their kernels write at the start of their place: a block's norm outputs
  // (ln1, ln2) and MLP activation (fch_gelu), whose places the layout sizes
  // for bf16 (model::ProductInputsInBf16), and SwiGLU's gradient (dfch,
  // without an fc bias, whose gradient would read it), O, dO and d(qkv),
  // in the first half of fp32 places.
  struct Bf16Copy {
    const float* fp32 = nullptr;
    const uint16_t* bf16 = nullptr;
    int64_t n = 0;
    bool only = false;
  };
  enum CopySlot {
    kUnitParams,
    kEmbeddingParams,
    kProductInput,
    kLn1,
    kLn2,
    kAttention,
    kQkvGrad,
    kActivation,
    kActivationGrad,
    kHeadInput,
    kCopySlots
  };
  std::array<Bf16Copy, kCopySlots> bf16_copies_{};
  // The place of a bf16-only tensor of n elements (the layout's, bf16- or
  // fp32-sized): its bf16 values start there (registered as its copy).
  uint16_t* OnlyBf16(CopySlot slot, float* place, int64_t n) {
    bf16_copies_[slot] = Bf16Copy{place, reinterpret_cast<uint16_t*>(place), n, true};
    return reinterpret_cast<uint16_t*>(place);
  }
  // Whether x falls in the bytes of a bf16-only tensor's values.
  bool InBf16Only(const float* x) const {
    const auto* at = reinterpret_cast<const char*>(x);
    for (const Bf16Copy& p : bf16_copies_) {
      const auto* from = reinterpret_cast<const char*>(p.fp32);
      if (p.only && at >= from && at < from + p.n * 2) return true;
    }
    return false;
  }
  const void* last_b16_ = nullptr;  // the B operand of the last bf16 product
  struct ProductsAre {
    CudaStages* self;
    ProductsAre(CudaStages* s, const char* op) : self(s) { self->product_op_ = op; }
    ~ProductsAre() { self->product_op_ = nullptr; }
  };
  int32_t* I32(uint64_t offset) const { return reinterpret_cast<int32_t*>(arena_ + offset); }

  // 16-bit parameters widened into the arena; fp32 ones used in place.
  // bf16 parameters are also kept as their widened copy's bf16 rounding
  // (rounding a widened bf16 value gives it back): a product operand inside
  // the copy is the parameters themselves, uncast. So with bf16 products the
  // `products` ranges (tensors only ever a product's operand: the linear
  // layers' and the head's weights) are not widened at all, when each of
  // them starts 16-byte aligned (else Bf16CopyOf would not stand for them).
  struct Range {
    int64_t at = 0, n = 0;  // elements
  };
  Result<const float*> Widen(const void* params, int64_t n, uint64_t wide_offset,
                             std::span<const Range> products = {}) {
    if (options_.param_dtype == DType::kFloat32) return static_cast<const float*>(params);
    Op("cast");
    float* dst = F32(wide_offset);
    const bool bf16_params = options_.param_dtype == DType::kBFloat16;
    const auto* p16 = static_cast<const uint16_t*>(params);
    bool skip = bf16_ && bf16_params;
    for (const Range& r : products) skip = skip && reinterpret_cast<uintptr_t>(p16 + r.at) % 16 == 0;
    // The ranges widened: all of it, or the gaps between the products (in
    // increasing order).
    ZINF_RETURN_IF_ERROR(ForGaps(n, skip ? products : std::span<const Range>{}, [&](int64_t from, int64_t to) {
      return Cast(static_cast<const char*>(params) + from * DTypeSizeBytes(options_.param_dtype), options_.param_dtype,
                  dst + from, DType::kFloat32, static_cast<size_t>(to - from), s_);
    }));
    if (bf16_params) {
      bf16_copies_[wide_offset == layout_.wide_embedding ? kEmbeddingParams : kUnitParams] = Bf16Copy{dst, p16, n};
    }
    return static_cast<const float*>(dst);
  }
  // The untied head's weights, which only products read (none when tied).
  std::span<const Range> HeadProducts(const FinalNormLayout& f) {
    head_range_ = Range{f.lm_head, config_.vocab_size * config_.embed_dim};
    return config_.tied_head ? std::span<const Range>{} : std::span<const Range>{&head_range_, 1};
  }
  Range head_range_;
  // The ranges of a block's tensors that only products read.
  std::array<Range, 4> BlockProducts(const BlockLayout& w) const {
    const model::GptConfig& c = config_;
    const int64_t C = c.embed_dim;
    return {Range{w.qkv_w, C * c.qkv_dim()}, Range{w.attn_proj_w, c.q_dim() * C}, Range{w.fc_w, C * c.fc_dim()},
            Range{w.fc_proj_w, c.mlp_dim() * C}};
  }
  // A stage's start: its time is op `other` until its first named op, and no
  // bf16 copy of an earlier stage stands for its operands any more.
  void BeginStage() {
    Op(model::kStageOther);
    bf16_copies_ = {};
  }
  // The bf16 rounding of [x, x + span) where one is kept, or null. Only a
  // 16-byte-aligned one: the products' fast kernels need it.
  const void* Bf16CopyOf(const float* x, int64_t span) const {
    for (const Bf16Copy& p : bf16_copies_) {
      if (p.fp32 != nullptr && p.only) {  // named by its start alone (its place may be bf16-sized)
        if (x == p.fp32 && span <= p.n) return p.bf16;
      } else if (p.fp32 != nullptr && x >= p.fp32 && x + span <= p.fp32 + p.n) {
        const uint16_t* at = p.bf16 + (x - p.fp32);
        return reinterpret_cast<uintptr_t>(at) % 16 == 0 ? at : nullptr;
      }
    }
    return nullptr;
  }
  // The fp32 gradient to add into: the buffer itself (fp32) or the arena's
  // accumulator (16-bit), zeroed or loaded per accumulate_grads. `direct`:
  // ranges whose products write the bf16 gradient themselves (DirectGrads),
  // which the accumulator leaves out.
  Result<float*> BeginGrad(void* grad, int64_t n, uint64_t accumulator_offset, std::span<const Range> direct = {}) {
    const DType dtype = options_.grad_dtype;
    float* acc = dtype == DType::kFloat32 ? static_cast<float*>(grad) : F32(accumulator_offset);
    Op("gradient init");
    ZINF_RETURN_IF_ERROR(ForGaps(n, direct, [&](int64_t from, int64_t to) -> Status {
      if (!options_.accumulate_grads) {
        return device_.Memset(acc + from, 0, static_cast<uint64_t>(to - from) * sizeof(float), stream_);
      }
      if (dtype == DType::kFloat32) return Status::Ok();
      return Cast(static_cast<const char*>(grad) + from * DTypeSizeBytes(dtype), dtype, acc + from, DType::kFloat32,
                  static_cast<size_t>(to - from), s_);
    }));
    return acc;
  }
  Status EndGrad(void* grad, const float* acc, int64_t n, std::span<const Range> direct = {}) {
    if (options_.grad_dtype == DType::kFloat32) return Status::Ok();
    Op("cast");
    const DType dtype = options_.grad_dtype;
    return ForGaps(n, direct, [&](int64_t from, int64_t to) {
      return Cast(acc + from, DType::kFloat32, static_cast<char*>(grad) + from * DTypeSizeBytes(dtype), dtype,
                  static_cast<size_t>(to - from), s_);
    });
  }
  // With bf16 products, bf16 gradients and no accumulation across calls, a
  // linear layer's weight gradient is written by its product in bf16, into
  // the unit's gradient: the rounding of the same fp32 sums the accumulator
  // would hold, without the accumulator's zeroing, read-modify-write and
  // cast (12 bytes an element). The rest of the unit (norm weights, biases)
  // goes through the accumulator as before.
  bool DirectGrads() const {
    return bf16_ && options_.grad_dtype == DType::kBFloat16 && !options_.accumulate_grads;
  }
  // fn(from, to) over [0, n) less the `skip` ranges (disjoint, in increasing
  // order): each gap in turn.
  template <class Fn>
  static Status ForGaps(int64_t n, std::span<const Range> skip, const Fn& fn) {
    int64_t from = 0;
    for (const Range& r : skip) {
      if (r.at > from) ZINF_RETURN_IF_ERROR(fn(from, r.at));
      from = r.at + r.n;
    }
    return n > from ? fn(from, n) : Status::Ok();
  }

  // model::Gemm's contract, row-major. With bf16 operands (matmul_dtype)
  // each fp32 operand is rounded to nearest even by the cast kernel (the
  // CPU's RoundToBf16, gemm.h) into the layout's bf16 copies, and cuBLAS
  // multiplies those on tensor cores with fp32 accumulation and output
  // (CUBLAS_COMPUTE_32F). cuBLAS's own down-conversion of fp32 operands
  // (CUBLAS_COMPUTE_32F_FAST_16BF) does not round as the CPU does: on an H100
  // it put the gradients 5e-3 apart from the CPU model's, where rounding to
  // nearest even leaves only the order of the sums.
  Status Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    return GemmBatched(ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
  }
  // The same with bf16 products and a bf16 result: cuBLAS rounds each fp32
  // sum to nearest even as it writes it.
  Status GemmToBf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                    int64_t ldb, uint16_t* c, int64_t ldc) {
    if (!bf16_) return Internal("gpt model on CUDA: a bf16 product result without bf16 products");
    return GemmBatched(ta, tb, m, n, k, 1.0f, a, lda, 0, b, ldb, 0, 0.0f, c, ldc, 0, 1, CUDA_R_16BF);
  }
  // `count` row-major products, operand i at a + i·sa, b + i·sb, c + i·sc.
  Status GemmBatched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta, void* c, int64_t ldc,
                     int64_t sc, int64_t count, cudaDataType c_type = CUDA_R_32F) {
    if (bf16_) {
      ZINF_ASSIGN_OR_RETURN(const Bf16Operands ops, OperandsInBf16(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, count));
      Op(product_op_ ? product_op_ : "matmul");
      return blas_.Bf16Products(ta, tb, m, n, k, alpha, ops.a, lda, sa, ops.b, ldb, sb, beta, c, ldc, sc, count,
                                c_type);
    }
    Op(product_op_ ? product_op_ : "matmul");
    return blas_.Fp32Products(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, static_cast<float*>(c), ldc, sc,
                              count);
  }
  // A product's bf16 operands (op "matmul operand cast" while they are
  // made): each operand rounds into a copy the other does not stand in;
  // either may be a kept rounding in a copy (LinearBackward's dout in B's,
  // HeadBackward's loss gradient in A's). Sets last_b16_.
  struct Bf16Operands {
    const void* a = nullptr;
    const void* b = nullptr;
  };
  Result<Bf16Operands> OperandsInBf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                      int64_t sa, const float* b, int64_t ldb, int64_t sb, int64_t count) {
    Op(product_op_ ? product_op_ : "matmul operand cast");
    const int64_t b_span = Span(tb ? n : k, tb ? k : n, ldb, sb, count);
    const uint64_t a_slot = InCopy(Bf16CopyOf(b, b_span), layout_.bf16_a) ? layout_.bf16_b : layout_.bf16_a;
    Bf16Operands ops;
    ZINF_ASSIGN_OR_RETURN(ops.a, Bf16Operand(a, ta ? k : m, ta ? m : k, lda, sa, count, a_slot));
    const uint64_t b_slot = InCopy(ops.a, layout_.bf16_b) ? layout_.bf16_a : layout_.bf16_b;
    ZINF_ASSIGN_OR_RETURN(ops.b, Bf16Operand(b, tb ? n : k, tb ? k : n, ldb, sb, count, b_slot));
    last_b16_ = ops.b;
    return ops;
  }

  // One bf16 product (row-major, as Gemm) through cuBLASLt with a fused
  // epilogue (LtProduct, gpt_cublas.h), c = a·b + beta · c_in (c_in: c
  // itself unless given, so a residual add reads the residual and writes the
  // sum in one pass). False where cuBLASLt has no algorithm for it, or its
  // sizes are not multiples of 8 or the bias is not 16-byte aligned: the
  // caller then runs the product and the bias kernel apart (the first time a
  // shape is refused, its operands were rounded to bf16 already and are
  // rounded again). The bias gradient is summed over the bf16 rounding of
  // dout, the operand the product reads, in cuBLASLt's order, where the CPU
  // sums fp32 dout in column chunks: it agrees with the CPU's within bf16
  // rounding, as the weight gradient does.
  Result<bool> LtGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                      int64_t ldb, float beta, void* c, cudaDataType c_type, int64_t ldc, cublasLtEpilogue_t epilogue,
                      const float* bias, const void* c_in = nullptr) {
    const LtProduct p{.ta = ta,
                      .tb = tb,
                      .m = m,
                      .n = n,
                      .k = k,
                      .lda = lda,
                      .ldb = ldb,
                      .ldc = ldc,
                      .beta = beta,
                      .d = c,
                      .d_type = c_type,
                      .epilogue = epilogue,
                      .bias = bias,
                      .c_in = c_in ? c_in : c};
    if (!blas_.LtMayFuse(p)) return false;
    ZINF_ASSIGN_OR_RETURN(const Bf16Operands ops, OperandsInBf16(ta, tb, m, n, k, a, lda, 0, b, ldb, 0, 1));
    Op(product_op_ ? product_op_ : "matmul");
    return blas_.LtRun(p, ops.a, ops.b);
  }

  // The elements from the first of `count` row-major [rows, cols] matrices
  // (leading dimension ld, `stride` elements apart) to the last one's end.
  static int64_t Span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t count) {
    return (count - 1) * stride + (rows - 1) * ld + cols;
  }
  // Whether p points into the bf16 operand copy at `slot`.
  bool InCopy(const void* p, uint64_t slot) const {
    const char* at = static_cast<const char*>(p);
    return at >= arena_ + slot && at < arena_ + slot + layout_.bf16_operand_elems * 2;
  }
  // The bf16 copy of `count` row-major [rows, cols] matrices with leading
  // dimension ld, `stride` elements apart: every element of their span
  // (those between the rows too) rounded, so the copy keeps ld and stride.
  // An operand with a kept bf16 rounding (Bf16CopyOf) is that, uncast.
  Result<const void*> Bf16Operand(const float* x, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                                  int64_t count, uint64_t slot) {
    const int64_t span = Span(rows, cols, ld, stride, count);
    if (const void* copy = Bf16CopyOf(x, span)) return copy;
    if (InBf16Only(x)) {  // its fp32 range holds no fp32 values to round
      return Internal("gpt model on CUDA: a bf16 operand of " + std::to_string(span) +
                      " elements inside a tensor kept in bf16 alone, but not 16-byte aligned in it or not within it");
    }
    if (span > layout_.bf16_operand_elems) {
      return Internal("gpt model on CUDA: a bf16 operand of " + std::to_string(span) +
                      " elements exceeds the layout's copies of " + std::to_string(layout_.bf16_operand_elems));
    }
    void* dst = arena_ + slot;
    ZINF_RETURN_IF_ERROR(Cast(x, DType::kFloat32, dst, DType::kBFloat16, static_cast<size_t>(span), s_));
    return static_cast<const void*>(dst);
  }

  // model::LinearForward / LinearBackward (dinp overwritten).
  // With `residual`, out = residual + the layer's output (ResidualForward
  // after it), fused into the product's epilogue where cuBLASLt takes it.
  Status LinearForward(float* out, const float* inp, const float* w, const float* bias, int64_t rows, int64_t in_dim,
                       int64_t out_dim, const float* residual = nullptr) {
    if ((bias || residual) && bf16_ && blas_.has_lt()) {  // the bias and the residual in the product's epilogue
      ZINF_ASSIGN_OR_RETURN(
          const bool fused,
          LtGemm(false, false, rows, out_dim, in_dim, inp, in_dim, w, out_dim, residual ? 1.0f : 0.0f, out,
                 CUDA_R_32F, out_dim, bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, residual));
      if (fused) return Status::Ok();
    }
    if (residual) {
      ZINF_RETURN_IF_ERROR(LinearForward(out, inp, w, bias, rows, in_dim, out_dim));
      Op("residual");
      return ResidualForward(out, residual, out, static_cast<size_t>(rows * out_dim), s_);
    }
    if (bias) {
      Op("bias");
      ZINF_RETURN_IF_ERROR(BroadcastRow(bias, out, rows, out_dim, s_));
    }
    return Gemm(false, false, rows, out_dim, in_dim, 1.0f, inp, in_dim, w, out_dim, bias ? 1.0f : 0.0f, out, out_dim);
  }
  // The weight gradient comes first (the two products are independent; dinp
  // is neither dout nor inp): with bf16 operands it rounds dout into the B
  // copy, which the input gradient's product then takes as its A operand
  // instead of rounding dout again. It adds into dw.f32, or, with
  // DirectGrads, is written by its product in bf16 into dw.bf16.
  struct WeightGrad {
    float* f32 = nullptr;
    uint16_t* bf16 = nullptr;
  };
  // With dinp16 the input gradient is written in bf16 there instead
  // (rounded by its product; dinp unused).
  Status LinearBackward(float* dinp, WeightGrad dw, float* dbias, const float* dout, const float* inp,
                        const float* w, int64_t rows, int64_t in_dim, int64_t out_dim, uint16_t* dinp16 = nullptr) {
    // The bias gradient in the weight gradient's epilogue (into bias_grad_,
    // then added to dbias), where cuBLASLt has an algorithm for it.
    bool bias_fused = false;
    if (dbias && bf16_ && blas_.has_lt() && out_dim <= bias_grad_elems_) {
      ZINF_ASSIGN_OR_RETURN(
          bias_fused, LtGemm(true, false, in_dim, out_dim, rows, inp, in_dim, dout, out_dim, dw.bf16 ? 0.0f : 1.0f,
                             dw.bf16 ? static_cast<void*>(dw.bf16) : static_cast<void*>(dw.f32),
                             dw.bf16 ? CUDA_R_16BF : CUDA_R_32F, out_dim, CUBLASLT_EPILOGUE_BGRADA, bias_grad_));
    }
    if (!bias_fused) {
      ZINF_RETURN_IF_ERROR(dw.bf16 ? GemmToBf16(true, false, in_dim, out_dim, rows, inp, in_dim, dout, out_dim,
                                                dw.bf16, out_dim)
                                   : Gemm(true, false, in_dim, out_dim, rows, 1.0f, inp, in_dim, dout, out_dim, 1.0f,
                                          dw.f32, out_dim));
    }
    if (bf16_) bf16_copies_[kProductInput] = Bf16Copy{dout, static_cast<const uint16_t*>(last_b16_), rows * out_dim};
    const Status st =
        dinp16 ? GemmToBf16(false, true, rows, in_dim, out_dim, dout, out_dim, w, out_dim, dinp16, in_dim)
               : Gemm(false, true, rows, in_dim, out_dim, 1.0f, dout, out_dim, w, out_dim, 0.0f, dinp, in_dim);
    bf16_copies_[kProductInput] = {};
    ZINF_RETURN_IF_ERROR(st);
    if (dbias) {
      Op("bias gradient");
      ZINF_RETURN_IF_ERROR(bias_fused ? AddInPlace(dbias, bias_grad_, static_cast<size_t>(out_dim), s_)
                                      : ColumnSumAccumulate(dout, dbias, rows, out_dim, s_));
    }
    return Status::Ok();
  }

  // The config's norm over [B·T, C] (model::GptModel::NormForward and
  // NormBackward): LayerNorm, or RMSNorm, which leaves b, mean and gb unused.
  // The backward adds into dinp, gw and gb.
  // With a copy slot (and bf16 products) `out` is kept in bf16 alone: it
  // is only ever a product's operand.
  Status NormForward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b,
                     CopySlot only = kCopySlots) {
    const int64_t BT = options_.batch_size * options_.seq_len, C = config_.embed_dim;
    const StridedRows rows = StridedRows::Dense(BT, C);
    const float eps = static_cast<float>(config_.norm_eps);
    const bool rms = config_.norm == model::NormKind::kRmsNorm;
    Op("norm");
    if (bf16_ && only != kCopySlots) {
      uint16_t* out16 = OnlyBf16(only, out, BT * C);
      return rms ? RmsNormForwardBf16(in, w, out16, rstd, rows, eps, s_)
                 : LayerNormForwardBf16(in, w, b, out16, mean, rstd, BT, C, s_);
    }
    return rms ? RmsNormForward(in, w, out, rstd, rows, eps, s_) : LayerNormForward(in, w, b, out, mean, rstd, BT, C, s_);
  }
  Status NormBackward(float* dinp, float* gw, float* gb, const float* dout, const float* in, const float* w,
                      const float* mean, const float* rstd) {
    const int64_t BT = options_.batch_size * options_.seq_len, C = config_.embed_dim;
    Op("norm");
    if (config_.norm == model::NormKind::kRmsNorm) {
      return RmsNormBackward(dout, in, w, rstd, dinp, true, gw, StridedRows::Dense(BT, C), s_);
    }
    return LayerNormBackward(dout, in, w, mean, rstd, dinp, gw, gb, BT, C, s_);
  }
  // The query and the key heads of a fused qkv [B·T, S] as rows of D
  // (model::GptModel::QueryRows and KeyRows).
  StridedRows QueryRows() const {
    const int64_t BT = options_.batch_size * options_.seq_len, H = config_.num_heads;
    return StridedRows{BT * H, config_.head_dim(), H, config_.qkv_dim()};
  }
  StridedRows KeyRows() const {
    const int64_t BT = options_.batch_size * options_.seq_len, H = config_.kv_heads();
    return StridedRows{BT * H, config_.head_dim(), H, config_.qkv_dim()};
  }
  // The LM head's [V, C] weights, fp32: unit 0's wte (tied, widened into the
  // arena's embedding copy) or the final-norm unit's lm_head_w.
  Result<const float*> Head(const float* final_norm32, const void* embedding) {
    if (!config_.tied_head) return final_norm32 + FinalNormLayout::For(config_).lm_head;
    const EmbeddingLayout e = EmbeddingLayout::For(config_);
    // The head stages read wte only as the head's product operand.
    const Range wte[] = {{e.wte, config_.vocab_size * config_.embed_dim}};
    ZINF_ASSIGN_OR_RETURN(const float* pe, Widen(embedding, e.num_elems, layout_.wide_embedding, wte));
    return pe + e.wte;
  }

  // x[0, n) rounded to bf16 in place, through the A operand copy (the
  // fallback of the bf16-value tensors where the flash copies' kernels do
  // not run on this device).
  Status RoundInPlace(float* x, int64_t n) {
    if (n > layout_.bf16_operand_elems) {
      return Internal("gpt model on CUDA: " + std::to_string(n) + " elements to round exceed the operand copies");
    }
    Op("cast");
    void* copy = arena_ + layout_.bf16_a;
    ZINF_RETURN_IF_ERROR(Cast(x, DType::kFloat32, copy, DType::kBFloat16, static_cast<size_t>(n), s_));
    return Cast(copy, DType::kBFloat16, x, DType::kFloat32, static_cast<size_t>(n), s_);
  }
  // q, k and v of `t` at the fp32 tensor `qkv` [B·T, S].
  void PointQkvAt(model::AttentionTensors& t, float* qkv) const {
    t.q = qkv;
    t.k = qkv + config_.q_dim();
    t.v = qkv + config_.q_dim() + config_.kv_dim();
  }
  // With bf16 products, where the device runs them (dout16_only_, from
  // FlashAttentionCopiesFit), flash attention's kernels read bf16 copies:
  // of qkv, rounded once here into the A copy (not in every tile of every
  // block that loads them: the same bits) unless qkv is kept in bf16 alone
  // (qkv16_only_), and of dO, which is. The copies' time is the attention's.
  Status FlashCopies(model::AttentionTensors& t, bool backward) {
    if (!bf16_) return Status::Ok();
    const int64_t BT = options_.batch_size * options_.seq_len;
    if (!dout16_only_) {  // this device runs the kernels that read fp32 tiles: no copies
      // dO as bf16 values: fp32 dO (in dbuf) rounded in place, which the tiles and δ read.
      if (backward && attention16_) {
        ZINF_RETURN_IF_ERROR(RoundInPlace(F32(layout_.dbuf), BT * config_.q_dim()));
        Op("attention");
      }
      return Status::Ok();
    }
    // qkv in bf16 alone (qkv16_only_) is its own copy: its bf16 values start
    // at its fp32 place, with the same element offsets and strides.
    const uint16_t* qkv16 = reinterpret_cast<const uint16_t*>(t.q);
    if (!qkv16_only_) {
      auto* copy = reinterpret_cast<uint16_t*>(arena_ + layout_.bf16_a);
      ZINF_RETURN_IF_ERROR(Cast(t.q, DType::kFloat32, copy, DType::kBFloat16,
                                static_cast<size_t>(BT * config_.qkv_dim()), s_));
      qkv16 = copy;
    }
    t.q16 = qkv16;
    t.k16 = qkv16 + (t.k - t.q);
    t.v16 = qkv16 + (t.v - t.q);
    // dO: written in bf16 alone by attn_proj's input-gradient product.
    if (backward && !t.dout16) return Internal("gpt model on CUDA: flash backward without dO in bf16");
    return Status::Ok();
  }

  // The attention of block set `a`: flash (gpu/kernels.h), or the plain
  // products and softmax over the saved T × T probabilities
  // (model::AttentionForward / AttentionBackward), per batch row. Query head
  // h reads key/value head h / G (G = H / H_kv query heads a group), so the
  // heads with h % G = g form one strided batch over the key/value heads:
  // query head kvh·G + g at column (kvh·G + g)·D of q, out and dq (batch
  // stride G·D, G probability matrices), key/value head kvh at column kvh·D
  // of k, v, dk and dv (batch stride D). With G = 1 that is one batch of
  // every head.
  Status AttentionForward(const ActivationLayout::Block& a) {
    Op("attention");
    const ProductsAre products(this, "attention");
    if (flash_) {
      model::AttentionTensors t = model::FlashAttentionTensors(config_, layout_, a, arena_, false);
      if (qkv16_ && !qkv16_only_) PointQkvAt(t, F32(layout_.dqkv));  // their fp32 values (RunBlockForward)
      ZINF_RETURN_IF_ERROR(FlashCopies(t, false));
      if (attention16_) {  // O in bf16 alone, attn_proj's operand
        t.out16 = OnlyBf16(kAttention, t.out, options_.batch_size * options_.seq_len * config_.q_dim());
        t.out = nullptr;
      }
      return FlashAttentionForward(model::FlashAttentionShape(config_, options_), t, s_);
    }
    float* out = F32(a.atty);
    float* att = F32(a.att);
    const float* qkv = F32(a.qkv);
    const int64_t B = options_.batch_size, T = options_.seq_len, H = config_.num_heads, Hkv = config_.kv_heads();
    const int64_t D = config_.head_dim(), Q = config_.q_dim(), K = config_.kv_dim(), S = config_.qkv_dim();
    const int64_t G = H / Hkv, TT = T * T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t b = 0; b < B; ++b) {
      const float* q = qkv + b * T * S;
      const float* k = q + Q;
      for (int64_t g = 0; g < G; ++g) {  // scores = scale · q kᵀ
        ZINF_RETURN_IF_ERROR(GemmBatched(false, true, T, T, D, scale, q + g * D, S, G * D, k, S, D, 0.0f,
                                         att + (b * H + g) * TT, T, G * TT, Hkv));
      }
    }
    ZINF_RETURN_IF_ERROR(CausalSoftmaxForward(att, B * H, T, s_));
    for (int64_t b = 0; b < B; ++b) {
      const float* v = qkv + b * T * S + Q + K;
      for (int64_t g = 0; g < G; ++g) {  // out = att v
        ZINF_RETURN_IF_ERROR(GemmBatched(false, false, T, D, T, 1.0f, att + (b * H + g) * TT, T, G * TT, v, S, D,
                                         0.0f, out + b * T * Q + g * D, Q, G * D, Hkv));
      }
    }
    return Status::Ok();
  }
  // d(qkv) into dqkv from d(atty) in dbuf. A key/value head's dk and dv sum
  // its group's query heads in head order (g = 0 writes, the others add), as
  // the CPU's AttentionBackward does.
  Status AttentionBackward(const ActivationLayout::Block& a_set) {
    Op("attention");
    const ProductsAre products(this, "attention");
    if (flash_) {
      model::AttentionTensors t = model::FlashAttentionTensors(config_, layout_, a_set, arena_, true);
      if (attention16_) {  // O, and dO where attn_proj's product wrote it so, in bf16 alone
        t.out16 = reinterpret_cast<uint16_t*>(t.out);
        t.out = nullptr;
        if (dout16_only_) {
          t.dout16 = reinterpret_cast<const uint16_t*>(t.dout);
          t.dout = nullptr;
        }
      }
      if (qkv16_ && !qkv16_only_) {  // q, k and v stored in bf16, widened for kernels that read fp32
        Op("cast");
        float* wide = F32(layout_.dfch);  // free after the MLP's backward
        bf16_copies_[kActivationGrad] = {};  // the bf16 SwiGLU gradient there is overwritten
        const size_t n = static_cast<size_t>(options_.batch_size * options_.seq_len * config_.qkv_dim());
        ZINF_RETURN_IF_ERROR(Cast(t.q, DType::kBFloat16, wide, DType::kFloat32, n, s_));
        PointQkvAt(t, wide);
        Op("attention");
      }
      if (qkv16_) {  // d(qkv) in bf16 alone, with the layout of qkv (model::QkvInBf16)
        auto* dqkv16 = reinterpret_cast<uint16_t*>(t.dq);
        t.dq16 = dqkv16;
        t.dk16 = dqkv16 + (t.dk - t.dq);
        t.dv16 = dqkv16 + (t.dv - t.dq);
        t.dq = t.dk = t.dv = nullptr;
        OnlyBf16(kQkvGrad, F32(layout_.dqkv), options_.batch_size * options_.seq_len * config_.qkv_dim());
      }
      ZINF_RETURN_IF_ERROR(FlashCopies(t, true));
      return FlashAttentionBackward(model::FlashAttentionShape(config_, options_), t, s_);
    }
    float* dqkv = F32(layout_.dqkv);
    float* datt = F32(layout_.datt);
    const float* dout = F32(layout_.dbuf);
    const float* qkv = F32(a_set.qkv);
    const float* att = F32(a_set.att);
    const int64_t B = options_.batch_size, T = options_.seq_len, H = config_.num_heads, Hkv = config_.kv_heads();
    const int64_t D = config_.head_dim(), Q = config_.q_dim(), K = config_.kv_dim(), S = config_.qkv_dim();
    const int64_t G = H / Hkv, TT = T * T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (int64_t b = 0; b < B; ++b) {
      const float* q = qkv + b * T * S;
      const float* k = q + Q;
      const float* v = k + K;
      float* dq = dqkv + b * T * S;
      float* dk = dq + Q;
      float* dv = dk + K;
      const float* a = att + b * H * TT;
      const float* dy = dout + b * T * Q;
      float* da = datt + b * H * TT;
      for (int64_t g = 0; g < G; ++g) {  // datt = dy vᵀ
        ZINF_RETURN_IF_ERROR(
            GemmBatched(false, true, T, T, D, 1.0f, dy + g * D, Q, G * D, v, S, D, 0.0f, da + g * TT, T, G * TT, Hkv));
      }
      for (int64_t g = 0; g < G; ++g) {  // dv (+)= attᵀ dy
        ZINF_RETURN_IF_ERROR(GemmBatched(true, false, T, D, T, 1.0f, a + g * TT, T, G * TT, dy + g * D, Q, G * D,
                                         g == 0 ? 0.0f : 1.0f, dv, S, D, Hkv));
      }
      ZINF_RETURN_IF_ERROR(CausalSoftmaxBackward(a, da, H, T, scale, s_));  // da becomes d(q kᵀ)
      for (int64_t g = 0; g < G; ++g) {  // dq = d(q kᵀ) k
        ZINF_RETURN_IF_ERROR(GemmBatched(false, false, T, D, T, 1.0f, da + g * TT, T, G * TT, k, S, D, 0.0f,
                                         dq + g * D, S, G * D, Hkv));
      }
      for (int64_t g = 0; g < G; ++g) {  // dk (+)= d(q kᵀ)ᵀ q
        ZINF_RETURN_IF_ERROR(GemmBatched(true, false, T, D, T, 1.0f, da + g * TT, T, G * TT, q + g * D, S, G * D,
                                         g == 0 ? 0.0f : 1.0f, dk, S, D, Hkv));
      }
    }
    return Status::Ok();
  }

  Status RunBlockForward(int layer, const float* p) {
    const model::GptConfig& c = config_;
    const int64_t B = options_.batch_size, T = options_.seq_len, C = c.embed_dim;
    const int64_t BT = B * T, Q = c.q_dim(), S = c.qkv_dim(), I = c.mlp_dim(), FC = c.fc_dim();
    const BlockLayout w = BlockLayout::For(c);
    const ActivationLayout::Block a = layout_.BlockAt(layer);
    const float* in = F32(layout_.residual) + layer * BT * C;
    float* out = F32(layout_.residual) + (layer + 1) * BT * C;
    float* res_mid = F32(a.res_mid);
    // q, k and v as bf16 values (model::QkvInBf16), stored in bf16: written
    // so, or, where the device does not run the flash copies' kernels,
    // computed in fp32 in dqkv (backward scratch), rounded there, and stored.
    float* qkv = qkv16_ && !qkv16_only_ ? F32(layout_.dqkv) : F32(a.qkv);
    ZINF_RETURN_IF_ERROR(
        NormForward(F32(a.ln1), F32(a.ln1_mean), F32(a.ln1_rstd), in, p + w.ln1_w, TensorAt(p, w.ln1_b), kLn1));
    auto* qkv16 = reinterpret_cast<uint16_t*>(qkv);
    if (qkv16_only_) {
      ZINF_RETURN_IF_ERROR(GemmToBf16(false, false, BT, S, C, F32(a.ln1), C, p + w.qkv_w, S, qkv16, S));
    } else {
      ZINF_RETURN_IF_ERROR(LinearForward(qkv, F32(a.ln1), p + w.qkv_w, TensorAt(p, w.qkv_b), BT, C, S));
      if (qkv16_) ZINF_RETURN_IF_ERROR(RoundInPlace(qkv, BT * S));
    }
    if (c.qk_norm) {
      // q and k before their norm are kept (qk_pre, a copy of the whole qkv)
      // for backward; the norm writes them back into qkv.
      Op("qk norm");
      float* pre = F32(a.qk_pre);
      const float eps = static_cast<float>(c.norm_eps);
      ZINF_RETURN_IF_ERROR(device_.CopyOnDevice(pre, qkv, static_cast<uint64_t>(BT * S) * sizeof(float), stream_));
      ZINF_RETURN_IF_ERROR(RmsNormForward(pre, p + w.q_norm_w, qkv, F32(a.qk_rstd), QueryRows(), eps, s_));
      ZINF_RETURN_IF_ERROR(
          RmsNormForward(pre + Q, p + w.k_norm_w, qkv + Q, F32(a.qk_rstd) + BT * c.num_heads, KeyRows(), eps, s_));
    }
    if (c.positions == model::PositionKind::kRope) {
      Op("rope");
      if (qkv16_only_) {
        ZINF_RETURN_IF_ERROR(RopeForwardBf16(qkv16, QueryRows(), T, rope_cos_, rope_sin_, s_));
        ZINF_RETURN_IF_ERROR(RopeForwardBf16(qkv16 + Q, KeyRows(), T, rope_cos_, rope_sin_, s_));
      } else {
        ZINF_RETURN_IF_ERROR(RopeForward(qkv, QueryRows(), T, rope_cos_, rope_sin_, s_));
        ZINF_RETURN_IF_ERROR(RopeForward(qkv + Q, KeyRows(), T, rope_cos_, rope_sin_, s_));
        if (qkv16_) ZINF_RETURN_IF_ERROR(RoundInPlace(qkv, BT * S));
      }
    }
    if (qkv16_ && !qkv16_only_) {  // the rounded fp32 values stored as bf16
      Op("cast");
      ZINF_RETURN_IF_ERROR(Cast(qkv, DType::kFloat32, F32(a.qkv), DType::kBFloat16, static_cast<size_t>(BT * S), s_));
    }
    ZINF_RETURN_IF_ERROR(AttentionForward(a));
    ZINF_RETURN_IF_ERROR(
        LinearForward(res_mid, F32(a.atty), p + w.attn_proj_w, TensorAt(p, w.attn_proj_b), BT, Q, C, in));
    ZINF_RETURN_IF_ERROR(NormForward(F32(a.ln2), F32(a.ln2_mean), F32(a.ln2_rstd), res_mid, p + w.ln2_w,
                                     TensorAt(p, w.ln2_b), kLn2));
    // The fc output in bf16 alone where only SwiGLU reads it (model::SwiGluInBf16).
    const bool fch16 = model::SwiGluInBf16(c, options_);
    if (fch16) {
      ZINF_RETURN_IF_ERROR(GemmToBf16(false, false, BT, FC, C, F32(a.ln2), C, p + w.fc_w, FC,
                                      reinterpret_cast<uint16_t*>(F32(a.fch)), FC));
    } else {
      ZINF_RETURN_IF_ERROR(LinearForward(F32(a.fch), F32(a.ln2), p + w.fc_w, TensorAt(p, w.fc_b), BT, C, FC));
    }
    Op("activation");
    const bool swiglu = c.mlp == model::MlpKind::kSwiGlu;
    if (bf16_) {  // only ever the next product's operand: kept in bf16 alone
      uint16_t* act16 = OnlyBf16(kActivation, F32(a.fch_gelu), BT * I);
      ZINF_RETURN_IF_ERROR(fch16 ? SwiGluForwardBf16(reinterpret_cast<const uint16_t*>(F32(a.fch)), act16, BT, I, s_)
                           : swiglu ? SwiGluForwardBf16(F32(a.fch), act16, BT, I, s_)
                                  : GeluForwardBf16(F32(a.fch), act16, static_cast<size_t>(BT * I), s_));
    } else if (swiglu) {
      ZINF_RETURN_IF_ERROR(SwiGluForward(F32(a.fch), F32(a.fch_gelu), BT, I, s_));
    } else {
      ZINF_RETURN_IF_ERROR(GeluForward(F32(a.fch), F32(a.fch_gelu), static_cast<size_t>(BT * I), s_));
    }
    ZINF_RETURN_IF_ERROR(
        LinearForward(out, F32(a.fch_gelu), p + w.fc_proj_w, TensorAt(p, w.fc_proj_b), BT, I, C, res_mid));
    checkpoint_layer_ = layer;
    return Status::Ok();
  }

  Device& device_;
  Stream& stream_;
  void* s_;  // the cudaStream_t
  model::GptConfig config_;
  model::GptRunOptions options_;
  ActivationLayout layout_;
  char* arena_;
  const bool bf16_ = options_.matmul_dtype == DType::kBFloat16;  // bf16 operands on tensor cores
  const bool flash_ = options_.attention == model::AttentionKernel::kFlash;
  // The attention's O and dO as bf16 values (model::AttentionInBf16): O in
  // bf16 alone; dO too where the device runs the copies' kernels
  // (dout16_only_), else fp32 rounded in place.
  const bool attention16_ = model::AttentionInBf16(config_, options_);
  bool dout16_only_ = false;
  // q, k and v as bf16 values (model::QkvInBf16): in bf16 alone where the
  // device runs the copies' kernels (qkv16_only_), else fp32 rounded in place;
  // their gradient in bf16 alone either way.
  const bool qkv16_ = model::QkvInBf16(config_, options_);
  bool qkv16_only_ = false;
  GptCublas blas_;  // the products (set up by Init)
  // With cuBLASLt, for the linear layers' biases with bf16 products
  // (LtGemm): a device buffer for one layer's bias gradient.
  float* bias_grad_ = nullptr;
  int64_t bias_grad_elems_ = 0;
  float* count_ = nullptr;  // device: the last HeadForward's number of targets
  model::RopeTable rope_;        // RoPE: the host table rope_cos_ and rope_sin_ were copied from
  float* rope_cos_ = nullptr;    // device [T, D/2]; one allocation with rope_sin_
  float* rope_sin_ = nullptr;    // device [T, D/2]

  int forward_next_ = -1;
  bool head_forward_done_ = false;
  int backward_next_ = -2;
  int checkpoint_layer_ = -1;
  float* embedding_grad32_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<model::GptStages>> CreateGptCudaStages(Device& device, Stream& stream,
                                                              const model::GptConfig& config,
                                                              const model::GptRunOptions& options,
                                                              const model::ActivationLayout& layout, void* arena) {
  if (device.kind() != DeviceKind::kCuda) return InvalidArgument("gpt model: " + device.name() + " is not a CUDA device");
  auto stages = std::make_unique<CudaStages>(device, stream, config, options, layout, arena);
  ZINF_RETURN_IF_ERROR(stages->Init());
  return std::unique_ptr<model::GptStages>(std::move(stages));
}

}  // namespace zinf::gpu
