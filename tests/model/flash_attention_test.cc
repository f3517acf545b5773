// The CPU flash attention (model/flash_attention.h) against the plain
// attention of model/layers.h, which materializes the T × T scores.
//
// Tolerances (error = max |flash - plain| / max |plain| per tensor):
//   fp32 operands: 2e-5. Both compute the same sums in fp32 in another
//     order (blocks of 64 keys with a running max, against whole rows), a
//     few ulp per element.
//   bf16 operands: 2e-2 against the fp32 plain attention. q, k, v, dO, p
//     and ds are rounded to bf16 (relative error 2^-9 each) before their
//     products; a few such roundings compound in the gradients.
//   the log-sum-exp: 1e-5 absolute against a double-precision evaluation.
#include "model/flash_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "model/attention_problem.h"
#include "model/layers.h"

namespace zinf::model {
namespace {

using test::AttentionProblem;
using test::AttentionResult;
using test::ScaledMaxError;

// The plain attention on the problem, with the kv heads repeated for each
// query head of their group, and dK, dV summed back over the group.
AttentionResult Plain(const AttentionProblem& p, const ModelThreads& th) {
  const int64_t B = p.shape.batch, T = p.shape.seq_len, H = p.shape.heads, Hkv = p.shape.kv_heads;
  const int64_t D = p.shape.head_dim, G = H / Hkv, C = H * D, BT = B * T, S = p.QkvStride();
  std::vector<float> full(static_cast<size_t>(BT * 3 * C));
  for (int64_t r = 0; r < BT; ++r) {
    const float* src = &p.qkv[r * S];
    float* dst = &full[r * 3 * C];
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < D; ++d) {
        dst[h * D + d] = src[h * D + d];
        dst[C + h * D + d] = src[C + (h / G) * D + d];
        dst[2 * C + h * D + d] = src[C + Hkv * D + (h / G) * D + d];
      }
    }
  }
  AttentionResult r;
  r.out.assign(p.OutElems(), 0.0f);
  std::vector<float> att(static_cast<size_t>(B * H * T * T)), datt(att.size()), dfull(full.size());
  AttentionForward<float>(th, r.out.data(), att.data(), full.data(), B, T, C, H);
  AttentionBackward<float>(th, dfull.data(), datt.data(), p.dout.data(), full.data(), att.data(), B, T, C, H);
  r.dqkv.assign(p.qkv.size(), 0.0f);
  for (int64_t row = 0; row < BT; ++row) {
    const float* src = &dfull[row * 3 * C];
    float* dst = &r.dqkv[row * S];
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < D; ++d) {
        dst[h * D + d] = src[h * D + d];
        dst[C + (h / G) * D + d] += src[C + h * D + d];
        dst[C + Hkv * D + (h / G) * D + d] += src[2 * C + h * D + d];
      }
    }
  }
  return r;
}

struct Case {
  int64_t B, T, H, Hkv, D;
};

void ExpectCloseToPlain(const Case& c, DType operands, double tolerance) {
  SCOPED_TRACE(::testing::Message() << "B=" << c.B << " T=" << c.T << " H=" << c.H << " Hkv=" << c.Hkv << " D=" << c.D
                                    << " operands " << DTypeName(operands));
  const AttentionProblem p = AttentionProblem::Random(c.B, c.T, c.H, c.Hkv, c.D, 17 + c.T + c.D);
  const AttentionResult flash = p.Twin(ModelThreads(2, operands));
  const AttentionResult plain = Plain(p, ModelThreads(2));
  EXPECT_LE(ScaledMaxError(flash.out, plain.out), tolerance);
  EXPECT_LE(ScaledMaxError(flash.dqkv, plain.dqkv), tolerance);
  // dq, dk and dv each non-trivial: the gradient is not all zero.
  double norm = 0;
  for (float x : flash.dqkv) norm += std::fabs(x);
  EXPECT_GT(norm, 0.0);
}

TEST(FlashAttentionTest, MatchesPlainAttentionInFp32) {
  for (const Case& c : {Case{2, 100, 3, 3, 16}, Case{1, 64, 2, 2, 64}, Case{1, 5, 1, 1, 8}, Case{1, 130, 2, 2, 128},
                        Case{1, 192, 1, 1, 24}}) {
    ExpectCloseToPlain(c, DType::kFloat32, 2e-5);
  }
}

