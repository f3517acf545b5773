// GptModel end to end on host buffers: loss and every gradient against the
// double-precision reference (gpt_reference.h), independence of the thread
// count and of activation checkpointing (bit for bit), 16-bit parameters and
// gradients, accumulation, memorising a fixed batch, and the stage order.
#include "model/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/float16.h"
#include "gpt_reference.h"
#include "math/decoder_math.h"
#include "model/flash_attention.h"
#include "model/gemm.h"
#include "model/layers.h"
#include "model_test_util.h"

namespace zinf::model {
namespace {

using test::ConstPtrs;
using test::MakeGrads;
using test::MakeModel;
using test::MakeParams;
using test::Ptrs;
using test::RandomTokens;
using test::Step;
using test::Tiny;

std::vector<std::vector<double>> ToDouble(const std::vector<std::vector<float>>& units) {
  std::vector<std::vector<double>> d;
  for (const auto& u : units) d.emplace_back(u.begin(), u.end());
  return d;
}

struct ReferenceCase {
  const char* name;
  GptConfig config;
  int64_t batch, seq_len;
  bool checkpointing;
};

GptConfig Odd() {
  // Sizes that are not multiples of 16 (the kernels' lane count), three
  // heads, a sequence shorter than the context.
  GptConfig c;
  c.name = "odd";
  c.vocab_size = 67;
  c.max_seq_len = 13;
  c.num_layers = 1;
  c.num_heads = 3;
  c.embed_dim = 24;
  return c;
}

class GptReferenceTest : public ::testing::TestWithParam<ReferenceCase> {};

// fp32 against double: the loss to 1e-5 relative; each gradient tensor to
// 1e-4 of its largest magnitude (the fp32 rounding of sums over at most a
// few hundred terms of mixed sign gives about 1e-6 of that scale — see the
// recorded max errors; a wrong term is off by O(1) of it).
TEST_P(GptReferenceTest, LossAndAllGradientsMatchDoublePrecisionReference) {
  const ReferenceCase& rc = GetParam();
  const GptConfig& c = rc.config;
  const int64_t BT = rc.batch * rc.seq_len;
  auto params = MakeParams(c, 11);
  auto tokens = RandomTokens(BT, c.vocab_size, 12);
  auto targets = RandomTokens(BT, c.vocab_size, 13);
  targets[3] = -1;  // ignored position

  GptRunOptions o;
  o.batch_size = rc.batch;
  o.seq_len = rc.seq_len;
  o.activation_checkpointing = rc.checkpointing;
  auto model = MakeModel(c, o);
  auto grads = MakeGrads<float>(c, 42.0f);  // overwritten
  const float loss = Step(*model, params, grads, tokens, targets);

  test::GptReference ref(c, rc.batch, rc.seq_len);
  const double ref_loss = ref.Forward(tokens, targets, ToDouble(params));
  std::vector<std::vector<double>> ref_grads;
  ref.Backward(ref_grads);

  EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);
  double worst = 0;
  for (int unit = 0; unit < NumUnits(c); ++unit) {
    for (const UnitTensor& t : UnitTensors(c, unit)) {
      double scale = 0, err = 0;
      for (int64_t i = 0; i < t.num_elems(); ++i) {
        const int64_t k = t.offset_elems + i;
        scale = std::max(scale, std::abs(ref_grads[unit][k]));
        err = std::max(err, std::abs(grads[unit][k] - ref_grads[unit][k]));
      }
      ASSERT_GT(scale, 0.0) << "unit " << unit << " " << t.name << ": the reference gradient is all zero";
      EXPECT_LE(err, 1e-5 * scale) << "unit " << unit << " " << t.name << ": max error " << err << " of scale "
                                   << scale;
      worst = std::max(worst, err / scale);
    }
  }
  RecordProperty("loss_rel_err", std::to_string(std::abs(loss - ref_loss) / ref_loss));
  RecordProperty("grad_max_rel_err", std::to_string(worst));
  std::printf("  loss %.8f vs %.8f (rel %.2e); worst gradient error %.2e of its tensor's scale\n", loss, ref_loss,
              std::abs(loss - ref_loss) / ref_loss, worst);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GptReferenceTest,
                         ::testing::Values(ReferenceCase{"tiny", Tiny(), 2, 16, false},
                                           ReferenceCase{"tiny_checkpointed", Tiny(), 2, 16, true},
                                           ReferenceCase{"odd_sizes", Odd(), 3, 11, false}),
                         [](const auto& p) { return std::string(p.param.name); });

// Enough rows, columns and vocabulary that ParallelGemm uses several tiles
// and the row/column kernels several chunks.
GptConfig Chunky() {
  GptConfig c;
  c.name = "chunky";
  c.vocab_size = 1000;
  c.max_seq_len = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.embed_dim = 64;
  return c;
}

struct StepResult {
  float loss;
  std::vector<std::vector<float>> grads;
};

StepResult RunStep(const GptConfig& c, GptRunOptions o, uint64_t seed = 5) {
  auto params = MakeParams(c, seed);
  const int64_t BT = o.batch_size * (o.seq_len ? o.seq_len : c.max_seq_len);
  auto tokens = RandomTokens(BT, c.vocab_size, seed + 1), targets = RandomTokens(BT, c.vocab_size, seed + 2);
  auto model = MakeModel(c, o);
  StepResult r{0, MakeGrads<float>(c)};
  r.loss = Step(*model, params, r.grads, tokens, targets);
  return r;
}

// ‖a - b‖ / ‖b‖.
double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

void ExpectBitIdentical(const StepResult& a, const StepResult& b) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(float)), 0) << a.loss << " vs " << b.loss;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t u = 0; u < a.grads.size(); ++u) {
    EXPECT_EQ(std::memcmp(a.grads[u].data(), b.grads[u].data(), a.grads[u].size() * sizeof(float)), 0)
        << "unit " << u << " differs";
  }
}

