// GptModel: the activation arena's plan and the stages of one step. The
// backward of a block follows llm.c's train_gpt2.c (Karpathy, 2024), with
// the residual stream's gradient kept in one buffer (dres) that each
// LayerNorm backward adds into.
#include "model/gpt.h"

#include "cpu/openblas_lib.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "common/units.h"
#include "common/float16.h"
#include "model/decoder_layers.h"
#include "model/flash_attention.h"
#include "model/gemm.h"
#include "model/layers.h"

namespace zinf::model {
namespace {

constexpr uint64_t kAlign = 64;
constexpr int64_t kConvertGrain = 1 << 16;

uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
uint64_t F32Bytes(int64_t n) { return static_cast<uint64_t>(n) * sizeof(float); }
// n elements stored as bf16 bits or as fp32.
uint64_t StoredBytes(int64_t n, bool bf16) { return static_cast<uint64_t>(n) * (bf16 ? 2 : sizeof(float)); }

// x[0, n) rounded to bf16 (to nearest even) in place: a tensor the model
// keeps as bf16 values (SwiGluInBf16, AttentionInBf16, QkvInBf16), as the
// CUDA model's kernels write it.
void RoundToBf16InPlace(const ModelThreads& th, float* x, int64_t n) {
  th.ForChunks(n, kConvertGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] = RoundToBf16(x[i]);
  });
}

// dst[0, n) = the bf16 bits of x[0, n) (rounded to nearest even): a tensor
// the model stores in bf16 (ProductInputsInBf16), computed in fp32 scratch.
void StoreBf16(const ModelThreads& th, uint16_t* dst, const float* x, int64_t n) {
  th.ForChunks(n, kConvertGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dst[i] = FloatToBf16Bits(x[i]);
  });
}

// dst[0, n) = the values of the bf16 bits x[0, n).
void WidenBf16(const ModelThreads& th, float* dst, const uint16_t* x, int64_t n) {
  th.ForChunks(n, kConvertGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dst[i] = Bf16BitsToFloat(x[i]);
  });
}

// x[0, n) rounded to bf16 in place, and its bits stored at dst too.
void RoundAndStoreBf16(const ModelThreads& th, float* x, uint16_t* dst, int64_t n) {
  th.ForChunks(n, kConvertGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      dst[i] = FloatToBf16Bits(x[i]);
      x[i] = Bf16BitsToFloat(dst[i]);
    }
  });
}

class Planner {
 public:
  uint64_t Take(uint64_t bytes) {
    const uint64_t offset = at_;
    at_ = AlignUp(at_ + bytes);
    return offset;
  }
  uint64_t at() const { return at_; }

 private:
  uint64_t at_ = 0;
};

}  // namespace

std::string_view AttentionKernelName(AttentionKernel a) {
  switch (a) {
    case AttentionKernel::kAuto:
      return "auto";
    case AttentionKernel::kPlain:
      return "plain";
    case AttentionKernel::kFlash:
      return "flash";
  }
  return "?";
}

AttentionKernel ToAttentionKernel(AttentionChoice choice) {
  switch (choice) {
    case AttentionChoice::kPlain:
      return AttentionKernel::kPlain;
    case AttentionChoice::kFlash:
      return AttentionKernel::kFlash;
    case AttentionChoice::kAuto:
      break;
  }
  return AttentionKernel::kAuto;
}

AttentionKernel ResolveAttention(const GptConfig& c, const GptRunOptions& o) {
  if (o.attention != AttentionKernel::kAuto) return o.attention;
  const int64_t D = c.num_heads > 0 ? c.head_dim() : 0;
  return o.matmul_dtype == DType::kBFloat16 && (D == 64 || D == 128) ? AttentionKernel::kFlash
                                                                     : AttentionKernel::kPlain;
}

math::AttentionShape FlashAttentionShape(const GptConfig& c, const GptRunOptions& o) {
  const int64_t D = c.head_dim();
  return math::AttentionShape{o.batch_size,
                              o.seq_len ? o.seq_len : c.max_seq_len,
                              c.num_heads,
                              c.kv_heads(),
                              D,
                              1.0f / std::sqrt(static_cast<float>(D))};
}

math::AttentionTensors FlashAttentionTensors(const GptConfig& c, const ActivationLayout& l,
                                             const ActivationLayout::Block& a, void* arena, bool backward) {
  char* base = static_cast<char*>(arena);
  auto f32 = [&](uint64_t offset) { return reinterpret_cast<float*>(base + offset); };
  const int64_t Q = c.q_dim(), K = c.kv_dim();
  math::AttentionTensors t;
  t.q = f32(a.qkv);
  t.k = t.q + Q;
  t.v = t.q + Q + K;
  t.q_stride = t.kv_stride = c.qkv_dim();
  t.out = f32(a.atty);
  t.out_stride = Q;
  t.lse = f32(a.att);
  if (backward) {
    t.dout = f32(l.dbuf);
    t.delta = f32(l.datt);
    t.dq = f32(l.dqkv);
    t.dk = t.dq + Q;
    t.dv = t.dq + Q + K;
  }
  return t;
}

