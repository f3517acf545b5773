// The GPT model's stages on CUDA (GptDevice on a CudaDevice) against GptModel
// on the CPU, on the same parameters and batch. Skipped (not passed) without a
// CUDA device.
//
// Tolerances: the products are cuBLAS fp32 (no TF32) against OpenBLAS fp32,
// which sum in other orders; everything between them is the CPU's math.
//   loss: |gpu - cpu| <= 1e-5 · max(1, |cpu|);
//   each unit's gradient with fp32 gradients: ‖gpu - cpu‖ / ‖cpu‖ <= 1e-4;
//   with bf16 parameters and gradients (rounded once at the end, so a few
//   elements land one bf16 step apart): ‖gpu - cpu‖ / ‖cpu‖ <= 1e-2.
// With bf16 matmul operands (tensor cores) against the CPU model's bf16
// mode: both round each operand to nearest even (the same per-element cast)
// before an fp32-accumulated product of bf16 × bf16 terms, which are exact in
// fp32, so only the order of the sums differs — loss within
// 1e-4 · max(1, |cpu|), fp32 gradients within 2^-8 (one bf16 rounding,
// 3.9e-3). The order still matters more than in fp32: where it moves a value
// across a bf16 rounding boundary, the next product sees an operand one bf16
// step apart. On an H100 the gradients were 0.09-0.6e-3 apart on the
// smaller shape (C = 64) and 0.8-3.2e-3 on the wider one (C = 256, T = 150),
// for the plain and the flash attention alike. A rounding that differed
// everywhere puts whole activations one bf16 step apart: cuBLAS's own
// down-conversion (CUBLAS_COMPUTE_32F_FAST_16BF) gave 4.6e-3 to 5.2e-3 on the
// small shape.
// Tensor by tensor, the same bound is 2^-7 (two bf16 steps) with bf16
// operands: a small tensor (a norm weight, a bias, wpe) averages over fewer
// elements, so a few flipped roundings weigh more. On an H100 (2026-11-26)
// the per-tensor errors reached 4.0e-3 to 4.9e-3 (wpe, ln1_w, qkv_w, qkv_b of
// the wider shape, plain and flash attention alike) while each unit's stayed
// within 2^-8; a wrong kernel is off by far more than either.
// The flash_* cases (bf16 operands, heads of 64 and 128) run flash
// attention on both sides, the tensor-core kernels against the CPU twin;
// bf16_matmul_wide_plain is the same shape with the plain attention.
//
// The Llama family (the rest of the list) takes the same tolerances: its
// RMSNorm, RoPE and SwiGLU kernels give the CPU's bits (decoder_kernels_test),
// so again only the products' order differs. The cases cover each preset's
// variation — tiny-llama (RMSNorm, RoPE, SwiGLU, two query heads per
// key/value head, no biases, an untied head), tiny-qwen2 (q/k/v biases, a
// tied head), tiny-qwen3 (q/k RMSNorm, heads of 16 with H·D = 2C) — and
// shapes no preset has: three query heads per key/value head with heads of
// 10, Llama 3's RoPE scaling, biases on every linear layer, q/k norm and an
// untied head at once; LayerNorm with RoPE and SwiGLU; and grouped-query
// heads under flash attention (64, and 128 with four query heads on one
// key/value head) and, at 64, under the plain one with bf16 operands. The
// *_fp32_tiles cases run flash attention's kernels that read fp32 tiles,
// those of a device without the shared memory for the bf16 copies' kernels
// (gpu::DisableFlashAttentionCopiesForTesting), and the model's paths for
// them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/float16.h"
#include "gpu/cuda_device.h"
#include "gpu/cuda_probe.h"
#include "gpu/kernels.h"
#include "exec/gpt_device.h"
#include "model/model_test_util.h"

