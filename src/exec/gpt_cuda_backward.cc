// The CUDA GPT stages' backward (the class is in gpt_cuda_stages.h, the
// forward stages in gpt_cuda.cc): the head's loss gradient chunk by chunk,
// each block's layers in reverse, the embedding's gradient, and the
// gradients' accumulators. Same products and kernels in the same order as
// model/gpt.cc's backward.
#include <algorithm>
#include <array>
#include <cmath>
#include <span>
#include <string>

#include "exec/gpt_cuda_stages.h"
#include "gpu/decoder_kernels.h"
#include "gpu/kernels.h"

namespace zinf::exec {

using gpu::AddInPlace;
using gpu::Cast;
using gpu::CausalSoftmaxBackward;
using gpu::ColumnSumAccumulate;
using gpu::EmbeddingBackward;
using gpu::FlashAttentionBackward;
using gpu::GeluBackward;
using gpu::LayerNormBackward;
using gpu::RmsNormBackward;
using gpu::RopeBackward;
using gpu::RopeBackwardBf16;
using gpu::ScaleByCount;
using gpu::SoftmaxCrossEntropyBackward;
using gpu::SoftmaxCrossEntropyBackwardBf16;
using gpu::SoftmaxCrossEntropyForward;
using gpu::SoftmaxCrossEntropyGradBf16;
using gpu::SwiGluBackward;
using gpu::SwiGluBackwardBf16;

Status CudaStages::HeadBackward(float loss_scale, const void* final_norm, const void* embedding, void* final_norm_grad,
                                void* embedding_grad) {
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
      if (!bf16_)
        ZINF_RETURN_IF_ERROR(Gemm(true, false, V, C, rows, 1.0f, dlogits, ld, lnf + r0 * C, C, 1.0f, ghead, C));
    }
    if (bf16_) {
      // The group's weight gradient: `dlogits` names its rows in the A copy.
      // That name spans group_rows · ld floats from probs, past the probs'
      // own place (one chunk's), so only this product runs while it is set;
      // its other operand, lnf, lies before probs.
      bf16_copies_[kProductInput] = Bf16Copy{dlogits, dlogits16, group_rows * ld};
      ZINF_RETURN_IF_ERROR(Gemm(true, false, V, C, group_rows, 1.0f, dlogits, ld, lnf + g0 * C, C, 1.0f, ghead, C));
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

Status CudaStages::BlockBackward(int layer, const void* block, void* block_grad) {
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
  ZINF_RETURN_IF_ERROR(LinearBackward(dbuf, dw(w.fc_w), TensorAt(g, w.fc_b), dfch, F32(a.ln2), p + w.fc_w, BT, C, FC));
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
    ZINF_RETURN_IF_ERROR(
        RmsNormBackward(dqkv, pre, p + w.q_norm_w, F32(a.qk_rstd), dqkv, false, g + w.q_norm_w, QueryRows(), s_));
    ZINF_RETURN_IF_ERROR(RmsNormBackward(dqkv + Q, pre + Q, p + w.k_norm_w, F32(a.qk_rstd) + BT * c.num_heads, dqkv + Q,
                                         false, g + w.k_norm_w, KeyRows(), s_));
  }
  ZINF_RETURN_IF_ERROR(
      LinearBackward(dbuf, dw(w.qkv_w), TensorAt(g, w.qkv_b), dqkv, F32(a.ln1), p + w.qkv_w, BT, C, S));
  ZINF_RETURN_IF_ERROR(
      NormBackward(dres, g + w.ln1_w, TensorAt(g, w.ln1_b), dbuf, in, p + w.ln1_w, F32(a.ln1_mean), F32(a.ln1_rstd)));
  ZINF_RETURN_IF_ERROR(EndGrad(block_grad, g, w.num_elems, direct_ranges));
  EndOps();
  --backward_next_;
  return Status::Ok();
}

Status CudaStages::EmbedBackward(void* embedding_grad) {
  BeginStage();
  if (backward_next_ != -1) return FailedPrecondition("gpt model: EmbedBackward before the backward of every block");
  const int64_t B = options_.batch_size, T = options_.seq_len, C = config_.embed_dim;
  const EmbeddingLayout e = EmbeddingLayout::For(config_);
  Op("embedding");
  // The rows' sort keys in dbuf, which no block needs any more (8 bytes a
  // row, rounded up to a power of two, against its 4 · max(C, Q, I)).
  const uint64_t dbuf_bytes = static_cast<uint64_t>(B * T) * std::max({C, config_.q_dim(), config_.mlp_dim()}) * 4;
  ZINF_RETURN_IF_ERROR(EmbeddingBackward(F32(layout_.dres), I32(layout_.tokens), embedding_grad32_ + e.wte,
                                         TensorAt(embedding_grad32_, e.wpe), B * T, T, C, F32(layout_.dbuf), dbuf_bytes,
                                         s_));
  ZINF_RETURN_IF_ERROR(EndGrad(embedding_grad, embedding_grad32_, e.num_elems));
  EndOps();
  embedding_grad32_ = nullptr;
  backward_next_ = -3;
  forward_next_ = -1;
  return Status::Ok();
}

Result<float*> CudaStages::BeginGrad(void* grad, int64_t n, uint64_t accumulator_offset,
                                     std::span<const Range> direct) {
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

Status CudaStages::EndGrad(void* grad, const float* acc, int64_t n, std::span<const Range> direct) {
  if (options_.grad_dtype == DType::kFloat32) return Status::Ok();
  Op("cast");
  const DType dtype = options_.grad_dtype;
  return ForGaps(n, direct, [&](int64_t from, int64_t to) {
    return Cast(acc + from, DType::kFloat32, static_cast<char*>(grad) + from * DTypeSizeBytes(dtype), dtype,
                static_cast<size_t>(to - from), s_);
  });
}

Status CudaStages::LinearBackward(float* dinp, WeightGrad dw, float* dbias, const float* dout, const float* inp,
                                  const float* w, int64_t rows, int64_t in_dim, int64_t out_dim, uint16_t* dinp16) {
  // The bias gradient in the weight gradient's epilogue (into bias_grad_,
  // then added to dbias), where cuBLASLt has an algorithm for it.
  bool bias_fused = false;
  if (dbias && bf16_ && blas_.has_lt() && out_dim <= bias_grad_elems_) {
    ZINF_ASSIGN_OR_RETURN(bias_fused,
                          LtGemm(true, false, in_dim, out_dim, rows, inp, in_dim, dout, out_dim, dw.bf16 ? 0.0f : 1.0f,
                                 dw.bf16 ? static_cast<void*>(dw.bf16) : static_cast<void*>(dw.f32),
                                 dw.bf16 ? CUDA_R_16BF : CUDA_R_32F, out_dim, CUBLASLT_EPILOGUE_BGRADA, bias_grad_));
  }
  if (!bias_fused) {
    ZINF_RETURN_IF_ERROR(
        dw.bf16 ? GemmToBf16(true, false, in_dim, out_dim, rows, inp, in_dim, dout, out_dim, dw.bf16, out_dim)
                : Gemm(true, false, in_dim, out_dim, rows, 1.0f, inp, in_dim, dout, out_dim, 1.0f, dw.f32, out_dim));
  }
  if (bf16_) bf16_copies_[kProductInput] = Bf16Copy{dout, static_cast<const uint16_t*>(last_b16_), rows * out_dim};
  const Status st = dinp16
                        ? GemmToBf16(false, true, rows, in_dim, out_dim, dout, out_dim, w, out_dim, dinp16, in_dim)
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

Status CudaStages::NormBackward(float* dinp, float* gw, float* gb, const float* dout, const float* in, const float* w,
                                const float* mean, const float* rstd) {
  const int64_t BT = options_.batch_size * options_.seq_len, C = config_.embed_dim;
  Op("norm");
  if (config_.norm == model::NormKind::kRmsNorm) {
    return RmsNormBackward(dout, in, w, rstd, dinp, true, gw, StridedRows::Dense(BT, C), s_);
  }
  return LayerNormBackward(dout, in, w, mean, rstd, dinp, gw, gb, BT, C, s_);
}

Status CudaStages::AttentionBackward(const ActivationLayout::Block& a_set) {
  Op("attention");
  const ProductsAre products(this, "attention");
  if (flash_) {
    math::AttentionTensors t = model::FlashAttentionTensors(config_, layout_, a_set, arena_, true);
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
      float* wide = F32(layout_.dfch);     // free after the MLP's backward
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
    for (int64_t g = 0; g < G; ++g) {                                     // dq = d(q kᵀ) k
      ZINF_RETURN_IF_ERROR(
          GemmBatched(false, false, T, D, T, 1.0f, da + g * TT, T, G * TT, k, S, D, 0.0f, dq + g * D, S, G * D, Hkv));
    }
    for (int64_t g = 0; g < G; ++g) {  // dk (+)= d(q kᵀ)ᵀ q
      ZINF_RETURN_IF_ERROR(GemmBatched(true, false, T, D, T, 1.0f, da + g * TT, T, G * TT, q + g * D, S, G * D,
                                       g == 0 ? 0.0f : 1.0f, dk, S, D, Hkv));
    }
  }
  return Status::Ok();
}

}  // namespace zinf::exec