int64_t LossChunkRows(const GptConfig& c, const GptRunOptions& o) {
  const int64_t BT = o.batch_size * (o.seq_len ? o.seq_len : c.max_seq_len);
  const int64_t V = std::max<int64_t>(1, c.vocab_size);
  int64_t rows = o.loss_chunk_rows;
  if (rows <= 0) {
    rows = static_cast<uint64_t>(BT) * V * 4 <= kLossChunkBytes ? BT : kLossChunkBytes / (V * 4);
    // Chunks of whole multiples of kLossChunkAlign rows: the head's products
    // take a chunk's rows as m and k, and a size off a multiple of 8 runs
    // as pieces (AlignedGemmPieces), one of them a pass over the whole
    // [V, C] gradient for the last few rows.
    if (rows < BT && rows >= kLossChunkAlign) rows = rows / kLossChunkAlign * kLossChunkAlign;
  }
  return std::clamp<int64_t>(rows, 1, std::max<int64_t>(1, BT));
}

bool AttentionInBf16(const GptConfig& c, const GptRunOptions& o) {
  return o.matmul_dtype == DType::kBFloat16 && ResolveAttention(c, o) == AttentionKernel::kFlash;
}

bool QkvInBf16(const GptConfig& c, const GptRunOptions& o) {
  return AttentionInBf16(c, o) && !c.qk_norm && !c.qkv_bias;
}

bool SwiGluInBf16(const GptConfig& c, const GptRunOptions& o) {
  return o.matmul_dtype == DType::kBFloat16 && c.mlp == MlpKind::kSwiGlu && !c.linear_bias;
}

bool ProductInputsInBf16(const GptConfig&, const GptRunOptions& o) { return o.matmul_dtype == DType::kBFloat16; }

ActivationLayout ActivationLayout::For(const GptConfig& c, const GptRunOptions& o) {
  const int64_t B = o.batch_size, T = o.seq_len ? o.seq_len : c.max_seq_len, C = c.embed_dim;
  const int64_t L = c.num_layers, H = c.num_heads, V = c.vocab_size, BT = B * T;
  const int64_t Q = c.q_dim(), S = c.qkv_dim(), I = c.mlp_dim(), FC = c.fc_dim();
  const bool flash = ResolveAttention(c, o) == AttentionKernel::kFlash;
  const bool inputs16 = ProductInputsInBf16(c, o), fch16 = SwiGluInBf16(c, o);
  const bool out16 = AttentionInBf16(c, o), qkv16 = QkvInBf16(c, o);
  const int64_t att_elems = flash ? B * H * T : B * H * T * T;
  ActivationLayout l;
  Planner p;
  l.tokens = p.Take(BT * sizeof(int32_t));
  l.targets = p.Take(BT * sizeof(int32_t));
  l.residual = p.Take(F32Bytes((L + 1) * BT * C));

  Planner set;  // one block's saved tensors
  l.block.ln1 = set.Take(StoredBytes(BT * C, inputs16));
  l.block.ln1_mean = set.Take(F32Bytes(BT));
  l.block.ln1_rstd = set.Take(F32Bytes(BT));
  l.block.qkv = set.Take(StoredBytes(BT * S, qkv16));
  // q and k before their RMSNorm (qk_norm): a copy of qkv, and each head's rstd.
  l.block.qk_pre = c.qk_norm ? set.Take(F32Bytes(BT * S)) : 0;
  l.block.qk_rstd = c.qk_norm ? set.Take(F32Bytes(BT * (H + c.kv_heads()))) : 0;
  l.block.att = set.Take(F32Bytes(att_elems));
  l.block.atty = set.Take(StoredBytes(BT * Q, out16));
  l.block.res_mid = set.Take(F32Bytes(BT * C));
  l.block.ln2 = set.Take(StoredBytes(BT * C, inputs16));
  l.block.ln2_mean = set.Take(F32Bytes(BT));
  l.block.ln2_rstd = set.Take(F32Bytes(BT));
  l.block.fch = set.Take(StoredBytes(BT * FC, fch16));
  l.block.fch_gelu = set.Take(StoredBytes(BT * I, inputs16));
  l.block_stride = set.at();
  l.block_sets = o.activation_checkpointing ? 1 : L;
  l.blocks = p.Take(l.block_stride * static_cast<uint64_t>(l.block_sets));

  l.lnf = p.Take(F32Bytes(BT * C));
  l.lnf_mean = p.Take(F32Bytes(BT));
  l.lnf_rstd = p.Take(F32Bytes(BT));
  l.loss_chunk_rows = LossChunkRows(c, o);
  l.logits_ld = (V + 7) / 8 * 8;
  l.probs = p.Take(F32Bytes(l.loss_chunk_rows * l.logits_ld));
  l.losses = p.Take(F32Bytes(BT));
  l.saved_bytes = p.at();

  l.dres = p.Take(F32Bytes(BT * C));
  l.dbuf = p.Take(F32Bytes(BT * std::max({C, Q, I})));
  l.dqkv = p.Take(F32Bytes(BT * S));
  l.datt = p.Take(F32Bytes(att_elems));
  // dfch also holds, in flash backward, the fp32 values of the q, k, v and O
  // stored in bf16 (the CPU model's widening, the CUDA model's where its
  // flash kernels read fp32).
  l.dfch = p.Take(F32Bytes(BT * std::max(FC, (qkv16 ? S : 0) + (out16 ? Q : 0))));
  l.scratch_bytes = p.at() - l.saved_bytes;

  const int64_t other_units = std::max(BlockLayout::For(c).num_elems, FinalNormLayout::For(c).num_elems);
  if (o.param_dtype != DType::kFloat32) {
    l.wide_embedding = p.Take(F32Bytes(EmbeddingLayout::For(c).num_elems));
    l.wide_unit = p.Take(F32Bytes(other_units));
  }
  if (o.grad_dtype != DType::kFloat32) {
    l.grad_embedding = p.Take(F32Bytes(EmbeddingLayout::For(c).num_elems));
    l.grad_unit = p.Take(F32Bytes(other_units));
  }
  if (o.matmul_dtype == DType::kBFloat16) {
    // Linear layers (activations [B·T, 4C] at most, weights [C, 4C]), the LM
    // head (one loss chunk's logits gradient [loss_chunk_rows, V], wte
    // [V, C]) and, for the plain
    // attention, one batch row's (scores H × T × T, the row's qkv T × 3C);
    // flash attention's copies of qkv [B·T, S] and d(atty) [B·T, Q] fit in
    // the linear layers' size.
    l.bf16_operand_elems = std::max(
        {BT * std::max({FC, S, Q, C}), C * std::max(FC, S), I * C, Q * C, l.loss_chunk_rows * l.logits_ld, V * C});
    if (!flash) l.bf16_operand_elems = std::max({l.bf16_operand_elems, H * T * T, T * S});
    l.bf16_a = p.Take(static_cast<uint64_t>(l.bf16_operand_elems) * 2);
    l.bf16_b = p.Take(static_cast<uint64_t>(l.bf16_operand_elems) * 2);
  }
  l.conversion_bytes = p.at() - l.saved_bytes - l.scratch_bytes;
  l.total_bytes = p.at();
  return l;
}