namespace zinf::model {
namespace {

using exec::GptDevice;
using test::MakeGrads;
using test::MakeModel;
using test::MakeParams;
using test::RandomTokens;

struct Case {
  const char* name;
  GptConfig config;
  bool checkpointing;
  bool bf16;
  float loss_scale = 1.0f;         // backpropagates loss_scale · loss (fp16 loss scaling)
  DType matmul = DType::kFloat32;  // the products' operands (GptRunOptions::matmul_dtype)
  AttentionKernel attention = AttentionKernel::kAuto;
  int64_t loss_chunk_rows = 0;  // GptRunOptions::loss_chunk_rows (0: every row of these small models)
  // bf16 only: the gradients overwritten, not accumulated; with bf16
  // products the linear layers' weight gradients are then written by their
  // products in bf16 (DirectGrads in exec/gpt_cuda.cc).
  bool overwrite_grads = false;
  // Flash attention's kernels that read fp32 tiles, as on a device whose
  // shared memory does not fit the bf16 copies' kernels (the model then
  // keeps dO in fp32 and computes q, k, v in fp32 scratch).
  bool fp32_tiles = false;
};

// One forward + backward on host buffers (test::Step with a loss scale).
template <class P, class G>
float CpuStep(GptModel& model, const std::vector<std::vector<P>>& params, std::vector<std::vector<G>>& grads,
              const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, float loss_scale) {
  test::Arena arena = test::MakeArena(model.activation_bytes());
  model.BindActivations(arena.get());
  auto loss = model.Forward(tokens.data(), targets.data(), test::ConstPtrs(params));
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  const Status st = model.Backward(test::ConstPtrs(params), test::Ptrs(grads), loss_scale);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return loss.value_or(NAN);
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16Bits(v[i]);
  return out;
}
std::vector<float> FromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16BitsToFloat(v[i]);
  return out;
}

// ||got - want|| / max(||want||, floor) over elements [begin, begin + n).
double RelativeError(const std::vector<float>& got, const std::vector<float>& want, size_t begin, size_t n,
                     double floor = 1e-150) {
  double diff = 0, norm = 0;
  for (size_t i = begin; i < begin + n; ++i) {
    diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), floor);
}

class GptOnCudaTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (gpu::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GptOnCudaTest, LossAndGradientsMatchTheCpuModel) {
  const Case& k = GetParam();
  const GptConfig& c = k.config;
  GptRunOptions o;
  o.batch_size = 3;
  o.num_threads = 2;
  o.activation_checkpointing = k.checkpointing;
  o.param_dtype = o.grad_dtype = k.bf16 ? DType::kBFloat16 : DType::kFloat32;
  // accumulate onto a non-zero start: exercises the fp32 accumulator's load
  o.accumulate_grads = k.bf16 && !k.overwrite_grads;
  o.matmul_dtype = k.matmul;
  o.attention = k.attention;
  o.loss_chunk_rows = k.loss_chunk_rows;
  EXPECT_EQ(ResolveAttention(c, o) == AttentionKernel::kFlash, std::string(k.name).starts_with("flash")) << k.name;
  const int64_t BT = o.batch_size * c.max_seq_len;
  auto params = MakeParams(c, 21);
  auto tokens = RandomTokens(BT, c.vocab_size, 22), targets = RandomTokens(BT, c.vocab_size, 23);
  targets[5] = -1;  // an ignored target

  // The CPU reference, on the same (possibly bf16-rounded) parameters.
  std::vector<std::vector<uint16_t>> params16, grads16;
  std::vector<std::vector<float>> want(NumUnits(c));
  float want_loss = 0;
  {
    auto model = MakeModel(c, o);
    if (k.bf16) {
      for (auto& p : params) params16.push_back(ToBf16(p));
      for (auto& p : params) grads16.push_back(ToBf16(std::vector<float>(p.size(), 0.01f)));
      auto g = grads16;
      want_loss = CpuStep(*model, params16, g, tokens, targets, k.loss_scale);
      for (int u = 0; u < NumUnits(c); ++u) want[u] = FromBf16(g[u]);
    } else {
      auto g = MakeGrads<float>(c);
      want_loss = CpuStep(*model, params, g, tokens, targets, k.loss_scale);
      want = g;
    }
  }