TEST(GptModelTest, ResultsDoNotDependOnTheThreadCount) {
  GptRunOptions o;
  o.batch_size = 8;  // 768 rows: two row tiles in every product
  o.num_threads = 1;
  const StepResult one = RunStep(Chunky(), o);
  for (int threads : {2, 3}) {
    SCOPED_TRACE("threads=" + std::to_string(threads));
    o.num_threads = threads;
    ExpectBitIdentical(one, RunStep(Chunky(), o));
  }
}

// bf16 matmul operands: still independent of the thread count, close to
// the fp32 model (bf16 keeps 8 significant bits: relative errors near
// 2^-9 per operand, averaging out over the sums) and not equal to it.
TEST(GptModelTest, Bf16MatmulIsThreadCountInvariantAndNearFp32) {
  GptRunOptions o;
  o.batch_size = 8;
  o.num_threads = 2;
  const StepResult fp32 = RunStep(Chunky(), o);
  o.matmul_dtype = DType::kBFloat16;
  const StepResult two = RunStep(Chunky(), o);
  o.num_threads = 1;
  ExpectBitIdentical(two, RunStep(Chunky(), o));
  o.num_threads = 3;
  ExpectBitIdentical(two, RunStep(Chunky(), o));
  EXPECT_NE(two.loss, fp32.loss);
  EXPECT_NEAR(two.loss, fp32.loss, 1e-2 * std::fabs(fp32.loss));
  for (size_t u = 0; u < fp32.grads.size(); ++u) {
    const double rel = RelativeDifference(two.grads[u], fp32.grads[u]);
    std::printf("  unit %zu: bf16-matmul gradient relative difference %.3g\n", u, rel);
    EXPECT_GT(rel, 0.0) << "unit " << u;
    EXPECT_LT(rel, 5e-2) << "unit " << u;
  }
}

// One step (forward and backward) of the CPU model, keeping its activation
// arena as the step left it, to look at the tensors it holds.
struct SteppedArena {
  test::Arena arena;
  ActivationLayout layout;
  std::vector<std::vector<float>> params;  // the step's, per unit
  const float* F32(uint64_t offset) const {
    return reinterpret_cast<const float*>(static_cast<const char*>(arena.get()) + offset);
  }
  const uint16_t* Bf16(uint64_t offset) const {
    return reinterpret_cast<const uint16_t*>(static_cast<const char*>(arena.get()) + offset);
  }
  // Elements [from, to) of the float tensor at `offset` that are not bf16 values.
  int64_t NotBf16(uint64_t offset, int64_t from, int64_t to) const {
    const float* x = reinterpret_cast<const float*>(static_cast<const char*>(arena.get()) + offset);
    int64_t n = 0;
    for (int64_t i = from; i < to; ++i) n += FloatToBits(RoundToBf16(x[i])) != FloatToBits(x[i]);
    return n;
  }
};
// The options of those steps: two batch rows, two threads.
GptRunOptions StepOptions(DType matmul, AttentionKernel attention = AttentionKernel::kAuto) {
  GptRunOptions o;
  o.batch_size = 2;
  o.num_threads = 2;
  o.matmul_dtype = matmul;
  o.attention = attention;
  return o;
}
SteppedArena StepKeepingTheArena(const GptConfig& c, const GptRunOptions& o, uint64_t seed) {
  auto model = MakeModel(c, o);
  SteppedArena r{test::MakeArena(model->activation_bytes()), ActivationLayout::For(c, model->options()),
                 MakeParams(c, seed)};
  model->BindActivations(r.arena.get());
  const auto& params = r.params;
  auto grads = MakeGrads<float>(c);
  const int64_t BT = o.batch_size * c.max_seq_len;
  auto tokens = RandomTokens(BT, c.vocab_size, seed + 1), targets = RandomTokens(BT, c.vocab_size, seed + 2);
  EXPECT_TRUE(model->Forward(tokens.data(), targets.data(), ConstPtrs(params)).ok());
  EXPECT_TRUE(model->Backward(ConstPtrs(params), Ptrs(grads)).ok());
  return r;
}