std::string ActivationLayout::ToString() const {
  return FormatBytes(total_bytes) + " (saved " + FormatBytes(saved_bytes) + ", backward scratch " +
         FormatBytes(scratch_bytes) + ", dtype conversion " + FormatBytes(conversion_bytes) + ")";
}

namespace {

Status CheckMatmulDtype(DType d) {
  if (d == DType::kFloat32 || d == DType::kBFloat16) return Status::Ok();
  return InvalidArgument(std::string("gpt model: matrix products take fp32 or bf16 operands, not ") +
                         std::string(DTypeName(d)));
}

}  // namespace

GptModel::GptModel(const GptConfig& config, const GptRunOptions& options)
    : config_(config),
      options_(options),
      layout_(ActivationLayout::For(config, options)),
      threads_(options.num_threads, options.matmul_dtype) {
  if (config.positions == PositionKind::kRope) rope_ = RopeTable::For(config, options.seq_len);
}

Result<std::unique_ptr<GptModel>> GptModel::Create(const GptConfig& config, const GptRunOptions& options) {
  ZINF_RETURN_IF_ERROR(config.Validate());
  GptRunOptions o = options;
  if (o.seq_len == 0) o.seq_len = config.max_seq_len;
  if (o.batch_size < 1)
    return InvalidArgument("gpt model: batch_size must be >= 1, got " + std::to_string(o.batch_size));
  if (o.seq_len < 1 || o.seq_len > config.max_seq_len) {
    return InvalidArgument("gpt model: seq_len must be in 1.." + std::to_string(config.max_seq_len) + " (the " +
                           config.name + " context length), got " + std::to_string(o.seq_len));
  }
  if (o.num_threads < 1) return InvalidArgument("gpt model: num_threads must be >= 1");
  ZINF_RETURN_IF_ERROR(CheckMatmulDtype(o.matmul_dtype));
  o.attention = ResolveAttention(config, o);
  ZINF_RETURN_IF_ERROR(cpu::OpenBlas().status());  // the CPU products (gemm.cc) need it
  // The LM head's [B·T, V] product and the attention scores are addressed
  // with 32-bit BLAS dimensions.
  if (o.batch_size * o.seq_len > std::numeric_limits<int32_t>::max() / 4) {
    return InvalidArgument("gpt model: batch_size × seq_len is too large");
  }
  UseSingleThreadedBlas();
  return std::unique_ptr<GptModel>(new GptModel(config, o));
}

void GptModel::BindActivations(void* host_arena) {
  ZINF_CHECK(reinterpret_cast<uintptr_t>(host_arena) % kAlign == 0);
  arena_ = static_cast<char*>(host_arena);
}

Status GptModel::CheckArena() const {
  if (!arena_) return FailedPrecondition("gpt model: no activation arena bound (BindActivations)");
  return Status::Ok();
}

const float* GptModel::probabilities() const { return arena_ ? F32(layout_.probs) : nullptr; }

ActivationLayout::Block ActivationLayout::BlockAt(int layer) const {
  const uint64_t base = blocks + (block_sets == 1 ? 0 : block_stride * static_cast<uint64_t>(layer));
  Block b = block;
  for (uint64_t* f : {&b.ln1, &b.ln1_mean, &b.ln1_rstd, &b.qkv, &b.qk_pre, &b.qk_rstd, &b.att, &b.atty, &b.res_mid,
                      &b.ln2, &b.ln2_mean, &b.ln2_rstd, &b.fch, &b.fch_gelu}) {
    *f += base;
  }
  return b;
}

const float* GptModel::Widen(const void* params, int64_t num_elems, uint64_t wide_offset) {
  const DType dtype = options_.param_dtype;
  if (dtype == DType::kFloat32) return static_cast<const float*>(params);
  float* dst = F32(wide_offset);
  const uint16_t* src = static_cast<const uint16_t*>(params);
  threads_.ForChunks(num_elems, kConvertGrain, [&](int64_t i0, int64_t i1) {
    if (dtype == DType::kBFloat16) {
      for (int64_t i = i0; i < i1; ++i) dst[i] = Bf16BitsToFloat(src[i]);
    } else {
      for (int64_t i = i0; i < i1; ++i) dst[i] = HalfBitsToFloat(src[i]);
    }
  });
  return dst;
}