  auto device = gpu::CreateCudaDevice(0, DeviceOptions{.memory_budget = 512 << 20});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  Device& d = **device;
  auto stream = std::move(d.CreateStream()).value();
  const size_t esize = k.bf16 ? 2 : 4;
  std::vector<const void*> dparams;
  std::vector<void*> dgrads;
  for (int u = 0; u < NumUnits(c); ++u) {
    const size_t bytes = params[u].size() * esize;
    void* p = d.Allocate(bytes, *stream).value();
    void* g = d.Allocate(bytes, *stream).value();
    ASSERT_TRUE(
        d.CopyToDevice(p, k.bf16 ? static_cast<const void*>(params16[u].data()) : params[u].data(), bytes, *stream)
            .ok());
    if (o.accumulate_grads) {
      ASSERT_TRUE(d.CopyToDevice(g, grads16[u].data(), bytes, *stream).ok());
    } else {
      ASSERT_TRUE(d.Memset(g, 0xff, bytes, *stream).ok());  // NaN: every element must be written
    }
    dparams.push_back(p);
    dgrads.push_back(g);
  }
  auto* dtokens = static_cast<int32_t*>(d.Allocate(BT * 4, *stream).value());
  auto* dtargets = static_cast<int32_t*>(d.Allocate(BT * 4, *stream).value());
  auto* dloss = static_cast<float*>(d.Allocate(4, *stream).value());
  ASSERT_TRUE(d.CopyToDevice(dtokens, tokens.data(), BT * 4, *stream).ok());
  ASSERT_TRUE(d.CopyToDevice(dtargets, targets.data(), BT * 4, *stream).ok());
  ASSERT_TRUE(stream->Synchronize().ok());

  gpu::DisableFlashAttentionCopiesForTesting(k.fp32_tiles);
  struct Restore {
    ~Restore() { gpu::DisableFlashAttentionCopiesForTesting(false); }
  } restore;
  auto gpt = GptDevice::Create(d, *stream, c, o);
  ASSERT_TRUE(gpt.ok()) << gpt.status().ToString();
  ASSERT_TRUE((*gpt)->EnqueueForward(dtokens, dtargets, dparams, dloss).ok());
  ASSERT_TRUE((*gpt)->EnqueueBackward(dparams, dgrads, k.loss_scale).ok());
  float loss = 0;
  ASSERT_TRUE(d.CopyToHost(&loss, dloss, 4, *stream).ok());
  std::vector<std::vector<float>> got(NumUnits(c));
  for (int u = 0; u < NumUnits(c); ++u) {
    if (k.bf16) {
      std::vector<uint16_t> g(params[u].size());
      ASSERT_TRUE(d.CopyToHost(g.data(), dgrads[u], g.size() * 2, *stream).ok());
      got[u] = FromBf16(g);
    } else {
      got[u].resize(params[u].size());
      ASSERT_TRUE(d.CopyToHost(got[u].data(), dgrads[u], got[u].size() * 4, *stream).ok());
    }
  }
  const Status st = stream->Synchronize();
  ASSERT_TRUE(st.ok()) << st.ToString();

  const bool bf16_matmul = k.matmul == DType::kBFloat16;
  EXPECT_NEAR(loss, want_loss, (bf16_matmul ? 1e-4 : 1e-5) * std::max(1.0f, std::fabs(want_loss))) << k.name;
  const double tolerance = k.bf16 ? 1e-2 : bf16_matmul ? 1.0 / 256 : 1e-4;
  const double tensor_tolerance = !k.bf16 && bf16_matmul ? 2.0 / 256 : tolerance;
  for (int u = 0; u < NumUnits(c); ++u) {
    const double err = RelativeError(got[u], want[u], 0, want[u].size());
    std::printf("  %s: unit %d gradient relative error %.3g\n", k.name, u, err);
    EXPECT_LE(err, tolerance) << k.name << ", unit " << u;
    // Tensor by tensor too, so that an error in a small tensor (a norm
    // weight, a bias, q_norm_w) is not diluted by the large matrices; the
    // floor keeps a tensor whose gradient is near zero from dividing by it.
    double unit_norm = 0;
    for (float w : want[u]) unit_norm += static_cast<double>(w) * w;
    unit_norm = std::sqrt(unit_norm);
    for (const UnitTensor& t : UnitTensors(c, u)) {
      const double e = RelativeError(got[u], want[u], static_cast<size_t>(t.offset_elems),
                                     static_cast<size_t>(t.num_elems()), 1e-3 * unit_norm);
      EXPECT_LE(e, tensor_tolerance) << k.name << ", unit " << u << ", tensor " << t.name;
    }
  }
  gpt->reset();
  ASSERT_TRUE(stream->Synchronize().ok());
}

