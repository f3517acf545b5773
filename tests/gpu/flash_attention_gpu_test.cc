// The CUDA flash attention (gpu::FlashAttentionForward/Backward) against
// its CPU twin with bf16 operands (model/flash_attention.h). Skipped (not
// passed) without a CUDA device; the argument checks run everywhere.
//
// Tolerance: max |gpu - twin| / max |twin| <= 1e-3 for out, lse and each
// gradient. Both round the same inputs to bf16 and sum in fp32 with the
// same exp (math/gpt_math.h); the tensor cores add the products of a tile
// in their own order, and where that moves a p or ds across a bf16 rounding
// boundary the rounded operand differs by one bf16 ulp (2^-8 relative).
// Measured on an H100: at most 1.4e-4 (T = 1030, four heads on one kv head).
// The kernels that read bf16 copies of the inputs (AttentionTensors::q16
// ...) must give the bits of those that round the fp32 inputs themselves.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gpu/cuda_probe.h"
#include "gpu/kernels.h"
#include "model/attention_problem.h"

namespace zinf::gpu {
namespace {

using math::AttentionShape;
using model::ModelThreads;
using model::test::AttentionProblem;
using model::test::AttentionResult;
using model::test::ExpectCloseToTwin;
using model::test::ScaledMaxError;

class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n, const float* init = nullptr) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(float)), cudaSuccess);
    if (init)
      EXPECT_EQ(cudaMemcpy(p_, init, n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    else
      EXPECT_EQ(cudaMemset(p_, 0xff, n * sizeof(float)), cudaSuccess);  // NaN: unwritten shows
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() const { return p_; }
  std::vector<float> ToHost() const {
    std::vector<float> h(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  float* p_ = nullptr;
  size_t n_;
};

// How the kernels get their operands: by rounding the fp32 tensors as the
// tiles load, or from bf16 copies made beforehand (AttentionTensors::q16 ...).
enum class Operands { kRoundedAtLoad, kBf16Copies };

// Forward and backward on the GPU; with forward_only, dqkv stays empty.
AttentionResult OnGpu(const AttentionProblem& p, bool forward_only = false,
                      Operands operands = Operands::kRoundedAtLoad, int kv_min_blocks = 0) {
  DeviceFloats qkv(p.qkv.size(), p.qkv.data()), dout(p.dout.size(), p.dout.data());
  DeviceFloats out(p.OutElems()), lse(p.StatElems()), delta(p.StatElems()), dqkv(p.qkv.size());
  // dqkv's columns are all written (q, k and v of every head), so the NaN
  // fill would show a missed one.
  math::AttentionTensors t = p.Tensors(qkv.get(), out.get(), lse.get(), dout.get(), delta.get(), dqkv.get());
  // The bf16 copies (as the model makes them: gpu::Cast of all of qkv, and
  // of dout), in buffers of their own.
  DeviceFloats qkv16((p.qkv.size() + 1) / 2), dout16((p.dout.size() + 1) / 2);
  if (operands == Operands::kBf16Copies) {
    Status st = Cast(qkv.get(), DType::kFloat32, qkv16.get(), DType::kBFloat16, p.qkv.size(), nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    st = Cast(dout.get(), DType::kFloat32, dout16.get(), DType::kBFloat16, p.dout.size(), nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    const auto* q16 = reinterpret_cast<const uint16_t*>(qkv16.get());
    t.q16 = q16;
    t.k16 = q16 + (t.k - t.q);
    t.v16 = q16 + (t.v - t.q);
    t.dout16 = reinterpret_cast<const uint16_t*>(dout16.get());
  }
  AttentionResult r;
  Status st = FlashAttentionForward(p.shape, t, nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!forward_only) {
    st = FlashAttentionBackward(p.shape, t, nullptr, kv_min_blocks);
    EXPECT_TRUE(st.ok()) << st.ToString();
    r.dqkv = dqkv.ToHost();
  }
  r.out = out.ToHost();
  r.lse = lse.ToHost();
  return r;
}

class FlashAttentionGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
};

TEST_F(FlashAttentionGpuTest, MatchesTheCpuTwin) {
  struct Case {
    int64_t B, T, H, Hkv, D;
  };
  for (const Case& c : {Case{2, 200, 4, 2, 64}, Case{1, 130, 2, 2, 128}, Case{1, 5, 1, 1, 64}, Case{1, 1030, 4, 1, 128},
                        Case{3, 64, 2, 2, 64}}) {
    const AttentionProblem p = AttentionProblem::Random(c.B, c.T, c.H, c.Hkv, c.D, 40 + c.T, 2.0f);
    SCOPED_TRACE(p.Describe());
    ExpectCloseToTwin(p, OnGpu(p), p.Twin(ModelThreads(4, DType::kBFloat16)), 1e-3);
  }
}

// The bf16 copies hold the operands the fp32 path rounds as it loads, and
// the products take them in the same order: the same bits, through the
// other kernels (cp.async, two buffers a tile). Ragged T, a group of query
// heads on one kv head, both head dims, one and several key blocks.
TEST_F(FlashAttentionGpuTest, Bf16CopiesGiveTheSameBits) {
  struct Case {
    int64_t B, T, H, Hkv, D;
  };
  for (const Case& c : {Case{2, 200, 4, 2, 64}, Case{1, 130, 2, 2, 128}, Case{1, 5, 1, 1, 64}, Case{1, 1030, 4, 1, 128},
                        Case{3, 64, 2, 2, 64}, Case{1, 257, 8, 2, 128}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " H=" << c.H << " Hkv=" << c.Hkv
                                      << " D=" << c.D);
    const AttentionProblem p = AttentionProblem::Random(c.B, c.T, c.H, c.Hkv, c.D, 90 + c.T, 2.0f);
    const Result<bool> fit = FlashAttentionCopiesFit(c.D);
    ASSERT_TRUE(fit.ok()) << fit.status().ToString();
    // Where the two-buffer kernels do not fit the device, the copies' path
    // runs the one-buffer kernels: then this compares those with themselves.
    if (!*fit) std::printf("  D=%lld: the two-buffer kernels do not fit this GPU\n", static_cast<long long>(c.D));
    const AttentionResult a = OnGpu(p), b = OnGpu(p, false, Operands::kBf16Copies);
    EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * sizeof(float)));
    // And both against the twin, as above (NaN in any of them fails here).
    const AttentionResult twin = p.Twin(ModelThreads(4, DType::kBFloat16));
    EXPECT_LE(ScaledMaxError(b.out, twin.out), 1e-3);
    EXPECT_LE(ScaledMaxError(b.dqkv, twin.dqkv), 1e-3);
  }
}

// head_dim 64: the forward's blocks of 128 queries (two row tiles a warp,
// the default) and of 64 give the same bits; each row sees the same key
// blocks in the same order.
TEST_F(FlashAttentionGpuTest, ForwardQueryTilesGiveTheSameBits) {
  for (const int64_t T : {int64_t{5}, int64_t{130}, int64_t{200}, int64_t{1030}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const AttentionProblem p = AttentionProblem::Random(2, T, 4, 2, 64, 70 + T, 2.0f);
    std::vector<float> outs[2], lses[2];
    for (int tiles : {1, 2}) {
      DeviceFloats qkv(p.qkv.size(), p.qkv.data()), out(p.OutElems()), lse(p.StatElems());
      const math::AttentionTensors t = p.Tensors(qkv.get(), out.get(), lse.get(), nullptr, nullptr, nullptr);
      const Status st = FlashAttentionForward(p.shape, t, nullptr, tiles);
      ASSERT_TRUE(st.ok()) << st.ToString();
      outs[tiles - 1] = out.ToHost();
      lses[tiles - 1] = lse.ToHost();
    }
    EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(lses[0].data(), lses[1].data(), lses[0].size() * sizeof(float)));
  }
}

// head_dim 64: the dK/dV kernel capped at 168 registers (three blocks a
// SM, the default) and uncapped give the same bits, on both operand paths.
TEST_F(FlashAttentionGpuTest, BackwardKvRegisterCapGivesTheSameBits) {
  for (const int64_t T : {int64_t{5}, int64_t{130}, int64_t{1030}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const AttentionProblem p = AttentionProblem::Random(2, T, 4, 2, 64, 90 + T, 2.0f);
    for (const Operands operands : {Operands::kRoundedAtLoad, Operands::kBf16Copies}) {
      const AttentionResult capped = OnGpu(p, false, operands, 3), uncapped = OnGpu(p, false, operands, 1);
      EXPECT_EQ(0, std::memcmp(capped.dqkv.data(), uncapped.dqkv.data(), capped.dqkv.size() * sizeof(float)));
    }
  }
}

TEST_F(FlashAttentionGpuTest, RepeatsBitForBit) {
  const AttentionProblem p = AttentionProblem::Random(2, 300, 4, 2, 128, 8);
  const AttentionResult a = OnGpu(p), b = OnGpu(p);
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * sizeof(float)));
}

// T = 8192 without a T × T buffer: sampled rows of the output against the
// same rows evaluated in double on the host from the bf16-rounded inputs.
TEST_F(FlashAttentionGpuTest, LongContextRowsMatchADirectEvaluation) {
  const AttentionProblem p = AttentionProblem::Random(1, 8192, 2, 1, 128, 77, 2.0f);
  const AttentionResult gpu = OnGpu(p, /*forward_only=*/true);
  const auto& s = p.shape;
  const int64_t S = p.QkvStride(), D = s.head_dim;
  auto op = [](float x) { return static_cast<double>(math::FlashOperand(x, true)); };
  double worst = 0;
  for (int64_t h = 0; h < s.heads; ++h) {
    for (int64_t i : {0, 63, 64, 1000, 4097, 8191}) {
      std::vector<double> w(static_cast<size_t>(i + 1));
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += op(p.qkv[i * S + h * D + d]) * op(p.qkv[j * S + s.heads * D + d]);
        w[j] = dot * s.scale;
        m = std::max(m, w[j]);
      }
      for (double& x : w) sum += (x = std::exp(x - m));
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= i; ++j) o += w[j] * op(p.qkv[j * S + (s.heads + 1) * D + d]);
        worst = std::max(worst, std::fabs(gpu.out[i * s.heads * D + h * D + d] - o / sum));
      }
      EXPECT_NEAR(gpu.lse[h * s.seq_len + i], m + std::log(sum), 1e-3) << "row " << i;
    }
  }
  std::printf("  T=8192: max |out - direct| = %.2e\n", worst);
  EXPECT_LE(worst, 1e-2);  // p is rounded to bf16 before it weighs v: 2^-9 relative per term
}