float* GptModel::BeginGrad(void* grad, int64_t num_elems, uint64_t accumulator_offset) {
  const DType dtype = options_.grad_dtype;
  const bool accumulate = options_.accumulate_grads;
  float* acc = dtype == DType::kFloat32 ? static_cast<float*>(grad) : F32(accumulator_offset);
  const uint16_t* src = static_cast<const uint16_t*>(grad);
  threads_.ForChunks(num_elems, kConvertGrain, [&](int64_t i0, int64_t i1) {
    if (!accumulate) {
      std::memset(acc + i0, 0, F32Bytes(i1 - i0));
    } else if (dtype == DType::kBFloat16) {
      for (int64_t i = i0; i < i1; ++i) acc[i] = Bf16BitsToFloat(src[i]);
    } else if (dtype == DType::kFloat16) {
      for (int64_t i = i0; i < i1; ++i) acc[i] = HalfBitsToFloat(src[i]);
    }
  });
  return acc;
}

void GptModel::EndGrad(void* grad, const float* accumulator, int64_t num_elems) {
  const DType dtype = options_.grad_dtype;
  if (dtype == DType::kFloat32) return;
  uint16_t* dst = static_cast<uint16_t*>(grad);
  threads_.ForChunks(num_elems, kConvertGrain, [&](int64_t i0, int64_t i1) {
    if (dtype == DType::kBFloat16) {
      for (int64_t i = i0; i < i1; ++i) dst[i] = FloatToBf16Bits(accumulator[i]);
    } else {
      for (int64_t i = i0; i < i1; ++i) dst[i] = FloatToHalfBits(accumulator[i]);
    }
  });
}

Status GptModel::EmbedForward(const int32_t* tokens, const void* embedding) {
  ZINF_RETURN_IF_ERROR(CheckArena());
  const int64_t B = options_.batch_size, T = options_.seq_len, C = config_.embed_dim, V = config_.vocab_size;
  for (int64_t r = 0; r < B * T; ++r) {
    if (tokens[r] < 0 || tokens[r] >= V) {
      return InvalidArgument("gpt model: token " + std::to_string(tokens[r]) + " at position " + std::to_string(r) +
                             " is outside the vocabulary (V=" + std::to_string(V) + ")");
    }
  }
  std::memcpy(I32(layout_.tokens), tokens, B * T * sizeof(int32_t));
  const EmbeddingLayout e = EmbeddingLayout::For(config_);
  OpProfile* const prof = options_.profile;
  MarkOp(prof, "cast");
  const float* p = Widen(embedding, e.num_elems, layout_.wide_embedding);
  MarkOp(prof, "embedding");
  EncoderForward<float>(threads_, F32(layout_.residual), I32(layout_.tokens), p + e.wte, TensorAt(p, e.wpe), B, T, C);
  EndOps(prof);
  forward_next_ = 0;
  head_forward_done_ = false;
  backward_next_ = -2;
  checkpoint_layer_ = -1;
  return Status::Ok();
}

void GptModel::NormForward(float* out, float* mean, float* rstd, const float* in, const float* w, const float* b) {
  const int64_t BT = options_.batch_size * options_.seq_len, C = config_.embed_dim;
  if (config_.norm == NormKind::kRmsNorm) {
    RmsNormForward<float>(threads_, out, rstd, in, w, RowSet::Dense(BT, C), static_cast<float>(config_.norm_eps));
  } else {
    LayerNormForward<float>(threads_, out, mean, rstd, in, w, b, BT, C);
  }
}

void GptModel::NormBackward(float* dinp, float* gw, float* gb, const float* dout, const float* in, const float* w,
                            const float* mean, const float* rstd) {
  const int64_t BT = options_.batch_size * options_.seq_len, C = config_.embed_dim;
  if (config_.norm == NormKind::kRmsNorm) {
    RmsNormBackward<float>(threads_, dinp, true, gw, dout, in, w, rstd, RowSet::Dense(BT, C));
  } else {
    LayerNormBackward<float>(threads_, dinp, gw, gb, dout, in, w, mean, rstd, BT, C);
  }
}

RowSet GptModel::QueryRows() const {
  const int64_t BT = options_.batch_size * options_.seq_len, H = config_.num_heads;
  return RowSet{BT * H, config_.head_dim(), H, config_.qkv_dim()};
}

RowSet GptModel::KeyRows() const {
  const int64_t BT = options_.batch_size * options_.seq_len, H = config_.kv_heads();
  return RowSet{BT * H, config_.head_dim(), H, config_.qkv_dim()};
}