// With bf16 products, a SwiGLU MLP without biases keeps its fc output and
// its activation's gradient as bf16 values (SwiGluInBf16), as the CUDA
// model's products write them, the fc output stored as bf16; with fp32
// products, or with an fc bias (whose sum is not a product's output), it
// keeps fp32 values. Checked in the arena after a step: the last block's fc
// output (bf16 bits in a place of their size, from which the activation
// stored after it is computed), and the rows of the activation gradient
// (block 0's, in dbuf) that the products after it did not overwrite (those
// write [B·T, max(C, Q)] floats, the gradient is [B·T, I]).
TEST(GptModelTest, SwiGluMlpKeepsBf16ValuesWithBf16Products) {
  struct Case {
    DType matmul;
    bool bias, rounded;
  };
  for (const Case& k : {Case{DType::kBFloat16, false, true}, Case{DType::kFloat32, false, false},
                        Case{DType::kBFloat16, true, false}}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(k.matmul) << (k.bias ? ", biases" : ""));
    GptConfig c = std::move(GptPreset("tiny-llama")).value();
    c.linear_bias = k.bias;
    const GptRunOptions o = StepOptions(k.matmul);
    EXPECT_EQ(SwiGluInBf16(c, o), k.rounded);
    const SteppedArena a = StepKeepingTheArena(c, o, 41);
    const int64_t BT = 2 * c.max_seq_len, C = c.embed_dim, I = c.mlp_dim();
    const int64_t overwritten = BT * std::max(C, c.q_dim());
    ASSERT_LT(overwritten, BT * I);
    const ActivationLayout::Block last = a.layout.BlockAt(c.num_layers - 1);
    const int64_t dact = a.NotBf16(a.layout.dbuf, overwritten, BT * I);
    if (k.rounded) {
      EXPECT_EQ(last.fch_gelu - last.fch, static_cast<uint64_t>(BT * c.fc_dim() * 2));
      const uint16_t* fch = a.Bf16(last.fch);
      const uint16_t* act = a.Bf16(last.fch_gelu);  // ProductInputsInBf16
      int64_t wrong = 0;
      for (int64_t r = 0; r < BT; ++r) {
        for (int64_t i = 0; i < I; ++i) {
          const float gate = Bf16BitsToFloat(fch[r * 2 * I + i]), up = Bf16BitsToFloat(fch[r * 2 * I + I + i]);
          wrong += act[r * I + i] != FloatToBf16Bits(math::SwiGlu(gate, up));
        }
      }
      EXPECT_EQ(wrong, 0);
      EXPECT_EQ(dact, 0);
    } else {
      EXPECT_EQ(last.fch_gelu - last.fch, static_cast<uint64_t>(BT * c.fc_dim() * 4));
      EXPECT_GT(a.NotBf16(last.fch, 0, BT * c.fc_dim()), BT * c.fc_dim() / 2);
      EXPECT_GT(dact, (BT * I - overwritten) / 2);
    }
  }
}

// With bf16 products and flash attention, the attention's output O and its
// gradient dO are kept as bf16 values (AttentionInBf16), as the CUDA
// model's flash forward and attn_proj product write them, and flash
// backward's δ sums those; O is stored as bf16. With the plain attention or
// fp32 products they stay fp32. Checked in the arena after a step: the last
// block's O (bf16: the rounding of flash attention over the q, k, v the
// block stored), and block 0's dO in dbuf past the [B·T, C] the qkv
// product's input gradient wrote over it (heads of 16, so that Q = 2C).
TEST(GptModelTest, FlashAttentionKeepsBf16OutputsWithBf16Products) {
  struct Case {
    DType matmul;
    AttentionKernel attention;
    bool rounded;
  };
  for (const Case& k :
       {Case{DType::kBFloat16, AttentionKernel::kFlash, true}, Case{DType::kBFloat16, AttentionKernel::kPlain, false},
        Case{DType::kFloat32, AttentionKernel::kFlash, false}}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(k.matmul) << ", " << AttentionKernelName(k.attention));
    GptConfig c = std::move(GptPreset("tiny-llama")).value();
    c.head_dim_size = 2 * c.embed_dim / c.num_heads;
    const GptRunOptions o = StepOptions(k.matmul, k.attention);
    EXPECT_EQ(AttentionInBf16(c, o), k.rounded);
    const SteppedArena a = StepKeepingTheArena(c, o, 51);
    const int64_t BT = 2 * c.max_seq_len, C = c.embed_dim, Q = c.q_dim();
    ASSERT_EQ(Q, 2 * C);
    const ActivationLayout::Block last = a.layout.BlockAt(c.num_layers - 1);
    const int64_t dout = a.NotBf16(a.layout.dbuf, BT * C, BT * Q);
    if (k.rounded) {
      EXPECT_EQ(last.res_mid - last.atty, static_cast<uint64_t>(BT * Q * 2));
      ASSERT_TRUE(QkvInBf16(c, o));
      const int64_t S = c.qkv_dim();
      std::vector<float> qkv(BT * S), out(BT * Q), lse(BT * c.num_heads);
      for (int64_t i = 0; i < BT * S; ++i) qkv[i] = Bf16BitsToFloat(a.Bf16(last.qkv)[i]);
      math::AttentionTensors t;
      t.q = qkv.data();
      t.k = t.q + Q;
      t.v = t.k + c.kv_dim();
      t.q_stride = t.kv_stride = S;
      t.out = out.data();
      t.out_stride = Q;
      t.lse = lse.data();
      FlashAttentionForward(ModelThreads(1, DType::kBFloat16), FlashAttentionShape(c, o), t);
      int64_t wrong = 0;
      for (int64_t i = 0; i < BT * Q; ++i) wrong += a.Bf16(last.atty)[i] != FloatToBf16Bits(out[i]);
      EXPECT_EQ(wrong, 0);
      EXPECT_EQ(dout, 0);
    } else {
      EXPECT_EQ(last.res_mid - last.atty, static_cast<uint64_t>(BT * Q * 4));
      EXPECT_GT(a.NotBf16(last.atty, 0, BT * Q), BT * Q / 2);
      EXPECT_GT(dout, BT * (Q - C) / 2);
    }
  }
}

