// The layer kernels. Hot loops are written so GCC vectorises them at -O3
// without reassociating (there is no -ffast-math): row sums use 16 fixed
// lanes combined in a fixed order, so a sum never depends on the vector
// width the compiler chose, only on the row.
#include "model/layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "model/gemm.h"
#include "math/gpt_math.h"
#include "math/lane_math.h"

namespace zinf::model {
namespace {

// Rows per chunk for row-wise kernels: about 64 KiB of fp32 per chunk.
int64_t RowGrain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }
// Columns per chunk for column sums: a cache line of doubles or two of floats.
constexpr int64_t kColumnGrain = 64;
// Elements per chunk for elementwise kernels.
constexpr int64_t kElemGrain = 32768;

template <class F>
F LaneSum(const F* x, int64_t n) {
  F acc[math::kLanes] = {};
  int64_t i = 0;
  for (; i + math::kLanes <= n; i += math::kLanes) {
    for (int j = 0; j < math::kLanes; ++j) acc[j] += x[i + j];
  }
  F tail = 0;
  for (; i < n; ++i) tail += x[i];
  F s = 0;
  for (int j = 0; j < math::kLanes; ++j) s += acc[j];
  return s + tail;
}

// Σ (x - mean)², the second pass of the variance.
template <class F>
F LaneSumSquaredDeviation(const F* x, F mean, int64_t n) {
  F acc[math::kLanes] = {};
  int64_t i = 0;
  for (; i + math::kLanes <= n; i += math::kLanes) {
    for (int j = 0; j < math::kLanes; ++j) {
      const F d = x[i + j] - mean;
      acc[j] += d * d;
    }
  }
  F tail = 0;
  for (; i < n; ++i) tail += (x[i] - mean) * (x[i] - mean);
  F s = 0;
  for (int j = 0; j < math::kLanes; ++j) s += acc[j];
  return s + tail;
}

}  // namespace

template <class F>
void EncoderForward(const ModelThreads& th, F* out, const int32_t* tokens, const F* wte, const F* wpe, int64_t batch,
                    int64_t seq_len, int64_t channels) {
  const int64_t C = channels;
  th.ForChunks(batch * seq_len, RowGrain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const F* te = wte + static_cast<int64_t>(tokens[r]) * C;
      F* o = out + r * C;
      if (!wpe) {
        for (int64_t c = 0; c < C; ++c) o[c] = te[c];
        continue;
      }
      const F* pe = wpe + (r % seq_len) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = te[c] + pe[c];
    }
  });
}

template <class F>
void EncoderBackward(const ModelThreads& th, F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int64_t batch,
                     int64_t seq_len, int64_t channels) {
  const int64_t C = channels, rows = batch * seq_len;
  // By column ranges: one thread owns columns [c0, c1) of every row of dwte
  // and dwpe, and adds the rows in order, so repeated tokens add up the same
  // way every time.
  th.ForChunks(C, kColumnGrain, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < rows; ++r) {
      const F* d = dout + r * C;
      F* te = dwte + static_cast<int64_t>(tokens[r]) * C;
      for (int64_t c = c0; c < c1; ++c) te[c] += d[c];
      if (!dwpe) continue;
      F* pe = dwpe + (r % seq_len) * C;
      for (int64_t c = c0; c < c1; ++c) pe[c] += d[c];
    }
  });
}

template <class F>
void LayerNormForward(const ModelThreads& th, F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b,
                      int64_t rows, int64_t channels) {
  const int64_t C = channels;
  th.ForChunks(rows, RowGrain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const F* x = inp + r * C;
      const F m = LaneSum(x, C) / static_cast<F>(C);
      const F s = math::LayerNormRstd(LaneSumSquaredDeviation(x, m, C) / static_cast<F>(C));
      F* o = out + r * C;
      for (int64_t c = 0; c < C; ++c) o[c] = math::LayerNormAffine(math::LayerNormNormalize(x[c], m, s), w[c], b[c]);
      mean[r] = m;
      rstd[r] = s;
    }
  });
}