TEST(FlashAttentionTest, GroupedQueryHeadsMatchRepeatedKeyValueHeads) {
  for (const Case& c : {Case{2, 100, 4, 2, 16}, Case{1, 70, 4, 1, 32}, Case{1, 129, 6, 3, 64}}) {
    ExpectCloseToPlain(c, DType::kFloat32, 2e-5);
  }
}

TEST(FlashAttentionTest, Bf16OperandsStayWithinTheirRounding) {
  for (const Case& c : {Case{2, 100, 2, 1, 64}, Case{1, 200, 2, 2, 128}}) ExpectCloseToPlain(c, DType::kBFloat16, 2e-2);
  // And the rounding happens: bf16 operands do not give fp32's bits.
  const AttentionProblem p = AttentionProblem::Random(1, 80, 2, 2, 64, 5);
  EXPECT_NE(p.Twin(ModelThreads(1, DType::kBFloat16)).out, p.Twin(ModelThreads(1)).out);
}

TEST(FlashAttentionTest, LogSumExpIsTheRowsNormalizer) {
  const AttentionProblem p = AttentionProblem::Random(2, 150, 2, 1, 32, 9, 3.0f);
  const AttentionResult r = p.Twin(ModelThreads(1));
  const auto& s = p.shape;
  const int64_t S = p.QkvStride();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.seq_len; i += 7) {
        double sum = 0;
        const float* q = &p.qkv[(b * s.seq_len + i) * S + h * s.head_dim];
        for (int64_t j = 0; j <= i; ++j) {
          const float* k = &p.qkv[(b * s.seq_len + j) * S + s.heads * s.head_dim];
          double dot = 0;
          for (int64_t d = 0; d < s.head_dim; ++d) dot += static_cast<double>(q[d]) * k[d];
          sum += std::exp(dot * s.scale);
        }
        EXPECT_NEAR(r.lse[(b * s.heads + h) * s.seq_len + i], std::log(sum), 1e-5) << b << "," << h << "," << i;
      }
    }
  }
}

TEST(FlashAttentionTest, ResultsDoNotDependOnTheThreadCount) {
  const AttentionProblem p = AttentionProblem::Random(2, 150, 4, 2, 32, 3);
  for (DType operands : {DType::kFloat32, DType::kBFloat16}) {
    const AttentionResult one = p.Twin(ModelThreads(1, operands));
    const AttentionResult three = p.Twin(ModelThreads(3, operands));
    EXPECT_EQ(0, std::memcmp(one.out.data(), three.out.data(), one.out.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.dqkv.data(), three.dqkv.data(), one.dqkv.size() * sizeof(float)));
  }
}

TEST(FlashAttentionTest, ShapeCheckNamesTheProblem) {
  const AttentionProblem p = AttentionProblem::Random(1, 8, 4, 2, 8, 1);
  std::vector<float> out(p.OutElems()), lse(p.StatElems());
  math::AttentionTensors t = p.Tensors(p.qkv.data(), out.data(), lse.data(), nullptr, nullptr, nullptr);
  EXPECT_TRUE(math::CheckAttentionShape(p.shape, t, false).ok());
  Status st = math::CheckAttentionShape(p.shape, t, true);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("dout"), std::string::npos) << st.message();
  math::AttentionShape bad = p.shape;
  bad.kv_heads = 3;
  st = math::CheckAttentionShape(bad, t, false);
  EXPECT_NE(st.message().find("kv_heads 3 does not divide heads 4"), std::string::npos) << st.message();
  t.q_stride = 16;
  EXPECT_EQ(math::CheckAttentionShape(p.shape, t, false).code(), StatusCode::kInvalidArgument);
  // O and dO may come in bf16 alone (out16, dout16: the CUDA kernels'), not
  // in neither.
  t = p.Tensors(p.qkv.data(), nullptr, lse.data(), nullptr, lse.data(), out.data());
  st = math::CheckAttentionShape(p.shape, t, false);
  EXPECT_NE(st.message().find("null q, k, v, out (and out16) or lse"), std::string::npos) << st.message();
  std::vector<uint16_t> o16(p.OutElems());
  t.out16 = o16.data();
  EXPECT_TRUE(math::CheckAttentionShape(p.shape, t, false).ok());
  st = math::CheckAttentionShape(p.shape, t, true);
  EXPECT_NE(st.message().find("null dout (and dout16)"), std::string::npos) << st.message();
  t.dout16 = o16.data();
  EXPECT_TRUE(math::CheckAttentionShape(p.shape, t, true).ok())
      << math::CheckAttentionShape(p.shape, t, true).ToString();
}

}  // namespace
}  // namespace zinf::model