GptConfig Shape(int64_t V, int64_t T, int64_t C, int64_t L, int64_t H) {
  GptConfig c;
  c.name = "test";
  c.vocab_size = V;
  c.max_seq_len = T;
  c.embed_dim = C;
  c.num_layers = L;
  c.num_heads = H;
  return c;
}

GptConfig Preset(const char* name) { return std::move(GptPreset(name)).value(); }

// A Llama-family shape: RMSNorm, RoPE, SwiGLU, H_kv key/value heads of D,
// no biases, an untied head.
GptConfig Llama(int64_t V, int64_t T, int64_t C, int64_t L, int64_t H, int64_t H_kv, int64_t D, int64_t I) {
  GptConfig c = Shape(V, T, C, L, H);
  c.norm = NormKind::kRmsNorm;
  c.norm_eps = 1e-6;
  c.positions = PositionKind::kRope;
  c.rope_theta = 10000.0;
  c.mlp = MlpKind::kSwiGlu;
  c.intermediate_size = I;
  c.num_kv_heads = H_kv;
  c.head_dim_size = D;
  c.qkv_bias = false;
  c.linear_bias = false;
  c.tied_head = false;
  return c;
}

// Three query heads per key/value head, heads of 10 (H·D = 60 against
// C = 48), Llama 3's frequency scaling (with an original context of 48 the
// five frequencies fall in all three bands: kept, blended, divided), biases
// everywhere, q/k norm, an untied head.
GptConfig OddGqa() {
  GptConfig c = Llama(97, 37, 48, 2, 6, 2, 10, 72);
  c.rope_scaling.llama3 = true;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.original_max_position = 48;
  c.qkv_bias = true;
  c.linear_bias = true;
  c.qk_norm = true;
  return c;
}