// O and dO kept in bf16 alone (AttentionTensors::out16, a null dout: the
// model's AttentionInBf16), d(qkv) written in bf16 alone (dq16 ...:
// QkvInBf16): the forward writes O rounded, and backward (δ from the bf16
// values) the roundings of what fp32 O and dO rounded in place give. Where
// the copies' kernels do not fit the device, a null dout is refused.
TEST_F(FlashAttentionGpuTest, Bf16OutputsAndGradientsGiveTheBitsOfTheirRoundings) {
  for (const int64_t D : {int64_t{64}, int64_t{128}}) {
    const AttentionProblem p = AttentionProblem::Random(2, 200, 4, 2, D, 170 + D, 2.0f);
    SCOPED_TRACE(p.Describe());
    const size_t n_qkv = p.qkv.size(), n_out = p.OutElems();
    DeviceFloats qkv(n_qkv, p.qkv.data()), dout(n_out, p.dout.data());
    DeviceFloats qkv16((n_qkv + 1) / 2), dout16((n_out + 1) / 2), out16((n_out + 1) / 2), rounded((n_out + 1) / 2);
    auto* q16 = reinterpret_cast<uint16_t*>(qkv16.get());
    auto* do16 = reinterpret_cast<uint16_t*>(dout16.get());
    ASSERT_TRUE(Cast(qkv.get(), DType::kFloat32, q16, DType::kBFloat16, n_qkv, nullptr).ok());
    ASSERT_TRUE(Cast(dout.get(), DType::kFloat32, do16, DType::kBFloat16, n_out, nullptr).ok());
    ASSERT_TRUE(Cast(do16, DType::kBFloat16, dout.get(), DType::kFloat32, n_out, nullptr).ok());  // dO rounded
    const auto with_copies = [&](math::AttentionTensors t) {
      t.q16 = q16;
      t.k16 = q16 + (t.k - t.q);
      t.v16 = q16 + (t.v - t.q);
      t.dout16 = do16;
      return t;
    };
    // fp32 O, rounded in place between forward and backward.
    DeviceFloats out_a(n_out), lse_a(p.StatElems()), delta_a(p.StatElems()), dqkv_a(n_qkv);
    const math::AttentionTensors ta =
        with_copies(p.Tensors(qkv.get(), out_a.get(), lse_a.get(), dout.get(), delta_a.get(), dqkv_a.get()));
    ASSERT_TRUE(FlashAttentionForward(p.shape, ta, nullptr).ok());
    auto* r16 = reinterpret_cast<uint16_t*>(rounded.get());
    ASSERT_TRUE(Cast(out_a.get(), DType::kFloat32, r16, DType::kBFloat16, n_out, nullptr).ok());
    ASSERT_TRUE(Cast(r16, DType::kBFloat16, out_a.get(), DType::kFloat32, n_out, nullptr).ok());
    ASSERT_TRUE(FlashAttentionBackward(p.shape, ta, nullptr).ok());
    // O, dO and d(qkv) in bf16 alone.
    DeviceFloats lse_b(p.StatElems()), delta_b(p.StatElems()), dqkv_b((n_qkv + 1) / 2), dqkv_a16((n_qkv + 1) / 2);
    math::AttentionTensors tb =
        with_copies(p.Tensors(qkv.get(), nullptr, lse_b.get(), nullptr, delta_b.get(), dqkv_b.get()));
    tb.out16 = reinterpret_cast<uint16_t*>(out16.get());
    auto* dqkv16 = reinterpret_cast<uint16_t*>(dqkv_b.get());
    tb.dq16 = dqkv16;
    tb.dk16 = dqkv16 + (tb.dk - tb.dq);
    tb.dv16 = dqkv16 + (tb.dv - tb.dq);
    tb.dq = tb.dk = tb.dv = nullptr;
    ASSERT_TRUE(FlashAttentionForward(p.shape, tb, nullptr).ok());
    const Result<bool> fit = FlashAttentionCopiesFit(D);
    ASSERT_TRUE(fit.ok()) << fit.status().ToString();
    const Status st = FlashAttentionBackward(p.shape, tb, nullptr);
    if (!*fit) {
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
      continue;
    }
    ASSERT_TRUE(st.ok()) << st.ToString();
    const std::vector<float> got16 = out16.ToHost(), want16 = rounded.ToHost();
    EXPECT_EQ(0, std::memcmp(got16.data(), want16.data(), n_out * 2));
    const std::vector<float> lse_got = lse_b.ToHost(), lse_want = lse_a.ToHost();
    EXPECT_EQ(0, std::memcmp(lse_got.data(), lse_want.data(), lse_got.size() * sizeof(float)));
    ASSERT_TRUE(Cast(dqkv_a.get(), DType::kFloat32, dqkv_a16.get(), DType::kBFloat16, n_qkv, nullptr).ok());
    const std::vector<float> d_got = dqkv_b.ToHost(), d_want = dqkv_a16.ToHost();
    EXPECT_EQ(0, std::memcmp(d_got.data(), d_want.data(), n_qkv * 2));
  }
}

