// The CUDA GPT stages' class, shared by its two files: gpt_cuda.cc (set-up,
// the forward stages, and the products, linear layers and norms both
// directions use) and gpt_cuda_backward.cc (the backward stages). What the
// stages compute, and how they match the CPU model, is in gpt_cuda.cc and
// gpt_cuda.h. Includes cuBLAS's headers: private to src/exec's CUDA files.
// Thread-safety: one thread at a time (one stream's order).
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "exec/gpt_cublas.h"
#include "exec/gpt_device.h"
#include "gpu/decoder_kernels.h"
#include "gpu/kernels.h"
#include "model/gpt.h"
#include "model/op_profile.h"
#include "zinf/device.h"

namespace zinf::exec {

using gpu::StridedRows;
using model::ActivationLayout;
using model::BlockLayout;
using model::EmbeddingLayout;
using model::FinalNormLayout;
using model::TensorAt;

class CudaStages final : public GptStages {
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

  // The CUDA stream, cuBLAS, and the buffers of the stages' own (before any
  // stage runs).
  Status Init();

  // GptStages. The forward stages are in gpt_cuda.cc, the backward
  // ones in gpt_cuda_backward.cc.
  Status EmbedForward(const int32_t* tokens, const void* embedding) override;
  Status BlockForward(int layer, const void* block) override;
  Status HeadForward(const int32_t* targets, const void* final_norm, const void* embedding, float* loss) override;
  Status HeadBackward(float loss_scale, const void* final_norm, const void* embedding, void* final_norm_grad,
                      void* embedding_grad) override;
  Status BlockBackward(int layer, const void* block, void* block_grad) override;
  Status EmbedBackward(void* embedding_grad) override;

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
  Result<const float*> Widen(const void* params, int64_t n, uint64_t wide_offset, std::span<const Range> products = {});
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
  const void* Bf16CopyOf(const float* x, int64_t span) const;
  // The fp32 gradient to add into: the buffer itself (fp32) or the arena's
  // accumulator (16-bit), zeroed or loaded per accumulate_grads. `direct`:
  // ranges whose products write the bf16 gradient themselves (DirectGrads),
  // which the accumulator leaves out.
  Result<float*> BeginGrad(void* grad, int64_t n, uint64_t accumulator_offset, std::span<const Range> direct = {});
  Status EndGrad(void* grad, const float* acc, int64_t n, std::span<const Range> direct = {});
  // With bf16 products, bf16 gradients and no accumulation across calls, a
  // linear layer's weight gradient is written by its product in bf16, into
  // the unit's gradient: the rounding of the same fp32 sums the accumulator
  // would hold, without the accumulator's zeroing, read-modify-write and
  // cast (12 bytes an element). The rest of the unit (norm weights, biases)
  // goes through the accumulator as before.
  bool DirectGrads() const { return bf16_ && options_.grad_dtype == DType::kBFloat16 && !options_.accumulate_grads; }
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
  // (CUBLAS_COMPUTE_32F_FAST_16BF) does not round as the CPU does: it puts
  // the gradients far from the CPU model's (docs/figures.md, on the H100),
  // where rounding to nearest even leaves only the order of the sums.
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
                     int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta, void* c, int64_t ldc, int64_t sc,
                     int64_t count, cudaDataType c_type = CUDA_R_32F);
  // A product's bf16 operands (op "matmul operand cast" while they are
  // made): each operand rounds into a copy the other does not stand in;
  // either may be a kept rounding in a copy (LinearBackward's dout in B's,
  // HeadBackward's loss gradient in A's). Sets last_b16_.
  struct Bf16Operands {
    const void* a = nullptr;
    const void* b = nullptr;
  };
  Result<Bf16Operands> OperandsInBf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                      int64_t sa, const float* b, int64_t ldb, int64_t sb, int64_t count);

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
                      const float* bias, const void* c_in = nullptr);

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
  Result<const void*> Bf16Operand(const float* x, int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t count,
                                  uint64_t slot);

  // model::LinearForward / LinearBackward (dinp overwritten).
  // With `residual`, out = residual + the layer's output (ResidualForward
  // after it), fused into the product's epilogue where cuBLASLt takes it.
  Status LinearForward(float* out, const float* inp, const float* w, const float* bias, int64_t rows, int64_t in_dim,
                       int64_t out_dim, const float* residual = nullptr);
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
  Status LinearBackward(float* dinp, WeightGrad dw, float* dbias, const float* dout, const float* inp, const float* w,
                        int64_t rows, int64_t in_dim, int64_t out_dim, uint16_t* dinp16 = nullptr);

  // The config's norm over [B·T, C] (model::GptModel::NormForward and
  // NormBackward): LayerNorm, or RMSNorm, which leaves b, mean and gb unused.
  // The backward adds into dinp, gw and gb.
  // With a copy slot (and bf16 products) `out` is kept in bf16 alone: it
  // is only ever a product's operand.
  Status NormForward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b,
                     CopySlot only = kCopySlots);
  Status NormBackward(float* dinp, float* gw, float* gb, const float* dout, const float* in, const float* w,
                      const float* mean, const float* rstd);
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
  Result<const float*> Head(const float* final_norm32, const void* embedding);

  // x[0, n) rounded to bf16 in place, through the A operand copy (the
  // fallback of the bf16-value tensors where the flash copies' kernels do
  // not run on this device).
  Status RoundInPlace(float* x, int64_t n);
  // q, k and v of `t` at the fp32 tensor `qkv` [B·T, S].
  void PointQkvAt(math::AttentionTensors& t, float* qkv) const {
    t.q = qkv;
    t.k = qkv + config_.q_dim();
    t.v = qkv + config_.q_dim() + config_.kv_dim();
  }
  // With bf16 products, where the device runs them (dout16_only_, from
  // FlashAttentionCopiesFit), flash attention's kernels read bf16 copies:
  // of qkv, rounded once here into the A copy (not in every tile of every
  // block that loads them: the same bits) unless qkv is kept in bf16 alone
  // (qkv16_only_), and of dO, which is. The copies' time is the attention's.
  Status FlashCopies(math::AttentionTensors& t, bool backward);

  // The attention of block set `a`: flash (gpu/kernels.h), or the plain
  // products and softmax over the saved T × T probabilities
  // (model::AttentionForward / AttentionBackward), per batch row. Query head
  // h reads key/value head h / G (G = H / H_kv query heads a group), so the
  // heads with h % G = g form one strided batch over the key/value heads:
  // query head kvh·G + g at column (kvh·G + g)·D of q, out and dq (batch
  // stride G·D, G probability matrices), key/value head kvh at column kvh·D
  // of k, v, dk and dv (batch stride D). With G = 1 that is one batch of
  // every head.
  Status AttentionForward(const ActivationLayout::Block& a);
  // d(qkv) into dqkv from d(atty) in dbuf. A key/value head's dk and dv sum
  // its group's query heads in head order (g = 0 writes, the others add), as
  // the CPU's AttentionBackward does.
  Status AttentionBackward(const ActivationLayout::Block& a_set);

  // Block `layer`'s forward over its parameters p (fp32), for BlockForward,
  // and again for BlockBackward under activation checkpointing.
  Status RunBlockForward(int layer, const float* p);

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
  float* count_ = nullptr;     // device: the last HeadForward's number of targets
  model::RopeTable rope_;      // RoPE: the host table rope_cos_ and rope_sin_ were copied from
  float* rope_cos_ = nullptr;  // device [T, D/2]; one allocation with rope_sin_
  float* rope_sin_ = nullptr;  // device [T, D/2]

  int forward_next_ = -1;
  bool head_forward_done_ = false;
  int backward_next_ = -2;
  int checkpoint_layer_ = -1;
  float* embedding_grad32_ = nullptr;
};

}  // namespace zinf::exec