void GptModel::RunBlockForward(int layer, const float* p) {
  const GptConfig& c = config_;
  const int64_t B = options_.batch_size, T = options_.seq_len, C = c.embed_dim;
  const int64_t BT = B * T, Q = c.q_dim(), S = c.qkv_dim(), I = c.mlp_dim(), FC = c.fc_dim();
  const BlockLayout w = BlockLayout::For(c);
  const ActivationLayout::Block a = layout_.BlockAt(layer);
  const float* in = F32(layout_.residual) + layer * BT * C;
  float* out = F32(layout_.residual) + (layer + 1) * BT * C;
  float* res_mid = F32(a.res_mid);
  OpProfile* const prof = options_.profile;
  // Tensors stored in bf16 (ProductInputsInBf16, SwiGluInBf16, QkvInBf16,
  // AttentionInBf16) are computed in fp32 in backward scratch, which no
  // forward reads and a block's backward writes only after it has computed
  // its forward again: the norms' outputs, O and the activation in dbuf, q,
  // k and v in dqkv, the fc output in dfch. Their bf16 bits are stored once
  // their fp32 values are final.
  const bool inputs16 = ProductInputsInBf16(c, options_), fch16 = SwiGluInBf16(c, options_);
  const bool qkv16 = QkvInBf16(c, options_), out16 = AttentionInBf16(c, options_);
  float* const stage = F32(layout_.dbuf);
  const auto store = [&](uint64_t at, const float* x, int64_t n) {
    MarkOp(prof, "cast");
    StoreBf16(threads_, U16(at), x, n);
  };
  float* const ln1 = inputs16 ? stage : F32(a.ln1);
  float* const qkv = qkv16 ? F32(layout_.dqkv) : F32(a.qkv);
  MarkOp(prof, "norm");
  NormForward(ln1, F32(a.ln1_mean), F32(a.ln1_rstd), in, p + w.ln1_w, TensorAt(p, w.ln1_b));
  MarkOp(prof, "matmul");
  LinearForward<float>(threads_, qkv, ln1, p + w.qkv_w, TensorAt(p, w.qkv_b), BT, C, S);
  if (inputs16) store(a.ln1, ln1, BT * C);
  if (qkv16) RoundToBf16InPlace(threads_, qkv, BT * S);
  if (c.qk_norm) {
    MarkOp(prof, "qk norm");
    float* pre = F32(a.qk_pre);
    threads_.ForChunks(BT * S, kConvertGrain,
                       [&](int64_t i0, int64_t i1) { std::memcpy(pre + i0, qkv + i0, F32Bytes(i1 - i0)); });
    const float eps = static_cast<float>(c.norm_eps);
    RmsNormForward<float>(threads_, qkv, F32(a.qk_rstd), pre, p + w.q_norm_w, QueryRows(), eps);
    RmsNormForward<float>(threads_, qkv + Q, F32(a.qk_rstd) + BT * c.num_heads, pre + Q, p + w.k_norm_w, KeyRows(),
                          eps);
  }
  if (c.positions == PositionKind::kRope) {
    MarkOp(prof, "rope");
    RopeForward<float>(threads_, qkv, QueryRows(), T, rope_);
    RopeForward<float>(threads_, qkv + Q, KeyRows(), T, rope_);
  }
  if (qkv16) RoundAndStoreBf16(threads_, qkv, U16(a.qkv), BT * S);  // rounded again after RoPE
  MarkOp(prof, "attention");
  float* const atty = out16 ? stage : F32(a.atty);
  if (options_.attention == AttentionKernel::kFlash) {
    math::AttentionTensors t = FlashAttentionTensors(c, layout_, a, arena_, false);
    t.q = qkv;
    t.k = qkv + Q;
    t.v = qkv + Q + c.kv_dim();
    t.out = atty;
    FlashAttentionForward(threads_, FlashAttentionShape(c, options_), t);
    if (out16) RoundAndStoreBf16(threads_, atty, U16(a.atty), BT * Q);
  } else {
    AttentionForward<float>(threads_, atty, F32(a.att), qkv, B, T, c.num_heads, c.kv_heads(), c.head_dim());
  }
  MarkOp(prof, "matmul");
  LinearForward<float>(threads_, res_mid, atty, p + w.attn_proj_w, TensorAt(p, w.attn_proj_b), BT, Q, C);
  MarkOp(prof, "residual");
  ResidualForward<float>(threads_, res_mid, in, res_mid, BT * C);
  float* const ln2 = inputs16 ? stage : F32(a.ln2);
  MarkOp(prof, "norm");
  NormForward(ln2, F32(a.ln2_mean), F32(a.ln2_rstd), res_mid, p + w.ln2_w, TensorAt(p, w.ln2_b));
  MarkOp(prof, "matmul");
  float* const fch = fch16 ? F32(layout_.dfch) : F32(a.fch);
  LinearForward<float>(threads_, fch, ln2, p + w.fc_w, TensorAt(p, w.fc_b), BT, C, FC);
  if (inputs16) store(a.ln2, ln2, BT * C);
  MarkOp(prof, "activation");
  if (fch16) RoundAndStoreBf16(threads_, fch, U16(a.fch), BT * FC);
  float* const act = inputs16 ? stage : F32(a.fch_gelu);
  if (c.mlp == MlpKind::kSwiGlu) {
    SwiGluForward<float>(threads_, act, fch, BT, I);
  } else {
    GeluForward<float>(threads_, act, fch, BT * I);
  }
  MarkOp(prof, "matmul");
  LinearForward<float>(threads_, out, act, p + w.fc_proj_w, TensorAt(p, w.fc_proj_b), BT, I, C);
  if (inputs16) store(a.fch_gelu, act, BT * I);
  MarkOp(prof, "residual");
  ResidualForward<float>(threads_, out, res_mid, out, BT * C);
  checkpoint_layer_ = layer;
}

Status GptModel::BlockForward(int layer, const void* block) {
  ZINF_RETURN_IF_ERROR(CheckArena());
  if (forward_next_ < 0 || layer != forward_next_ || layer >= config_.num_layers) {
    return FailedPrecondition(
        "gpt model: BlockForward(" + std::to_string(layer) + ") out of order; expected " +
        (forward_next_ < 0 ? std::string("EmbedForward first") : "block " + std::to_string(forward_next_)));
  }
  MarkOp(options_.profile, "cast");
  RunBlockForward(layer, Widen(block, BlockLayout::For(config_).num_elems, layout_.wide_unit));
  EndOps(options_.profile);
  ++forward_next_;
  return Status::Ok();
}