// GPT-2's LayerNorm (and biases, a tied head) with the Llama family's RoPE,
// SwiGLU and four query heads on one key/value head.
GptConfig LayerNormRope() {
  GptConfig c = Llama(97, 29, 40, 2, 4, 1, 12, 56);
  c.norm = NormKind::kLayerNorm;
  c.norm_eps = 1e-5;
  c.linear_bias = true;
  c.tied_head = true;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GptOnCudaTest,
    ::testing::Values(
        Case{"tiny", test::Tiny(), false, false}, Case{"tiny_checkpointing", test::Tiny(), true, false},
        Case{"odd_vocab_long_rows", Shape(97, 67, 48, 3, 6), false, false},
        Case{"bf16_accumulate", Shape(97, 40, 64, 2, 4), true, true},
        Case{"loss_scale_1024", Shape(97, 40, 64, 2, 4), false, false, 1024.0f},
        Case{"bf16_matmul", Shape(97, 40, 64, 2, 4), false, false, 1.0f, DType::kBFloat16},
        Case{"bf16_matmul_bf16_params", Shape(97, 67, 48, 3, 6), true, true, 1.0f, DType::kBFloat16},
        Case{"bf16_matmul_wide_plain", Shape(97, 150, 256, 2, 4), false, false, 1.0f, DType::kBFloat16,
             AttentionKernel::kPlain},
        Case{"flash_attention", Shape(97, 150, 256, 2, 4), false, false, 1.0f, DType::kBFloat16},
        Case{"flash_attention_d128_checkpointing_bf16", Shape(97, 130, 256, 2, 2), true, true, 1.0f, DType::kBFloat16},
        Case{"odd_vocab_loss_in_chunks", Shape(97, 67, 48, 3, 6), false, false, 1024.0f, DType::kFloat32,
             AttentionKernel::kAuto, 50},
        Case{"bf16_matmul_loss_in_chunks", Shape(97, 40, 64, 2, 4), false, true, 1.0f, DType::kBFloat16,
             AttentionKernel::kAuto, 33},
        // fp32 parameters: each chunk's weight gradient on its own.
        Case{"bf16_matmul_fp32_params_loss_in_chunks", Shape(97, 40, 64, 2, 4), false, false, 1.0f, DType::kBFloat16,
             AttentionKernel::kAuto, 33},
        // Chunks of 16 rows gathered four at a time for the head's weight
        // gradient (the operand copies hold V · C = 64,000 elements):
        // groups of 64 and 56 rows, the last chunk 8.
        Case{"bf16_matmul_loss_in_chunk_groups", Shape(1000, 40, 64, 2, 4), false, true, 1.0f, DType::kBFloat16,
             AttentionKernel::kAuto, 16},
        Case{"tiny_llama", Preset("tiny-llama"), false, false},
        Case{"tiny_llama_checkpointing", Preset("tiny-llama"), true, false},
        Case{"tiny_llama_bf16_accumulate", Preset("tiny-llama"), false, true},
        Case{"tiny_qwen2", Preset("tiny-qwen2"), false, false},
        Case{"tiny_qwen2_loss_scale_1024", Preset("tiny-qwen2"), false, false, 1024.0f},
        Case{"tiny_qwen3", Preset("tiny-qwen3"), false, false},
        Case{"tiny_qwen3_checkpointing_bf16", Preset("tiny-qwen3"), true, true},
        Case{"odd_gqa", OddGqa(), false, false}, Case{"odd_gqa_checkpointing", OddGqa(), true, false},
        Case{"odd_gqa_bf16_matmul", OddGqa(), false, false, 1.0f, DType::kBFloat16},
        Case{"layernorm_rope_swiglu", LayerNormRope(), false, false},
        Case{"flash_gqa_llama", Llama(97, 130, 256, 2, 4, 2, 64, 384), false, false, 1.0f, DType::kBFloat16},
        Case{"flash_gqa_llama_d128_checkpointing_bf16", Llama(97, 70, 128, 2, 4, 1, 128, 160), true, true, 1.0f,
             DType::kBFloat16},
        Case{"bf16_matmul_gqa_llama_plain", Llama(97, 130, 256, 2, 4, 2, 64, 384), false, false, 1.0f, DType::kBFloat16,
             AttentionKernel::kPlain},
        Case{"bf16_grads_from_products", Shape(97, 40, 64, 2, 4), false, true, 1.0f, DType::kBFloat16,
             AttentionKernel::kAuto, 0, true},
        Case{"odd_gqa_bf16_grads_from_products", OddGqa(), true, true, 1.0f, DType::kBFloat16, AttentionKernel::kAuto,
             0, true},
        Case{"flash_gqa_llama_bf16_grads_from_products", Llama(97, 130, 256, 2, 4, 2, 64, 384), false, true, 1.0f,
             DType::kBFloat16, AttentionKernel::kAuto, 0, true},
        Case{"flash_gqa_llama_fp32_tiles", Llama(97, 130, 256, 2, 4, 2, 64, 384), false, false, 1.0f, DType::kBFloat16,
             AttentionKernel::kAuto, 0, false, true},
        Case{"flash_gqa_llama_d128_checkpointing_bf16_fp32_tiles", Llama(97, 70, 128, 2, 4, 1, 128, 160), true, true,
             1.0f, DType::kBFloat16, AttentionKernel::kAuto, 0, false, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace zinf::model
