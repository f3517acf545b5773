// GptModel's stages (model/gpt.cc) on CUDA, one for one: the same buffers of
// the same layout, the same products in the same row-major shapes, the same
// variations of the decoder family (LayerNorm or RMSNorm, learned positions
// or RoPE, GELU or SwiGLU, grouped-query heads of any size, optional biases,
// q/k norm, a tied or an untied head) in the same order. A row-major product
// C = op(A) op(B) is cuBLAS's column-major Cᵀ = op(B)ᵀ op(A)ᵀ, so each call
// passes B before A with the transposes as given. The class is in
// gpt_cuda_stages.h; the backward stages are in gpt_cuda_backward.cc.
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
#include "exec/gpt_cuda_stages.h"
#include "gpu/cuda_check.h"
#include "gpu/decoder_kernels.h"
#include "gpu/kernels.h"
#include "model/gemm.h"

namespace zinf::exec {

using gpu::BroadcastRow;
using gpu::Cast;
using gpu::CausalSoftmaxForward;
using gpu::EmbeddingForward;
using gpu::FlashAttentionCopiesFit;
using gpu::FlashAttentionForward;
using gpu::GeluForward;
using gpu::GeluForwardBf16;
using gpu::LayerNormForward;
using gpu::LayerNormForwardBf16;
using gpu::MeanLoss;
using gpu::ResidualForward;
using gpu::RmsNormForwardBf16;
using gpu::RopeForwardBf16;
using gpu::SoftmaxCrossEntropyForward;
using gpu::SwiGluForward;
using gpu::SwiGluForwardBf16;

Status CudaStages::Init() {
  if (!s_) return InvalidArgument("gpt model on CUDA: the stream has no CUDA stream");
  if (flash_) {
    const int64_t D = config_.head_dim();
    if (!bf16_) {
      return InvalidArgument(
          "gpt model on CUDA: flash attention runs on tensor cores and takes bf16 operands "
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
    ZINF_ASSIGN_OR_RETURN(void* g, device_.Allocate(static_cast<uint64_t>(bias_grad_elems_) * sizeof(float), stream_));
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

Status CudaStages::EmbedForward(const int32_t* tokens, const void* embedding) {
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

Status CudaStages::BlockForward(int layer, const void* block) {
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

Status CudaStages::HeadForward(const int32_t* targets, const void* final_norm, const void* embedding, float* loss) {
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
    ZINF_RETURN_IF_ERROR(
        SoftmaxCrossEntropyForward(probs, I32(layout_.targets) + r0, probs, F32(layout_.losses) + r0, rows, V, ld, s_));
  }
  ZINF_RETURN_IF_ERROR(MeanLoss(F32(layout_.losses), I32(layout_.targets), BT, loss, count_, s_));
  EndOps();
  head_forward_done_ = true;
  return Status::Ok();
}

Result<const float*> CudaStages::Widen(const void* params, int64_t n, uint64_t wide_offset,
                                       std::span<const Range> products) {
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

const void* CudaStages::Bf16CopyOf(const float* x, int64_t span) const {
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

Status CudaStages::GemmBatched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                               int64_t lda, int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta, void* c,
                               int64_t ldc, int64_t sc, int64_t count, cudaDataType c_type) {
  if (bf16_) {
    ZINF_ASSIGN_OR_RETURN(const Bf16Operands ops, OperandsInBf16(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, count));
    Op(product_op_ ? product_op_ : "matmul");
    return blas_.Bf16Products(ta, tb, m, n, k, alpha, ops.a, lda, sa, ops.b, ldb, sb, beta, c, ldc, sc, count, c_type);
  }
  Op(product_op_ ? product_op_ : "matmul");
  return blas_.Fp32Products(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, static_cast<float*>(c), ldc, sc,
                            count);
}

Result<CudaStages::Bf16Operands> CudaStages::OperandsInBf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                                            const float* a, int64_t lda, int64_t sa, const float* b,
                                                            int64_t ldb, int64_t sb, int64_t count) {
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

Result<bool> CudaStages::LtGemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                const float* b, int64_t ldb, float beta, void* c, cudaDataType c_type, int64_t ldc,
                                cublasLtEpilogue_t epilogue, const float* bias, const void* c_in) {
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

Result<const void*> CudaStages::Bf16Operand(const float* x, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
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

Status CudaStages::LinearForward(float* out, const float* inp, const float* w, const float* bias, int64_t rows,
                                 int64_t in_dim, int64_t out_dim, const float* residual) {
  if ((bias || residual) && bf16_ && blas_.has_lt()) {  // the bias and the residual in the product's epilogue
    ZINF_ASSIGN_OR_RETURN(
        const bool fused,
        LtGemm(false, false, rows, out_dim, in_dim, inp, in_dim, w, out_dim, residual ? 1.0f : 0.0f, out, CUDA_R_32F,
               out_dim, bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, residual));
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

Status CudaStages::NormForward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b,
                               CopySlot only) {
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

Result<const float*> CudaStages::Head(const float* final_norm32, const void* embedding) {
  if (!config_.tied_head) return final_norm32 + FinalNormLayout::For(config_).lm_head;
  const EmbeddingLayout e = EmbeddingLayout::For(config_);
  // The head stages read wte only as the head's product operand.
  const Range wte[] = {{e.wte, config_.vocab_size * config_.embed_dim}};
  ZINF_ASSIGN_OR_RETURN(const float* pe, Widen(embedding, e.num_elems, layout_.wide_embedding, wte));
  return pe + e.wte;
}

Status CudaStages::RoundInPlace(float* x, int64_t n) {
  if (n > layout_.bf16_operand_elems) {
    return Internal("gpt model on CUDA: " + std::to_string(n) + " elements to round exceed the operand copies");
  }
  Op("cast");
  void* copy = arena_ + layout_.bf16_a;
  ZINF_RETURN_IF_ERROR(Cast(x, DType::kFloat32, copy, DType::kBFloat16, static_cast<size_t>(n), s_));
  return Cast(copy, DType::kBFloat16, x, DType::kFloat32, static_cast<size_t>(n), s_);
}

Status CudaStages::FlashCopies(math::AttentionTensors& t, bool backward) {
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
    ZINF_RETURN_IF_ERROR(
        Cast(t.q, DType::kFloat32, copy, DType::kBFloat16, static_cast<size_t>(BT * config_.qkv_dim()), s_));
    qkv16 = copy;
  }
  t.q16 = qkv16;
  t.k16 = qkv16 + (t.k - t.q);
  t.v16 = qkv16 + (t.v - t.q);
  // dO: written in bf16 alone by attn_proj's input-gradient product.
  if (backward && !t.dout16) return Internal("gpt model on CUDA: flash backward without dO in bf16");
  return Status::Ok();
}

Status CudaStages::AttentionForward(const ActivationLayout::Block& a) {
  Op("attention");
  const ProductsAre products(this, "attention");
  if (flash_) {
    math::AttentionTensors t = model::FlashAttentionTensors(config_, layout_, a, arena_, false);
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
      ZINF_RETURN_IF_ERROR(GemmBatched(false, false, T, D, T, 1.0f, att + (b * H + g) * TT, T, G * TT, v, S, D, 0.0f,
                                       out + b * T * Q + g * D, Q, G * D, Hkv));
    }
  }
  return Status::Ok();
}

Status CudaStages::RunBlockForward(int layer, const float* p) {
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
  ZINF_RETURN_IF_ERROR(
      NormForward(F32(a.ln2), F32(a.ln2_mean), F32(a.ln2_rstd), res_mid, p + w.ln2_w, TensorAt(p, w.ln2_b), kLn2));
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
    ZINF_RETURN_IF_ERROR(fch16    ? SwiGluForwardBf16(reinterpret_cast<const uint16_t*>(F32(a.fch)), act16, BT, I, s_)
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

Result<std::unique_ptr<GptStages>> CreateGptCudaStages(Device& device, Stream& stream, const model::GptConfig& config,
                                                       const model::GptRunOptions& options,
                                                       const model::ActivationLayout& layout, void* arena) {
  if (device.kind() != DeviceKind::kCuda)
    return InvalidArgument("gpt model: " + device.name() + " is not a CUDA device");
  auto stages = std::make_unique<CudaStages>(device, stream, config, options, layout, arena);
  ZINF_RETURN_IF_ERROR(stages->Init());
  return std::unique_ptr<GptStages>(std::move(stages));
}

}  // namespace zinf::exec