Result<float> GptModel::HeadForward(const int32_t* targets, const void* final_norm, const void* embedding) {
  ZINF_RETURN_IF_ERROR(CheckArena());
  if (forward_next_ != config_.num_layers) {
    return FailedPrecondition("gpt model: HeadForward before the forward of every block");
  }
  const int64_t B = options_.batch_size, T = options_.seq_len, C = config_.embed_dim, V = config_.vocab_size;
  const int64_t BT = B * T, L = config_.num_layers;
  for (int64_t r = 0; r < BT; ++r) {
    if (targets[r] >= V) {
      return InvalidArgument("gpt model: target " + std::to_string(targets[r]) + " at position " + std::to_string(r) +
                             " is outside the vocabulary (V=" + std::to_string(V) + ")");
    }
  }
  std::memcpy(I32(layout_.targets), targets, BT * sizeof(int32_t));
  const FinalNormLayout f = FinalNormLayout::For(config_);
  const EmbeddingLayout e = EmbeddingLayout::For(config_);
  OpProfile* const prof = options_.profile;
  MarkOp(prof, "cast");
  const float* pf = Widen(final_norm, f.num_elems, layout_.wide_unit);
  const float* head =
      config_.tied_head ? Widen(embedding, e.num_elems, layout_.wide_embedding) + e.wte : pf + f.lm_head;
  float* lnf = F32(layout_.lnf);
  float* probs = F32(layout_.probs);
  MarkOp(prof, "norm");
  NormForward(lnf, F32(layout_.lnf_mean), F32(layout_.lnf_rstd), F32(layout_.residual) + L * BT * C, pf + f.w,
              TensorAt(pf, f.b));
  // The logits and the loss, loss_chunk_rows rows at a time (with several
  // chunks, backward computes each chunk's logits again).
  num_targets_ = 0;
  for (int64_t r0 = 0; r0 < BT; r0 += layout_.loss_chunk_rows) {
    const int64_t rows = std::min(layout_.loss_chunk_rows, BT - r0);
    MarkOp(prof, "matmul");
    ParallelGemm<float>(threads_, false, true, rows, V, C, 1.0f, lnf + r0 * C, C, head, C, 0.0f, probs, V);
    MarkOp(prof, "loss");
    num_targets_ += SoftmaxCrossEntropyForward<float>(threads_, probs, F32(layout_.losses) + r0, probs,
                                                      I32(layout_.targets) + r0, rows, V);
  }
  double sum = 0;
  const float* losses = F32(layout_.losses);
  for (int64_t r = 0; r < BT; ++r) sum += losses[r];
  EndOps(prof);
  head_forward_done_ = true;
  return num_targets_ ? static_cast<float>(sum / static_cast<double>(num_targets_)) : 0.0f;
}

Status GptModel::HeadBackward(float loss_scale, const void* final_norm, const void* embedding, void* final_norm_grad,
                              void* embedding_grad) {
  ZINF_RETURN_IF_ERROR(CheckArena());
  if (!head_forward_done_ || backward_next_ != -2) {
    return FailedPrecondition("gpt model: HeadBackward needs a completed forward (HeadForward) first");
  }
  const int64_t B = options_.batch_size, T = options_.seq_len, C = config_.embed_dim, V = config_.vocab_size;
  const int64_t BT = B * T, L = config_.num_layers;
  const FinalNormLayout f = FinalNormLayout::For(config_);
  const EmbeddingLayout e = EmbeddingLayout::For(config_);
  OpProfile* const prof = options_.profile;
  MarkOp(prof, "cast");
  const float* pf = Widen(final_norm, f.num_elems, layout_.wide_unit);
  const float* head =
      config_.tied_head ? Widen(embedding, e.num_elems, layout_.wide_embedding) + e.wte : pf + f.lm_head;
  MarkOp(prof, "gradient init");
  float* gf = BeginGrad(final_norm_grad, f.num_elems, layout_.grad_unit);
  embedding_grad32_ = BeginGrad(embedding_grad, e.num_elems, layout_.grad_embedding);
  float* ghead = config_.tied_head ? embedding_grad32_ + e.wte : gf + f.lm_head;
  float* dlogits = F32(layout_.probs);  // in place over the probabilities
  const float scale = num_targets_ ? loss_scale / static_cast<float>(num_targets_) : 0.0f;
  float* dlnf = F32(layout_.dbuf);
  const float* lnf = F32(layout_.lnf);
  const bool chunked = layout_.loss_chunk_rows < BT;
  for (int64_t r0 = 0; r0 < BT; r0 += layout_.loss_chunk_rows) {
    const int64_t rows = std::min(layout_.loss_chunk_rows, BT - r0);
    if (chunked) {  // this chunk's probabilities again (forward kept the last chunk's only)
      MarkOp(prof, "matmul");
      ParallelGemm<float>(threads_, false, true, rows, V, C, 1.0f, lnf + r0 * C, C, head, C, 0.0f, dlogits, V);
      MarkOp(prof, "loss");
      SoftmaxCrossEntropyForward<float>(threads_, dlogits, F32(layout_.losses) + r0, dlogits, I32(layout_.targets) + r0,
                                        rows, V);
    }
    MarkOp(prof, "loss");
    SoftmaxCrossEntropyBackward<float>(threads_, dlogits, dlogits, I32(layout_.targets) + r0, rows, V, scale);
    MarkOp(prof, "matmul");
    ParallelGemm<float>(threads_, false, false, rows, C, V, 1.0f, dlogits, V, head, C, 0.0f, dlnf + r0 * C, C);
    ParallelGemm<float>(threads_, true, false, V, C, rows, 1.0f, dlogits, V, lnf + r0 * C, C, 1.0f, ghead, C);
  }
  float* dres = F32(layout_.dres);
  MarkOp(prof, "norm");
  threads_.ForChunks(BT * C, kConvertGrain,
                     [&](int64_t i0, int64_t i1) { std::memset(dres + i0, 0, F32Bytes(i1 - i0)); });
  NormBackward(dres, gf + f.w, TensorAt(gf, f.b), dlnf, F32(layout_.residual) + L * BT * C, pf + f.w,
               F32(layout_.lnf_mean), F32(layout_.lnf_rstd));
  MarkOp(prof, "cast");
  EndGrad(final_norm_grad, gf, f.num_elems);
  EndOps(prof);
  head_forward_done_ = false;
  backward_next_ = static_cast<int>(L) - 1;
  return Status::Ok();
}