template <class F>
void LayerNormBackward(const ModelThreads& th, F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w,
                       const F* mean, const F* rstd, int64_t rows, int64_t channels) {
  const int64_t C = channels;
  th.ForChunks(rows, RowGrain(C), [&](int64_t r0, int64_t r1) {
    F g[math::kLanes], gx[math::kLanes];
    for (int64_t r = r0; r < r1; ++r) {
      const F* x = inp + r * C;
      const F* dy = dout + r * C;
      const F m = mean[r], s = rstd[r];
      // Row means of g = dy · w and of g · x̂, in 16 lanes.
      for (int j = 0; j < math::kLanes; ++j) g[j] = gx[j] = 0;
      int64_t c = 0;
      for (; c + math::kLanes <= C; c += math::kLanes) {
        for (int j = 0; j < math::kLanes; ++j) {
          const F gj = dy[c + j] * w[c + j];
          g[j] += gj;
          gx[j] += gj * math::LayerNormNormalize(x[c + j], m, s);
        }
      }
      F sum_g = 0, sum_gx = 0;
      for (; c < C; ++c) {
        const F gj = dy[c] * w[c];
        sum_g += gj;
        sum_gx += gj * math::LayerNormNormalize(x[c], m, s);
      }
      F lanes_g = 0, lanes_gx = 0;
      for (int j = 0; j < math::kLanes; ++j) {
        lanes_g += g[j];
        lanes_gx += gx[j];
      }
      const F mean_g = (lanes_g + sum_g) / static_cast<F>(C);
      const F mean_gx = (lanes_gx + sum_gx) / static_cast<F>(C);
      F* dx = dinp + r * C;
      for (c = 0; c < C; ++c) {
        dx[c] += math::LayerNormInputGrad(dy[c] * w[c], math::LayerNormNormalize(x[c], m, s), mean_g, mean_gx, s);
      }
    }
  });
  const int64_t chunk = math::ColumnChunkRows(rows);  // lane_math.h: the CUDA kernel's order
  th.ForChunks(C, kColumnGrain, [&](int64_t c0, int64_t c1) {
    F acc_w[kColumnGrain] = {}, acc_b[kColumnGrain] = {};
    const int64_t n = c1 - c0;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      F part_w[kColumnGrain] = {}, part_b[kColumnGrain] = {};
      for (int64_t r = r0; r < std::min(rows, r0 + chunk); ++r) {
        const F* x = inp + r * C + c0;
        const F* dy = dout + r * C + c0;
        const F m = mean[r], s = rstd[r];
        for (int64_t j = 0; j < n; ++j) {
          part_w[j] += dy[j] * math::LayerNormNormalize(x[j], m, s);
          part_b[j] += dy[j];
        }
      }
      for (int64_t j = 0; j < n; ++j) {
        acc_w[j] += part_w[j];
        acc_b[j] += part_b[j];
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      dw[c0 + j] += acc_w[j];
      db[c0 + j] += acc_b[j];
    }
  });
}

template <class F>
void ColumnSumAccumulate(const ModelThreads& th, F* out, const F* x, int64_t rows, int64_t cols) {
  const int64_t chunk = math::ColumnChunkRows(rows);  // lane_math.h: the CUDA kernel's order
  th.ForChunks(cols, kColumnGrain, [&](int64_t c0, int64_t c1) {
    F acc[kColumnGrain] = {};
    const int64_t n = c1 - c0;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      F part[kColumnGrain] = {};
      for (int64_t r = r0; r < std::min(rows, r0 + chunk); ++r) {
        const F* xr = x + r * cols + c0;
        for (int64_t j = 0; j < n; ++j) part[j] += xr[j];
      }
      for (int64_t j = 0; j < n; ++j) acc[j] += part[j];
    }
    for (int64_t j = 0; j < n; ++j) out[c0 + j] += acc[j];
  });
}

template <class F>
void LinearForward(const ModelThreads& th, F* out, const F* inp, const F* w, const F* bias, int64_t rows,
                   int64_t in_dim, int64_t out_dim) {
  if (bias) {
    th.ForChunks(rows, RowGrain(out_dim), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::memcpy(out + r * out_dim, bias, sizeof(F) * out_dim);
    });
  }
  ParallelGemm<F>(th, false, false, rows, out_dim, in_dim, F(1), inp, in_dim, w, out_dim, bias ? F(1) : F(0), out,
                  out_dim);
}

template <class F>
void LinearBackward(const ModelThreads& th, F* dinp, bool accumulate_dinp, F* dw, F* dbias, const F* dout, const F* inp,
                    const F* w, int64_t rows, int64_t in_dim, int64_t out_dim) {
  ParallelGemm<F>(th, false, true, rows, in_dim, out_dim, F(1), dout, out_dim, w, out_dim,
                  accumulate_dinp ? F(1) : F(0), dinp, in_dim);
  ParallelGemm<F>(th, true, false, in_dim, out_dim, rows, F(1), inp, in_dim, dout, out_dim, F(1), dw, out_dim);
  if (dbias) ColumnSumAccumulate(th, dbias, dout, rows, out_dim);
}

void LinearBackward(const ModelThreads& th, float* dinp, bool accumulate_dinp, float* dw, float* dbias,
                    const float* dout, const uint16_t* inp, const float* w, int64_t rows, int64_t in_dim,
                    int64_t out_dim) {
  ParallelGemm<float>(th, false, true, rows, in_dim, out_dim, 1.0f, dout, out_dim, w, out_dim,
                      accumulate_dinp ? 1.0f : 0.0f, dinp, in_dim);
  ParallelGemmBf16A(th, true, false, in_dim, out_dim, rows, 1.0f, inp, in_dim, dout, out_dim, 1.0f, dw, out_dim);
  if (dbias) ColumnSumAccumulate(th, dbias, dout, rows, out_dim);
}