TEST(FlashAttentionGpuArgsTest, RefusesQueryTilesTheHeadDimCannotTake) {
  AttentionProblem p = AttentionProblem::Random(1, 8, 2, 2, 128, 1);
  std::vector<float> out(p.OutElems()), lse(p.StatElems());
  const math::AttentionTensors t = p.Tensors(p.qkv.data(), out.data(), lse.data(), nullptr, nullptr, nullptr);
  Status st = FlashAttentionForward(p.shape, t, nullptr, 2);  // head_dim 128 takes one tile
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("query_tiles 2"), std::string::npos) << st.ToString();
  p = AttentionProblem::Random(1, 8, 2, 2, 64, 1);
  st = FlashAttentionForward(p.shape, p.Tensors(p.qkv.data(), out.data(), lse.data(), nullptr, nullptr, nullptr),
                             nullptr, 3);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

TEST(FlashAttentionGpuArgsTest, RefusesKvMinBlocksTheHeadDimCannotTake) {
  for (const auto& [D, blocks] : {std::pair<int64_t, int>{64, 2}, {64, 4}, {128, 3}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << D << ", kv_min_blocks " << blocks);
    AttentionProblem p = AttentionProblem::Random(1, 8, 2, 2, D, 1);
    std::vector<float> out(p.OutElems()), lse(p.StatElems()), delta(p.StatElems()), dqkv(p.qkv.size());
    const math::AttentionTensors t =
        p.Tensors(p.qkv.data(), out.data(), lse.data(), p.dout.data(), delta.data(), dqkv.data());
    const Status st = FlashAttentionBackward(p.shape, t, nullptr, blocks);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("kv_min_blocks " + std::to_string(blocks)), std::string::npos) << st.ToString();
  }
}