// With bf16 products and flash attention, the fused q, k, v and their
// gradient are kept as bf16 values (QkvInBf16: rounded after the product,
// or the attention's backward, and after RoPE), as the CUDA model's kernels
// write them, q, k and v stored as bf16; not with the plain attention, fp32
// products, a qkv bias or a q/k norm. Checked in the arena after a step: the
// last block's qkv (bf16: its norm output's product, rounded, rotated and
// rounded again), and block 0's d(qkv), which the step's last products read.
TEST(GptModelTest, QkvKeepsBf16ValuesWithBf16ProductsAndFlashAttention) {
  struct Case {
    DType matmul;
    AttentionKernel attention;
    bool qkv_bias, qk_norm, rounded;
  };
  for (const Case& k : {Case{DType::kBFloat16, AttentionKernel::kFlash, false, false, true},
                        Case{DType::kBFloat16, AttentionKernel::kPlain, false, false, false},
                        Case{DType::kFloat32, AttentionKernel::kFlash, false, false, false},
                        Case{DType::kBFloat16, AttentionKernel::kFlash, true, false, false},
                        Case{DType::kBFloat16, AttentionKernel::kFlash, false, true, false}}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(k.matmul) << ", " << AttentionKernelName(k.attention)
                                      << (k.qkv_bias ? ", qkv bias" : "") << (k.qk_norm ? ", q/k norm" : ""));
    GptConfig c = std::move(GptPreset("tiny-llama")).value();
    c.qkv_bias = k.qkv_bias;
    c.qk_norm = k.qk_norm;
    const GptRunOptions o = StepOptions(k.matmul, k.attention);
    EXPECT_EQ(QkvInBf16(c, o), k.rounded);
    const SteppedArena a = StepKeepingTheArena(c, o, 61);
    const int64_t BT = 2 * c.max_seq_len, S = c.qkv_dim();
    const ActivationLayout::Block last = a.layout.BlockAt(c.num_layers - 1);
    const int64_t dqkv = a.NotBf16(a.layout.dqkv, 0, BT * S);
    if (k.rounded) {
      EXPECT_EQ(last.att - last.qkv, static_cast<uint64_t>(BT * S * 2));
      const ModelThreads th(1, DType::kBFloat16);
      const float* w = a.params[c.num_layers].data() + BlockLayout::For(c).qkv_w;
      std::vector<float> qkv(BT * S);
      ParallelGemmBf16A(th, false, false, BT, S, c.embed_dim, 1.0f, a.Bf16(last.ln1), c.embed_dim, w, S, 0.0f,
                        qkv.data(), S);
      for (float& x : qkv) x = RoundToBf16(x);
      const RopeTable rope = RopeTable::For(c, c.max_seq_len);
      const int64_t D = c.head_dim();
      RopeForward<float>(th, qkv.data(), RowSet{BT * c.num_heads, D, c.num_heads, S}, c.max_seq_len, rope);
      RopeForward<float>(th, qkv.data() + c.q_dim(), RowSet{BT * c.kv_heads(), D, c.kv_heads(), S}, c.max_seq_len,
                         rope);
      int64_t wrong = 0;
      for (int64_t i = 0; i < BT * S; ++i) wrong += a.Bf16(last.qkv)[i] != FloatToBf16Bits(qkv[i]);
      EXPECT_EQ(wrong, 0);
      EXPECT_EQ(dqkv, 0);
    } else {
      EXPECT_GT(a.NotBf16(last.qkv, 0, BT * S), BT * S / 4);
      EXPECT_GT(dqkv, BT * S / 4);
    }
  }
}