template <class F>
void AttentionForward(const ModelThreads& th, F* out, F* att, const F* qkv, int64_t batch, int64_t seq_len,
                      int64_t num_heads, int64_t kv_heads, int64_t head_dim) {
  const int64_t T = seq_len, H = num_heads, D = head_dim, Q = H * D, K = kv_heads * D, S = Q + 2 * K;
  const int64_t group = H / kv_heads;
  const F scale = F(1) / std::sqrt(static_cast<F>(D));
  // One (batch, head) per chunk: two small products and T softmax rows.
  th.ForChunks(batch * H, 1, [&](int64_t bh, int64_t) {
    const int64_t b = bh / H, h = bh % H;
    const F* q = qkv + b * T * S + h * D;
    const F* k = qkv + b * T * S + Q + (h / group) * D;
    const F* v = k + K;
    F* a = att + bh * T * T;
    OperandGemm<F>(th.matmul_dtype(), false, true, T, T, D, scale, q, S, k, S, F(0), a, T);
    for (int64_t i = 0; i < T; ++i) math::CausalSoftmaxRow(a + i * T, i, T);
    OperandGemm<F>(th.matmul_dtype(), false, false, T, D, T, F(1), a, T, v, S, F(0), out + b * T * Q + h * D, Q);
  });
}

template <class F>
void AttentionBackward(const ModelThreads& th, F* dqkv, F* datt, const F* dout, const F* qkv, const F* att,
                       int64_t batch, int64_t seq_len, int64_t num_heads, int64_t kv_heads, int64_t head_dim) {
  const int64_t T = seq_len, H = num_heads, D = head_dim, Q = H * D, K = kv_heads * D, S = Q + 2 * K;
  const int64_t group = H / kv_heads;
  const F scale = F(1) / std::sqrt(static_cast<F>(D));
  // One (batch, key/value head) per chunk: its group's query heads in order,
  // the first overwriting dk and dv and the others adding to them.
  th.ForChunks(batch * kv_heads, 1, [&](int64_t bg, int64_t) {
    const int64_t b = bg / kv_heads, kvh = bg % kv_heads;
    const F* k = qkv + b * T * S + Q + kvh * D;
    const F* v = k + K;
    F* dk = dqkv + b * T * S + Q + kvh * D;
    F* dv = dk + K;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      const int64_t bh = b * H + h;
      const F beta = h == kvh * group ? F(0) : F(1);
      const F* q = qkv + b * T * S + h * D;
      F* dq = dqkv + b * T * S + h * D;
      const F* a = att + bh * T * T;
      const F* dy = dout + b * T * Q + h * D;
      F* da = datt + bh * T * T;
      OperandGemm<F>(th.matmul_dtype(), false, true, T, T, D, F(1), dy, Q, v, S, F(0), da, T);  // datt = dy · vᵀ
      OperandGemm<F>(th.matmul_dtype(), true, false, T, D, T, F(1), a, T, dy, Q, beta, dv, S);  // dv (+)= attᵀ · dy
      // Through the softmax (causal prefix only), with the 1/sqrt(D) of the
      // scores folded in: da becomes d(q kᵀ).
      for (int64_t i = 0; i < T; ++i) math::CausalSoftmaxBackwardRow(a + i * T, da + i * T, i, T, scale);
      OperandGemm<F>(th.matmul_dtype(), false, false, T, D, T, F(1), da, T, k, S, F(0), dq, S);  // dq = d(q kᵀ) · k
      OperandGemm<F>(th.matmul_dtype(), true, false, T, D, T, F(1), da, T, q, S, beta, dk, S);  // dk (+)= d(q kᵀ)ᵀ · q
    }
  });
}

template <class F>
void AttentionForward(const ModelThreads& th, F* out, F* att, const F* qkv, int64_t batch, int64_t seq_len,
                      int64_t channels, int64_t num_heads) {
  AttentionForward(th, out, att, qkv, batch, seq_len, num_heads, num_heads, channels / num_heads);
}

template <class F>
void AttentionBackward(const ModelThreads& th, F* dqkv, F* datt, const F* dout, const F* qkv, const F* att,
                       int64_t batch, int64_t seq_len, int64_t channels, int64_t num_heads) {
  AttentionBackward(th, dqkv, datt, dout, qkv, att, batch, seq_len, num_heads, num_heads, channels / num_heads);
}

template <class F>
void GeluForward(const ModelThreads& th, F* out, const F* inp, int64_t n) {
  th.ForChunks(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = math::Gelu(inp[i]);
  });
}