TEST(FlashAttentionGpuArgsTest, RefusesOtherHeadDims) {
  AttentionProblem p = AttentionProblem::Random(1, 8, 2, 2, 32, 1);
  std::vector<float> out(p.OutElems()), lse(p.StatElems());
  const Status st = FlashAttentionForward(
      p.shape, p.Tensors(p.qkv.data(), out.data(), lse.data(), nullptr, nullptr, nullptr), nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("head_dim 32"), std::string::npos) << st.ToString();
}

// bf16 copies come all together, aligned; refused before any launch.
TEST(FlashAttentionGpuArgsTest, RefusesPartialOrMisalignedCopies) {
  AttentionProblem p = AttentionProblem::Random(1, 8, 2, 2, 64, 1);
  std::vector<float> out(p.OutElems()), lse(p.StatElems()), delta(p.StatElems()), dqkv(p.qkv.size());
  alignas(16) static uint16_t copy[4096];
  math::AttentionTensors t = p.Tensors(p.qkv.data(), out.data(), lse.data(), p.dout.data(), delta.data(), dqkv.data());
  t.q16 = copy;
  t.k16 = copy + 128;
  Status st = FlashAttentionForward(p.shape, t, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("2 of 3 given"), std::string::npos) << st.ToString();

  t.v16 = copy + 256;  // complete for forward, but not for backward (no dout16)
  st = FlashAttentionBackward(p.shape, t, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("3 of 4 given"), std::string::npos) << st.ToString();

  t.v16 = copy + 257;  // 2 bytes past a 16-byte boundary
  st = FlashAttentionForward(p.shape, t, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("v16 must be 16-byte aligned"), std::string::npos) << st.ToString();

  t.v16 = copy + 256;
  t.dout16 = copy + 512;
  t.q_stride = t.kv_stride = p.QkvStride() + 1;  // not a multiple of 8
  st = FlashAttentionBackward(p.shape, t, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("q16 must be 16-byte aligned"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace zinf::gpu
