#include "model/flash_attention.h"

#include <algorithm>
#include <vector>

#include "common/check.h"

namespace zinf::model {
namespace {

constexpr int64_t kBlock = math::kFlashBlock;

int64_t NumBlocks(int64_t seq_len) { return (seq_len + kBlock - 1) / kBlock; }

// Rows [first, first + count) of one head, each D values, rounded as operands.
void LoadRows(std::vector<float>& dst, const float* base, int64_t stride, int64_t row0, int64_t first, int64_t count,
              int64_t D, bool bf16) {
  dst.assign(static_cast<size_t>(kBlock * D), 0.0f);
  for (int64_t r = 0; r < count; ++r) {
    const float* src = base + (row0 + first + r) * stride;
    for (int64_t d = 0; d < D; ++d) dst[static_cast<size_t>(r * D + d)] = math::FlashOperand(src[d], bf16);
  }
}

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

}  // namespace

void FlashAttentionForward(const ModelThreads& th, const math::AttentionShape& s, const math::AttentionTensors& t) {
  ZINF_CHECK_MSG(t.out != nullptr, "the flash attention twin writes fp32 out");
  const int64_t T = s.seq_len, H = s.heads, D = s.head_dim, G = s.heads / s.kv_heads, nb = NumBlocks(T);
  const bool bf16 = th.matmul_dtype() == DType::kBFloat16;
  const float log2_scale = math::FlashLog2Scale(s.scale);
  th.ForChunks(s.batch * H * nb, 1, [&](int64_t task, int64_t) {
    const int64_t qb = task % nb, h = (task / nb) % H, b = task / (nb * H);
    const int64_t row0 = b * T, i0 = qb * kBlock, rows = std::min(kBlock, T - i0);
    std::vector<float> q, k, v;
    LoadRows(q, t.q + h * D, t.q_stride, row0, i0, rows, D, bf16);
    std::vector<float> m(kBlock, -INFINITY), l(kBlock, 0.0f), o(static_cast<size_t>(kBlock * D), 0.0f);
    std::vector<float> sc(kBlock), p(kBlock);
    for (int64_t kb = 0; kb <= qb; ++kb) {
      const int64_t j0 = kb * kBlock, keys = std::min(kBlock, T - j0);
      LoadRows(k, t.k + (h / G) * D, t.kv_stride, row0, j0, keys, D, bf16);
      LoadRows(v, t.v + (h / G) * D, t.kv_stride, row0, j0, keys, D, bf16);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        float row_max = -INFINITY;
        for (int64_t c = 0; c < keys; ++c) {
          if (!math::FlashVisible(i, j0 + c, T)) continue;
          sc[c] = Dot(&q[r * D], &k[c * D], D) * log2_scale;
          row_max = std::max(row_max, sc[c]);
        }
        const float m_new = std::max(m[r], row_max);
        const float alpha = math::FlashRescale(m[r], m_new);
        float sum = 0.0f;
        for (int64_t c = 0; c < keys; ++c) {
          p[c] = math::FlashVisible(i, j0 + c, T) ? math::FlashProb(sc[c], m_new) : 0.0f;
          sum += p[c];
        }
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
        float* orow = &o[r * D];
        for (int64_t d = 0; d < D; ++d) {
          float acc = 0.0f;
          for (int64_t c = 0; c < keys; ++c) acc += math::FlashOperand(p[c], bf16) * v[c * D + d];
          orow[d] = orow[d] * alpha + acc;
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / l[r];
      float* out = t.out + (row0 + i0 + r) * t.out_stride + h * D;
      for (int64_t d = 0; d < D; ++d) out[d] = o[r * D + d] * inv;
      t.lse[(b * H + h) * T + i0 + r] = math::FlashLse(m[r], l[r]);
    }
  });
}

void FlashAttentionBackward(const ModelThreads& th, const math::AttentionShape& s, const math::AttentionTensors& t) {
  ZINF_CHECK_MSG(t.out && t.dout && t.dq && t.dk && t.dv, "the flash attention twin takes fp32 out, dout, dq, dk, dv");
  const int64_t B = s.batch, T = s.seq_len, H = s.heads, D = s.head_dim, G = s.heads / s.kv_heads;
  const int64_t nb = NumBlocks(T);
  const bool bf16 = th.matmul_dtype() == DType::kBFloat16;
  // δ_i = dO_i · O_i, in fp32 as given (no operand rounding: not a product
  // on tensor cores).
  th.ForChunks(B * H, 1, [&](int64_t bh, int64_t) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t i = 0; i < T; ++i) {
      const int64_t row = b * T + i;
      t.delta[bh * T + i] = Dot(t.dout + row * t.out_stride + h * D, t.out + row * t.out_stride + h * D, D);
    }
  });
  // One query row's p and ds against one key row, from the rounded operands.
  const float log2_scale = math::FlashLog2Scale(s.scale);
  struct Grad {
    float p, ds;
  };
  auto grad = [&](const float* q, const float* k, const float* v, const float* dout, float lse, float delta) {
    const float p = math::FlashProb(Dot(q, k, D) * log2_scale, math::FlashLse2(lse));
    return Grad{p, math::FlashScoreGrad(p, Dot(dout, v, D), delta)};
  };
  // dK, dV: one (batch row, kv head, key block) per task, over the group's
  // query heads and the query blocks at or after the key block.
  th.ForChunks(B * s.kv_heads * nb, 1, [&](int64_t task, int64_t) {
    const int64_t kb = task % nb, hk = (task / nb) % s.kv_heads, b = task / (nb * s.kv_heads);
    const int64_t row0 = b * T, j0 = kb * kBlock, keys = std::min(kBlock, T - j0);
    std::vector<float> k, v, q, dout;
    LoadRows(k, t.k + hk * D, t.kv_stride, row0, j0, keys, D, bf16);
    LoadRows(v, t.v + hk * D, t.kv_stride, row0, j0, keys, D, bf16);
    std::vector<float> dk(static_cast<size_t>(kBlock * D), 0.0f), dv(static_cast<size_t>(kBlock * D), 0.0f);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = hk * G + g;
      for (int64_t qb = kb; qb < nb; ++qb) {
        const int64_t i0 = qb * kBlock, rows = std::min(kBlock, T - i0);
        LoadRows(q, t.q + h * D, t.q_stride, row0, i0, rows, D, bf16);
        LoadRows(dout, t.dout + h * D, t.out_stride, row0, i0, rows, D, bf16);
        for (int64_t c = 0; c < keys; ++c) {
          for (int64_t r = 0; r < rows; ++r) {
            if (!math::FlashVisible(i0 + r, j0 + c, T)) continue;
            const int64_t stat = (b * H + h) * T + i0 + r;
            const Grad gr = grad(&q[r * D], &k[c * D], &v[c * D], &dout[r * D], t.lse[stat], t.delta[stat]);
            const float p = math::FlashOperand(gr.p, bf16), ds = math::FlashOperand(gr.ds, bf16);
            for (int64_t d = 0; d < D; ++d) {
              dv[c * D + d] += p * dout[r * D + d];
              dk[c * D + d] += ds * q[r * D + d];
            }
          }
        }
      }
    }
    for (int64_t c = 0; c < keys; ++c) {
      float* dkrow = t.dk + (row0 + j0 + c) * t.kv_stride + hk * D;
      float* dvrow = t.dv + (row0 + j0 + c) * t.kv_stride + hk * D;
      for (int64_t d = 0; d < D; ++d) {
        dkrow[d] = dk[c * D + d] * s.scale;
        dvrow[d] = dv[c * D + d];
      }
    }
  });
  // dQ: one (batch row, head, query block) per task, over the key blocks up
  // to the diagonal.
  th.ForChunks(B * H * nb, 1, [&](int64_t task, int64_t) {
    const int64_t qb = task % nb, h = (task / nb) % H, b = task / (nb * H);
    const int64_t row0 = b * T, i0 = qb * kBlock, rows = std::min(kBlock, T - i0);
    std::vector<float> q, dout, k, v;
    LoadRows(q, t.q + h * D, t.q_stride, row0, i0, rows, D, bf16);
    LoadRows(dout, t.dout + h * D, t.out_stride, row0, i0, rows, D, bf16);
    std::vector<float> dq(static_cast<size_t>(kBlock * D), 0.0f);
    for (int64_t kb = 0; kb <= qb; ++kb) {
      const int64_t j0 = kb * kBlock, keys = std::min(kBlock, T - j0);
      LoadRows(k, t.k + (h / G) * D, t.kv_stride, row0, j0, keys, D, bf16);
      LoadRows(v, t.v + (h / G) * D, t.kv_stride, row0, j0, keys, D, bf16);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t stat = (b * H + h) * T + i0 + r;
        for (int64_t c = 0; c < keys; ++c) {
          if (!math::FlashVisible(i0 + r, j0 + c, T)) continue;
          const Grad gr = grad(&q[r * D], &k[c * D], &v[c * D], &dout[r * D], t.lse[stat], t.delta[stat]);
          const float ds = math::FlashOperand(gr.ds, bf16);
          for (int64_t d = 0; d < D; ++d) dq[r * D + d] += ds * k[c * D + d];
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* dqrow = t.dq + (row0 + i0 + r) * t.q_stride + h * D;
      for (int64_t d = 0; d < D; ++d) dqrow[d] = dq[r * D + d] * s.scale;
    }
  });
}

}  // namespace zinf::model