// With bf16 products a block's norm outputs and MLP activation are stored
// as bf16 (ProductInputsInBf16): each block's places shrink by half of
// their fp32 bytes, and what they hold after a step is the rounding of the
// norms and the activation computed from the tensors the block kept
// (checked on the last block, RMSNorm + SwiGLU and LayerNorm + GELU).
TEST(GptModelTest, ProductInputsAreStoredAsTheirBf16Rounding) {
  for (const bool llama : {true, false}) {
    SCOPED_TRACE(llama ? "tiny-llama" : "chunky");
    const GptConfig c = llama ? std::move(GptPreset("tiny-llama")).value() : Chunky();
    const AttentionKernel attention = llama ? AttentionKernel::kFlash : AttentionKernel::kPlain;
    const GptRunOptions o = StepOptions(DType::kBFloat16, attention);
    ASSERT_TRUE(ProductInputsInBf16(c, o));
    EXPECT_FALSE(ProductInputsInBf16(c, StepOptions(DType::kFloat32, attention)));
    const int64_t BT = 2 * c.max_seq_len, C = c.embed_dim, I = c.mlp_dim(), FC = c.fc_dim();
    const ActivationLayout fp32 = ActivationLayout::For(c, StepOptions(DType::kFloat32, attention));
    const SteppedArena a = StepKeepingTheArena(c, o, 71);
    // The fc output (SwiGluInBf16), q, k, v (QkvInBf16) and O
    // (AttentionInBf16) too, with the Llama's flash attention.
    const int64_t also = (SwiGluInBf16(c, o) ? BT * FC * 2 : 0) + (QkvInBf16(c, o) ? BT * c.qkv_dim() * 2 : 0) +
                         (AttentionInBf16(c, o) ? BT * c.q_dim() * 2 : 0);
    EXPECT_EQ(llama, also > 0);
    EXPECT_EQ(fp32.block_stride - a.layout.block_stride, static_cast<uint64_t>((2 * BT * C + BT * I) * 2 + also));

    const int layer = c.num_layers - 1;
    const ActivationLayout::Block b = a.layout.BlockAt(layer);
    const BlockLayout w = BlockLayout::For(c);
    const float* p = a.params[layer + 1].data();
    const ModelThreads th(1);
    const auto norm = [&](const float* in, const float* gain, const float* bias) {
      std::vector<float> out(BT * C), mean(BT), rstd(BT);
      if (c.norm == NormKind::kRmsNorm) {
        RmsNormForward<float>(th, out.data(), rstd.data(), in, gain, RowSet::Dense(BT, C),
                              static_cast<float>(c.norm_eps));
      } else {
        LayerNormForward<float>(th, out.data(), mean.data(), rstd.data(), in, gain, bias, BT, C);
      }
      return out;
    };
    const auto mismatches = [](const uint16_t* stored, const std::vector<float>& values) {
      int64_t n = 0;
      for (size_t i = 0; i < values.size(); ++i) n += stored[i] != FloatToBf16Bits(values[i]);
      return n;
    };
    const float* in = a.F32(a.layout.residual) + layer * BT * C;
    EXPECT_EQ(mismatches(a.Bf16(b.ln1), norm(in, p + w.ln1_w, TensorAt(p, w.ln1_b))), 0);
    EXPECT_EQ(mismatches(a.Bf16(b.ln2), norm(a.F32(b.res_mid), p + w.ln2_w, TensorAt(p, w.ln2_b))), 0);
    std::vector<float> act(BT * I);
    if (llama) {
      std::vector<float> fch(BT * FC);
      for (int64_t i = 0; i < BT * FC; ++i) fch[i] = Bf16BitsToFloat(a.Bf16(b.fch)[i]);
      SwiGluForward<float>(th, act.data(), fch.data(), BT, I);
    } else {
      GeluForward<float>(th, act.data(), a.F32(b.fch), BT * I);
    }
    EXPECT_EQ(mismatches(a.Bf16(b.fch_gelu), act), 0);
  }
}

// Flash attention in the model: the loss and every gradient of the plain
// attention's model up to the order of fp32 sums (relative 1e-5), in
// memory that grows with T instead of T².
TEST(GptModelTest, FlashAttentionMatchesPlainAndSavesMemory) {
  GptRunOptions o;
  o.batch_size = 3;
  o.num_threads = 2;
  o.attention = AttentionKernel::kPlain;
  const StepResult plain = RunStep(Chunky(), o);
  o.attention = AttentionKernel::kFlash;
  const StepResult flash = RunStep(Chunky(), o);
  EXPECT_NEAR(flash.loss, plain.loss, 1e-5 * std::fabs(plain.loss));
  for (size_t u = 0; u < plain.grads.size(); ++u) {
    EXPECT_LT(RelativeDifference(flash.grads[u], plain.grads[u]), 1e-5) << "unit " << u;
  }
  const GptConfig c = Chunky();
  GptRunOptions p = o;
  p.attention = AttentionKernel::kPlain;
  const ActivationLayout a = ActivationLayout::For(c, p), b = ActivationLayout::For(c, o);
  const int64_t T = c.max_seq_len, BH = o.batch_size * c.num_heads;
  EXPECT_GE(a.saved_bytes - b.saved_bytes, static_cast<uint64_t>(c.num_layers * BH * (T * T - T) * 4));
  EXPECT_GE(a.scratch_bytes - b.scratch_bytes, static_cast<uint64_t>(BH * (T * T - T) * 4));
}

TEST(GptModelTest, AutoAttentionIsFlashForBf16ProductsOnHeadsOf64Or128) {
  GptConfig c = Chunky();  // head size 16
  GptRunOptions o;
  EXPECT_EQ(ResolveAttention(c, o), AttentionKernel::kPlain);
  o.matmul_dtype = DType::kBFloat16;
  EXPECT_EQ(ResolveAttention(c, o), AttentionKernel::kPlain);
  c.embed_dim = 256;  // head size 64
  EXPECT_EQ(ResolveAttention(c, o), AttentionKernel::kFlash);
  o.attention = AttentionKernel::kPlain;
  EXPECT_EQ(ResolveAttention(c, o), AttentionKernel::kPlain);
  o.matmul_dtype = DType::kFloat32;
  o.attention = AttentionKernel::kAuto;
  EXPECT_EQ(ResolveAttention(c, o), AttentionKernel::kPlain);
  auto model = GptModel::Create(c, GptRunOptions{.matmul_dtype = DType::kBFloat16});
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ((*model)->options().attention, AttentionKernel::kFlash);  // resolved at creation
}