void GptModel::LinearBackwardFrom(float* dinp, float* dw, float* dbias, const float* dout, uint64_t inp, bool inp16,
                                  const float* w, int64_t in_dim, int64_t out_dim) {
  const int64_t rows = options_.batch_size * options_.seq_len;
  if (inp16) {
    LinearBackward(threads_, dinp, false, dw, dbias, dout, U16(inp), w, rows, in_dim, out_dim);
  } else {
    LinearBackward<float>(threads_, dinp, false, dw, dbias, dout, F32(inp), w, rows, in_dim, out_dim);
  }
}

Status GptModel::BlockBackward(int layer, const void* block, void* block_grad) {
  ZINF_RETURN_IF_ERROR(CheckArena());
  if (backward_next_ < 0 || layer != backward_next_) {
    return FailedPrecondition(
        "gpt model: BlockBackward(" + std::to_string(layer) + ") out of order; expected " +
        (backward_next_ < 0 ? std::string("HeadBackward first") : "block " + std::to_string(backward_next_)));
  }
  const GptConfig& c = config_;
  const int64_t B = options_.batch_size, T = options_.seq_len, C = c.embed_dim;
  const int64_t BT = B * T, Q = c.q_dim(), S = c.qkv_dim(), I = c.mlp_dim(), FC = c.fc_dim();
  const BlockLayout w = BlockLayout::For(c);
  OpProfile* const prof = options_.profile;
  MarkOp(prof, "cast");
  const float* p = Widen(block, w.num_elems, layout_.wide_unit);
  if (options_.activation_checkpointing && checkpoint_layer_ != layer) RunBlockForward(layer, p);
  MarkOp(prof, "gradient init");
  float* g = BeginGrad(block_grad, w.num_elems, layout_.grad_unit);
  const ActivationLayout::Block a = layout_.BlockAt(layer);
  const float* in = F32(layout_.residual) + layer * BT * C;
  float* dres = F32(layout_.dres);  // d(block output) on entry, d(block input) on exit
  float* dbuf = F32(layout_.dbuf);
  float* dfch = F32(layout_.dfch);
  float* dqkv = F32(layout_.dqkv);
  const bool inputs16 = ProductInputsInBf16(c, options_);
  // MLP: out = res_mid + fc_proj(act(fc(norm2(res_mid)))).
  if (c.mlp == MlpKind::kSwiGlu) {
    MarkOp(prof, "matmul");
    LinearBackwardFrom(dbuf, g + w.fc_proj_w, TensorAt(g, w.fc_proj_b), dres, a.fch_gelu, inputs16, p + w.fc_proj_w, I,
                       C);
    MarkOp(prof, "activation");
    if (SwiGluInBf16(c, options_)) {
      RoundToBf16InPlace(threads_, dbuf, BT * I);
      SwiGluBackward(threads_, dfch, U16(a.fch), dbuf, BT, I);
    } else {
      SwiGluBackward<float>(threads_, dfch, F32(a.fch), dbuf, BT, I);
    }
  } else {
    MarkOp(prof, "matmul");
    LinearBackwardFrom(dfch, g + w.fc_proj_w, TensorAt(g, w.fc_proj_b), dres, a.fch_gelu, inputs16, p + w.fc_proj_w, I,
                       C);
    MarkOp(prof, "activation");
    GeluBackward<float>(threads_, dfch, F32(a.fch), dfch, BT * I);
  }
  MarkOp(prof, "matmul");
  LinearBackwardFrom(dbuf, g + w.fc_w, TensorAt(g, w.fc_b), dfch, a.ln2, inputs16, p + w.fc_w, C, FC);
  MarkOp(prof, "norm");
  NormBackward(dres, g + w.ln2_w, TensorAt(g, w.ln2_b), dbuf, F32(a.res_mid), p + w.ln2_w, F32(a.ln2_mean),
               F32(a.ln2_rstd));
  // Attention: res_mid = in + attn_proj(attention(rope(qk_norm(qkv(norm1(in)))))).
  MarkOp(prof, "matmul");
  const bool qkv16 = QkvInBf16(c, options_), out16 = AttentionInBf16(c, options_);
  LinearBackwardFrom(dbuf, g + w.attn_proj_w, TensorAt(g, w.attn_proj_b), dres, a.atty, out16, p + w.attn_proj_w, Q, C);
  MarkOp(prof, "attention");
  if (out16) RoundToBf16InPlace(threads_, dbuf, BT * Q);
  if (options_.attention == AttentionKernel::kFlash) {
    math::AttentionTensors t = FlashAttentionTensors(c, layout_, a, arena_, true);
    // q, k, v and O stored in bf16, widened into dfch (free after the MLP's backward).
    float* widened = F32(layout_.dfch);
    if (qkv16) {
      WidenBf16(threads_, widened, U16(a.qkv), BT * S);
      t.q = widened;
      t.k = widened + Q;
      t.v = widened + Q + c.kv_dim();
      widened += BT * S;
    }
    if (out16) {
      WidenBf16(threads_, widened, U16(a.atty), BT * Q);
      t.out = widened;
    }
    FlashAttentionBackward(threads_, FlashAttentionShape(c, options_), t);
    if (QkvInBf16(c, options_)) RoundToBf16InPlace(threads_, dqkv, BT * S);
  } else {
    AttentionBackward<float>(threads_, dqkv, F32(layout_.datt), dbuf, F32(a.qkv), F32(a.att), B, T, c.num_heads,
                             c.kv_heads(), c.head_dim());
  }
  if (c.positions == PositionKind::kRope) {
    MarkOp(prof, "rope");
    RopeBackward<float>(threads_, dqkv, QueryRows(), T, rope_);
    RopeBackward<float>(threads_, dqkv + Q, KeyRows(), T, rope_);
    if (QkvInBf16(c, options_)) RoundToBf16InPlace(threads_, dqkv, BT * S);
  }
  if (c.qk_norm) {
    MarkOp(prof, "qk norm");
    const float* pre = F32(a.qk_pre);
    RmsNormBackward<float>(threads_, dqkv, false, g + w.q_norm_w, dqkv, pre, p + w.q_norm_w, F32(a.qk_rstd),
                           QueryRows());
    RmsNormBackward<float>(threads_, dqkv + Q, false, g + w.k_norm_w, dqkv + Q, pre + Q, p + w.k_norm_w,
                           F32(a.qk_rstd) + BT * c.num_heads, KeyRows());
  }
  MarkOp(prof, "matmul");
  LinearBackwardFrom(dbuf, g + w.qkv_w, TensorAt(g, w.qkv_b), dqkv, a.ln1, inputs16, p + w.qkv_w, C, S);
  MarkOp(prof, "norm");
  NormBackward(dres, g + w.ln1_w, TensorAt(g, w.ln1_b), dbuf, in, p + w.ln1_w, F32(a.ln1_mean), F32(a.ln1_rstd));
  MarkOp(prof, "cast");
  EndGrad(block_grad, g, w.num_elems);
  EndOps(prof);
  --backward_next_;
  return Status::Ok();
}

