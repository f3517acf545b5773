// A random causal-attention problem for the flash attention tests (CPU twin
// and CUDA kernels): a fused [B·T, (H + 2 H_kv)·D] q | k | v tensor, an
// output gradient, and the twin's results.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "math/attention_math.h"
#include "model/flash_attention.h"
#include "model/parallel.h"
#include "test_util.h"

namespace zinf::model::test {

struct AttentionResult {
  std::vector<float> out, lse, dqkv;
};

struct AttentionProblem {
  math::AttentionShape shape;
  std::vector<float> qkv, dout;

  int64_t QkvStride() const { return (shape.heads + 2 * shape.kv_heads) * shape.head_dim; }
  // "B=.. T=.. H=.. Hkv=.. D=..", for traces and printed errors.
  std::string Describe() const {
    return "B=" + std::to_string(shape.batch) + " T=" + std::to_string(shape.seq_len) +
           " H=" + std::to_string(shape.heads) + " Hkv=" + std::to_string(shape.kv_heads) +
           " D=" + std::to_string(shape.head_dim);
  }
  int64_t Tokens() const { return shape.batch * shape.seq_len; }
  size_t OutElems() const { return static_cast<size_t>(Tokens() * shape.heads * shape.head_dim); }
  size_t StatElems() const { return static_cast<size_t>(shape.batch * shape.heads * shape.seq_len); }

  static AttentionProblem Random(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, uint64_t seed,
                                 float range = 1.0f) {
    AttentionProblem p;
    p.shape = {B, T, H, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D))};
    p.qkv.resize(static_cast<size_t>(p.Tokens() * p.QkvStride()));
    p.dout.resize(p.OutElems());
    for (size_t i = 0; i < p.qkv.size(); ++i) p.qkv[i] = Uniform(seed, i, range);
    for (size_t i = 0; i < p.dout.size(); ++i) p.dout[i] = Uniform(seed + 1, i, 1.0f);
    return p;
  }

  // The tensors over buffers laid out as qkv (qkv, dqkv), dout (out, dout)
  // and the [B, H, T] statistics (lse, delta); host or device pointers.
  math::AttentionTensors Tensors(const float* q, float* out, float* lse, const float* d_out, float* delta,
                                 float* dqkv) const {
    const int64_t HD = shape.heads * shape.head_dim, KD = shape.kv_heads * shape.head_dim;
    math::AttentionTensors t;
    t.q = q;
    t.k = q + HD;
    t.v = q + HD + KD;
    t.q_stride = t.kv_stride = QkvStride();
    t.out = out;
    t.out_stride = HD;
    t.lse = lse;
    t.dout = d_out;
    t.delta = delta;
    t.dq = dqkv;
    t.dk = dqkv ? dqkv + HD : nullptr;
    t.dv = dqkv ? dqkv + HD + KD : nullptr;
    return t;
  }

  // The CPU twin's forward and backward.
  AttentionResult Twin(const ModelThreads& th) const {
    AttentionResult r;
    r.out.assign(OutElems(), 0.0f);
    r.lse.assign(StatElems(), 0.0f);
    r.dqkv.assign(qkv.size(), 0.0f);
    std::vector<float> delta(StatElems());
    const math::AttentionTensors t =
        Tensors(qkv.data(), r.out.data(), r.lse.data(), dout.data(), delta.data(), r.dqkv.data());
    FlashAttentionForward(th, shape, t);
    FlashAttentionBackward(th, shape, t);
    return r;
  }

  static float Uniform(uint64_t seed, size_t i, float range) {
    const uint64_t bits = zinf::test::SplitMix64(seed * 0x9e3779b97f4a7c15ull ^ i);
    return range * (2.0f * static_cast<float>(bits >> 40) / 16777216.0f - 1.0f);
  }
};

// max |a - b| over max |b| (1 when b is all zero): the error relative to the
// tensor's scale.
inline double ScaledMaxError(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return err / (scale > 0 ? scale : 1.0);
}

// got's out, lse and dqkv against the twin's, each error printed and at
// most `tolerance` (a result without dqkv is only compared forward).
inline void ExpectCloseToTwin(const AttentionProblem& p, const AttentionResult& got, const AttentionResult& twin,
                              double tolerance) {
  const double e_out = ScaledMaxError(got.out, twin.out), e_lse = ScaledMaxError(got.lse, twin.lse);
  const double e_grad = got.dqkv.empty() ? 0.0 : ScaledMaxError(got.dqkv, twin.dqkv);
  std::printf("  %s: error out %.2e lse %.2e dqkv %.2e\n", p.Describe().c_str(), e_out, e_lse, e_grad);
  EXPECT_LE(e_out, tolerance);
  EXPECT_LE(e_lse, tolerance);
  EXPECT_LE(e_grad, tolerance);
}

}  // namespace zinf::model::test