TEST(GptModelTest, CheckpointingGivesTheSameBitsAndSavesMemory) {
  GptRunOptions o;
  o.batch_size = 2;
  o.num_threads = 2;
  const StepResult plain = RunStep(Chunky(), o);
  o.activation_checkpointing = true;
  ExpectBitIdentical(plain, RunStep(Chunky(), o));
  // With bf16 products the recomputed forward computes the tensors stored
  // in bf16 in backward scratch (ProductInputsInBf16; with flash attention
  // AttentionInBf16, and QkvInBf16 on the Llama), beside the live residual
  // gradient, and flash backward widens q, k, v and O into dfch.
  for (const bool llama : {false, true}) {
    for (const AttentionKernel attention : {AttentionKernel::kPlain, AttentionKernel::kFlash}) {
      SCOPED_TRACE(::testing::Message() << (llama ? "tiny-llama" : "chunky") << ", bf16 products, "
                                        << AttentionKernelName(attention));
      const GptConfig c = llama ? std::move(GptPreset("tiny-llama")).value() : Chunky();
      GptRunOptions b = o;
      b.matmul_dtype = DType::kBFloat16;
      b.attention = attention;
      EXPECT_EQ(AttentionInBf16(c, b), attention == AttentionKernel::kFlash);
      EXPECT_EQ(QkvInBf16(c, b), llama && attention == AttentionKernel::kFlash);
      b.activation_checkpointing = false;
      const StepResult kept = RunStep(c, b);
      b.activation_checkpointing = true;
      ExpectBitIdentical(kept, RunStep(c, b));
    }
  }

  const GptConfig c = Chunky();
  GptRunOptions off = o, on = o;
  off.activation_checkpointing = false;
  const ActivationLayout a = ActivationLayout::For(c, off), b = ActivationLayout::For(c, on);
  EXPECT_EQ(a.block_sets, c.num_layers);
  EXPECT_EQ(b.block_sets, 1);
  EXPECT_EQ(a.saved_bytes - b.saved_bytes, (c.num_layers - 1) * a.block_stride);
  EXPECT_EQ(a.scratch_bytes, b.scratch_bytes);
}

// The loss in row chunks: each chunk's logits are computed again in
// backward, so the loss and the gradients are the whole product's up to the
// order of the head gradient's sums over rows (a chunk's partial added to
// it, not every row at once) and what the products do with fewer rows; the
// logits held shrink to one chunk's.
TEST(GptModelTest, LossInRowChunksMatchesTheWholeAndHoldsOneChunk) {
  const GptConfig c = Chunky();
  GptRunOptions o;
  o.batch_size = 3;  // 288 rows: chunks of 100, 100 and 88
  o.num_threads = 2;
  const StepResult whole = RunStep(c, o);
  GptRunOptions chunked = o;
  chunked.loss_chunk_rows = 100;
  const StepResult parts = RunStep(c, chunked);
  EXPECT_NEAR(parts.loss, whole.loss, 1e-6 * std::fabs(whole.loss));
  for (size_t u = 0; u < whole.grads.size(); ++u) {
    const double rel = RelativeDifference(parts.grads[u], whole.grads[u]);
    std::printf("  unit %zu: chunked-loss gradient relative difference %.3g\n", u, rel);
    EXPECT_LT(rel, 1e-6) << "unit " << u;
  }
  // One chunk is the whole when there is no more than one.
  chunked.loss_chunk_rows = 288;
  ExpectBitIdentical(whole, RunStep(c, chunked));

  GptRunOptions hundred = o;
  hundred.loss_chunk_rows = 100;
  const ActivationLayout a = ActivationLayout::For(c, o), b = ActivationLayout::For(c, hundred);
  EXPECT_EQ(a.loss_chunk_rows, 288);
  EXPECT_EQ(b.loss_chunk_rows, 100);
  EXPECT_GE(a.saved_bytes - b.saved_bytes, static_cast<uint64_t>(188 * c.vocab_size * 4));
}

// Who chooses the chunk: the logits of every row when they take at most
// kLossChunkBytes, else as many whole multiples of 64 rows as fit there
// (523 rows fit at Llama 3's vocabulary: 512, so that the head's products
// take sizes of multiples of 8, and B·T = 4096 splits into 8 equal chunks);
// fewer than 64 that fit are kept as they are; a given row count is kept
// within 1 .. B·T, unrounded.
TEST(GptModelTest, LossChunkRowsFollowTheLogitsBytes) {
  GptConfig c = Chunky();
  GptRunOptions o;
  o.batch_size = 4;
  EXPECT_EQ(LossChunkRows(c, o), 4 * 96);
  c.vocab_size = 128256;
  c.max_seq_len = 2048;
  const int64_t fit = static_cast<int64_t>(kLossChunkBytes / (128256 * 4));
  EXPECT_EQ(fit, 523);
  EXPECT_EQ(LossChunkRows(c, o), 512);
  EXPECT_EQ(LossChunkRows(c, o) % kLossChunkAlign, 0);
  EXPECT_LE(static_cast<uint64_t>(LossChunkRows(c, o)) * 128256 * 4, kLossChunkBytes);
  c.vocab_size = 50257;  // 1335 rows fit: 1280
  EXPECT_EQ(LossChunkRows(c, o), 1280);
  c.vocab_size = 10'000'000;  // 6 rows fit
  EXPECT_EQ(LossChunkRows(c, o), 6);
  c.vocab_size = 128256;
  o.loss_chunk_rows = 1 << 20;
  EXPECT_EQ(LossChunkRows(c, o), 4 * 2048);
  o.loss_chunk_rows = 7;
  EXPECT_EQ(LossChunkRows(c, o), 7);
}