Status GptModel::EmbedBackward(void* embedding_grad) {
  ZINF_RETURN_IF_ERROR(CheckArena());
  if (backward_next_ != -1) {
    return FailedPrecondition("gpt model: EmbedBackward before the backward of every block");
  }
  const int64_t B = options_.batch_size, T = options_.seq_len, C = config_.embed_dim;
  const EmbeddingLayout e = EmbeddingLayout::For(config_);
  OpProfile* const prof = options_.profile;
  MarkOp(prof, "embedding");
  EncoderBackward<float>(threads_, embedding_grad32_ + e.wte, TensorAt(embedding_grad32_, e.wpe), F32(layout_.dres),
                         I32(layout_.tokens), B, T, C);
  MarkOp(prof, "cast");
  EndGrad(embedding_grad, embedding_grad32_, e.num_elems);
  EndOps(prof);
  embedding_grad32_ = nullptr;
  backward_next_ = -3;
  forward_next_ = -1;
  return Status::Ok();
}

Result<float> GptModel::Forward(const int32_t* tokens, const int32_t* targets,
                                std::span<const void* const> unit_params) {
  if (static_cast<int>(unit_params.size()) != NumUnits(config_)) {
    return InvalidArgument("gpt model: Forward needs " + std::to_string(NumUnits(config_)) +
                           " unit parameter buffers, got " + std::to_string(unit_params.size()));
  }
  ZINF_RETURN_IF_ERROR(EmbedForward(tokens, unit_params[EmbeddingUnit()]));
  for (int l = 0; l < config_.num_layers; ++l) ZINF_RETURN_IF_ERROR(BlockForward(l, unit_params[BlockUnit(l)]));
  return HeadForward(targets, unit_params[FinalNormUnit(config_)], unit_params[EmbeddingUnit()]);
}

Status GptModel::Backward(std::span<const void* const> unit_params, std::span<void* const> unit_grads,
                          float loss_scale) {
  const int n = NumUnits(config_);
  if (static_cast<int>(unit_params.size()) != n || static_cast<int>(unit_grads.size()) != n) {
    return InvalidArgument("gpt model: Backward needs " + std::to_string(n) + " unit parameter and gradient buffers");
  }
  const int fin = FinalNormUnit(config_), emb = EmbeddingUnit();
  ZINF_RETURN_IF_ERROR(HeadBackward(loss_scale, unit_params[fin], unit_params[emb], unit_grads[fin], unit_grads[emb]));
  for (int l = static_cast<int>(config_.num_layers) - 1; l >= 0; --l) {
    ZINF_RETURN_IF_ERROR(BlockBackward(l, unit_params[BlockUnit(l)], unit_grads[BlockUnit(l)]));
  }
  return EmbedBackward(unit_grads[emb]);
}

}  // namespace zinf::model