template <class F>
void GeluBackward(const ModelThreads& th, F* dinp, const F* inp, const F* dout, int64_t n) {
  th.ForChunks(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dinp[i] = math::GeluGrad(inp[i]) * dout[i];
  });
}

template <class F>
void ResidualForward(const ModelThreads& th, F* out, const F* a, const F* b, int64_t n) {
  th.ForChunks(n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

template <class F>
int64_t SoftmaxCrossEntropyForward(const ModelThreads& th, F* probs, F* losses, const F* logits, const int32_t* targets,
                                   int64_t rows, int64_t vocab) {
  const int64_t V = vocab;
  th.ForChunks(rows, RowGrain(V), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const F* x = logits + r * V;
      F* p = probs + r * V;
      const F row_max = math::LaneMax(x, V);
      const int32_t t = targets[r];
      // Read the target's logit before the in-place softmax overwrites it.
      const F target_logit = t >= 0 ? x[t] : F(0);
      const F sum = math::LaneExpSum(p, x, row_max, V);
      const F inv_sum = F(1) / sum;
      for (int64_t j = 0; j < V; ++j) p[j] *= inv_sum;
      losses[r] = t >= 0 ? math::CrossEntropyLoss(row_max, sum, target_logit) : F(0);
    }
  });
  int64_t valid = 0;
  for (int64_t r = 0; r < rows; ++r) valid += targets[r] >= 0;
  return valid;
}

template <class F>
void SoftmaxCrossEntropyBackward(const ModelThreads& th, F* dlogits, const F* probs, const int32_t* targets,
                                 int64_t rows, int64_t vocab, F scale) {
  const int64_t V = vocab;
  th.ForChunks(rows, RowGrain(V), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const F* p = probs + r * V;
      F* d = dlogits + r * V;
      const int32_t t = targets[r];
      if (t < 0) {
        std::memset(d, 0, sizeof(F) * V);
        continue;
      }
      const F p_target = p[t];  // d may be p: read before overwriting
      for (int64_t j = 0; j < V; ++j) d[j] = math::CrossEntropyLogitGrad(p[j], false, scale);
      d[t] = math::CrossEntropyLogitGrad(p_target, true, scale);
    }
  });
}

#define ZINF_MODEL_INSTANTIATE_LAYERS(F)                                                                              \
  template void EncoderForward<F>(const ModelThreads&, F*, const int32_t*, const F*, const F*, int64_t, int64_t,      \
                                  int64_t);                                                                           \
  template void EncoderBackward<F>(const ModelThreads&, F*, F*, const F*, const int32_t*, int64_t, int64_t, int64_t); \
  template void LayerNormForward<F>(const ModelThreads&, F*, F*, F*, const F*, const F*, const F*, int64_t, int64_t); \
  template void LayerNormBackward<F>(const ModelThreads&, F*, F*, F*, const F*, const F*, const F*, const F*,         \
                                     const F*, int64_t, int64_t);                                                     \
  template void LinearForward<F>(const ModelThreads&, F*, const F*, const F*, const F*, int64_t, int64_t, int64_t);   \
  template void LinearBackward<F>(const ModelThreads&, F*, bool, F*, F*, const F*, const F*, const F*, int64_t,       \
                                  int64_t, int64_t);                                                                  \
  template void AttentionForward<F>(const ModelThreads&, F*, F*, const F*, int64_t, int64_t, int64_t, int64_t);       \
  template void AttentionBackward<F>(const ModelThreads&, F*, F*, const F*, const F*, const F*, int64_t, int64_t,     \
                                     int64_t, int64_t);                                                               \
  template void AttentionForward<F>(const ModelThreads&, F*, F*, const F*, int64_t, int64_t, int64_t, int64_t,        \
                                    int64_t);                                                                         \
  template void AttentionBackward<F>(const ModelThreads&, F*, F*, const F*, const F*, const F*, int64_t, int64_t,     \
                                     int64_t, int64_t, int64_t);                                                      \
  template void GeluForward<F>(const ModelThreads&, F*, const F*, int64_t);                                           \
  template void GeluBackward<F>(const ModelThreads&, F*, const F*, const F*, int64_t);                                \
  template void ResidualForward<F>(const ModelThreads&, F*, const F*, const F*, int64_t);                             \
  template int64_t SoftmaxCrossEntropyForward<F>(const ModelThreads&, F*, F*, const F*, const int32_t*, int64_t,      \
                                                 int64_t);                                                            \
  template void SoftmaxCrossEntropyBackward<F>(const ModelThreads&, F*, const F*, const int32_t*, int64_t, int64_t,   \
                                               F);                                                                    \
  template void ColumnSumAccumulate<F>(const ModelThreads&, F*, const F*, int64_t, int64_t);

ZINF_MODEL_INSTANTIATE_LAYERS(float)
ZINF_MODEL_INSTANTIATE_LAYERS(double)

}  // namespace zinf::model