// 16-bit parameters are widened exactly, so the model must give the bits of
// an fp32 run on the widened values; 16-bit gradients are the fp32 ones
// rounded once.
TEST(GptModelTest, SixteenBitParametersAndGradients) {
  const GptConfig c = Tiny();
  const int64_t B = 2, BT = B * c.max_seq_len;
  auto tokens = RandomTokens(BT, c.vocab_size, 21), targets = RandomTokens(BT, c.vocab_size, 22);
  auto params = MakeParams(c, 20);
  struct Format {
    DType dtype;
    uint16_t (*narrow)(float);
    float (*widen)(uint16_t);
  };
  for (Format f : {Format{DType::kBFloat16, FloatToBf16Bits, Bf16BitsToFloat},
                   Format{DType::kFloat16, FloatToHalfBits, HalfBitsToFloat}}) {
    SCOPED_TRACE(std::string(DTypeName(f.dtype)));
    std::vector<std::vector<uint16_t>> p16(params.size());
    std::vector<std::vector<float>> widened(params.size());
    for (size_t u = 0; u < params.size(); ++u) {
      for (float v : params[u]) {
        p16[u].push_back(f.narrow(v));
        widened[u].push_back(f.widen(p16[u].back()));
      }
    }
    GptRunOptions o;
    o.batch_size = B;
    auto fp32_model = MakeModel(c, o);
    auto g32 = MakeGrads<float>(c);
    const float loss32 = Step(*fp32_model, widened, g32, tokens, targets);

    // 16-bit parameters, fp32 gradients: identical bits.
    o.param_dtype = f.dtype;
    auto model = MakeModel(c, o);
    EXPECT_GT(model->activation_layout().conversion_bytes, 0u);
    auto g = MakeGrads<float>(c);
    const float loss = Step(*model, p16, g, tokens, targets);
    EXPECT_EQ(loss, loss32);
    for (size_t u = 0; u < g.size(); ++u) EXPECT_EQ(g[u], g32[u]) << "unit " << u;

    // 16-bit parameters and gradients: the fp32 gradients, rounded once.
    o.grad_dtype = f.dtype;
    auto model16 = MakeModel(c, o);
    auto g16 = MakeGrads<uint16_t>(c, uint16_t{0x7bcd});
    EXPECT_EQ(Step(*model16, p16, g16, tokens, targets), loss32);
    for (size_t u = 0; u < g16.size(); ++u) {
      for (size_t i = 0; i < g16[u].size(); ++i) {
        ASSERT_EQ(g16[u][i], f.narrow(g32[u][i])) << "unit " << u << " element " << i;
      }
    }
  }
}

TEST(GptModelTest, AccumulateAddsToTheGradientBuffers) {
  const GptConfig c = Tiny();
  GptRunOptions o;
  o.batch_size = 2;
  const StepResult once = RunStep(c, o);
  o.accumulate_grads = true;
  auto params = MakeParams(c, 5);
  const int64_t BT = 2 * c.max_seq_len;
  auto tokens = RandomTokens(BT, c.vocab_size, 6), targets = RandomTokens(BT, c.vocab_size, 7);
  auto model = MakeModel(c, o);
  auto g = MakeGrads<float>(c);
  Step(*model, params, g, tokens, targets);
  Step(*model, params, g, tokens, targets);
  // Not bit-exact: the second backward adds its partial products into the
  // buffer block by block. Within 1e-6 of each unit's gradient scale.
  for (size_t u = 0; u < g.size(); ++u) {
    float scale = 0;
    for (float v : once.grads[u]) scale = std::max(scale, 2 * std::abs(v));
    for (size_t i = 0; i < g[u].size(); ++i) {
      ASSERT_NEAR(g[u][i], 2 * once.grads[u][i], 1e-6f * scale) << u << ":" << i;
    }
  }
}

// The model can memorise one batch: plain Adam (lr 1e-2, betas 0.9/0.999,
// no weight decay) from GPT-2's initialisation takes the loss from ln(V) ≈
// 4.16 to below 0.05 in 300 steps.
TEST(GptModelTest, AdamMemorisesAFixedBatch) {
  const GptConfig c = Tiny();
  GptRunOptions o;
  o.batch_size = 2;
  o.num_threads = 2;
  auto model = MakeModel(c, o);
  test::Arena arena = test::MakeArena(model->activation_bytes());
  model->BindActivations(arena.get());
  auto params = MakeParams(c, 31, 0.0f);
  auto grads = MakeGrads<float>(c), m = MakeGrads<float>(c), v = MakeGrads<float>(c);
  const int64_t BT = 2 * c.max_seq_len;
  auto tokens = RandomTokens(BT, c.vocab_size, 32), targets = RandomTokens(BT, c.vocab_size, 33);
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  float first = 0, loss = 0;
  for (int step = 1; step <= 300; ++step) {
    auto l = model->Forward(tokens.data(), targets.data(), ConstPtrs(params));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    loss = *l;
    if (step == 1) first = loss;
    ASSERT_TRUE(model->Backward(ConstPtrs(params), Ptrs(grads)).ok());
    const float bc1 = 1 - std::pow(b1, static_cast<float>(step)), bc2 = 1 - std::pow(b2, static_cast<float>(step));
    for (size_t u = 0; u < params.size(); ++u) {
      for (size_t i = 0; i < params[u].size(); ++i) {
        const float g = grads[u][i];
        m[u][i] = b1 * m[u][i] + (1 - b1) * g;
        v[u][i] = b2 * v[u][i] + (1 - b2) * g * g;
        params[u][i] -= lr * (m[u][i] / bc1) / (std::sqrt(v[u][i] / bc2) + eps);
      }
    }
  }
  std::printf("  loss %.4f -> %.5f after 300 Adam steps\n", first, loss);
  EXPECT_NEAR(first, std::log(static_cast<float>(c.vocab_size)), 0.1f);
  EXPECT_LT(loss, 0.05f);
}

TEST(GptModelTest, StagesOutOfOrderAreRefused) {
  const GptConfig c = Tiny();
  GptRunOptions o;
  auto model = MakeModel(c, o);
  auto params = MakeParams(c, 1);
  auto grads = MakeGrads<float>(c);
  std::vector<int32_t> tokens(c.max_seq_len, 1);
  EXPECT_EQ(model->EmbedForward(tokens.data(), params[0].data()).code(), StatusCode::kFailedPrecondition);  // no arena
  test::Arena arena = test::MakeArena(model->activation_bytes());
  model->BindActivations(arena.get());
  EXPECT_EQ(model->BlockForward(0, params[1].data()).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(model->EmbedForward(tokens.data(), params[0].data()).ok());
  EXPECT_EQ(model->BlockForward(1, params[2].data()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(model->HeadForward(tokens.data(), params[3].data(), params[0].data()).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(model->HeadBackward(1, params[3].data(), params[0].data(), grads[3].data(), grads[0].data()).code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(model->BlockForward(0, params[1].data()).ok());
  ASSERT_TRUE(model->BlockForward(1, params[2].data()).ok());
  ASSERT_TRUE(model->HeadForward(tokens.data(), params[3].data(), params[0].data()).ok());
  EXPECT_EQ(model->EmbedBackward(grads[0].data()).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(model->HeadBackward(1, params[3].data(), params[0].data(), grads[3].data(), grads[0].data()).ok());
  EXPECT_EQ(model->BlockBackward(0, params[1].data(), grads[1].data()).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(model->BlockBackward(1, params[2].data(), grads[2].data()).ok());
  ASSERT_TRUE(model->BlockBackward(0, params[1].data(), grads[1].data()).ok());
  ASSERT_TRUE(model->EmbedBackward(grads[0].data()).ok());
}

TEST(GptModelTest, BadInputsAreInvalidArguments) {
  const GptConfig c = Tiny();
  GptRunOptions o;
  o.seq_len = c.max_seq_len + 1;
  EXPECT_EQ(GptModel::Create(c, o).status().code(), StatusCode::kInvalidArgument);
  o.seq_len = 4;
  o.batch_size = 0;
  EXPECT_EQ(GptModel::Create(c, o).status().code(), StatusCode::kInvalidArgument);
  o.batch_size = 1;
  o.matmul_dtype = DType::kFloat16;
  auto fp16 = GptModel::Create(c, o);
  EXPECT_EQ(fp16.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(fp16.status().message().find("fp32 or bf16"), std::string::npos) << fp16.status().message();
  o.matmul_dtype = DType::kFloat32;
  auto model = MakeModel(c, o);
  test::Arena arena = test::MakeArena(model->activation_bytes());
  model->BindActivations(arena.get());
  auto params = MakeParams(c, 1);
  std::vector<int32_t> tokens = {1, 2, static_cast<int32_t>(c.vocab_size), 3};
  Status st = model->EmbedForward(tokens.data(), params[0].data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("position 2"), std::string::npos) << st.message();
  tokens[2] = 0;
  ASSERT_TRUE(model->Forward(tokens.data(), tokens.data(), ConstPtrs(params)).ok());
  std::vector<int32_t> bad_targets = {0, 1, 2, 1000};
  ASSERT_TRUE(model->EmbedForward(tokens.data(), params[0].data()).ok());
  for (int l = 0; l < c.num_layers; ++l) ASSERT_TRUE(model->BlockForward(l, params[l + 1].data()).ok());
  EXPECT_EQ(model->HeadForward(bad_targets.data(), params[3].data(), params[0].data()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(GptModelTest, AllTargetsIgnoredGivesZeroLossAndGradients) {
  const GptConfig c = Tiny();
  GptRunOptions o;
  o.seq_len = 5;
  auto model = MakeModel(c, o);
  auto params = MakeParams(c, 3);
  auto grads = MakeGrads<float>(c, 1.0f);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5}, targets(5, -1);
  EXPECT_EQ(Step(*model, params, grads, tokens, targets), 0.0f);
  for (const auto& g : grads) {
    for (float v : g) ASSERT_EQ(v, 0.0f);
  }
}

}  // namespace
}  // namespace zinf::model
