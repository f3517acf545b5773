// The Llama family's layer kernels (decoder_layers.h). Row kernels split by
// rows; the RMSNorm weight gradient sums columns in ColumnChunkRows chunks,
// as LayerNorm's does, so the CUDA kernels can give the same bits.
#include "model/decoder_layers.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "common/check.h"
#include "common/float16.h"
#include "math/decoder_math.h"
#include "math/lane_math.h"

namespace zinf::model {
namespace {

int64_t RowGrain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }
constexpr int64_t kColumnGrain = 64;

}  // namespace

template <class F>
void RmsNormForward(const ModelThreads& th, F* out, F* rstd, const F* inp, const F* w, const RowSet& rows, F eps) {
  const int64_t n = rows.n;
  th.ForChunks(rows.rows, RowGrain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t at = rows.Offset(r);
      rstd[r] = math::RmsNormRow(out + at, inp + at, w, n, eps);
    }
  });
}

template <class F>
void RmsNormBackward(const ModelThreads& th, F* dinp, bool accumulate_dinp, F* dw, const F* dout, const F* inp,
                     const F* w, const F* rstd, const RowSet& rows) {
  const int64_t n = rows.n, R = rows.rows;
  // dw first: with dinp == dout the row pass overwrites dout.
  const int64_t chunk = math::ColumnChunkRows(R);
  th.ForChunks(n, kColumnGrain, [&](int64_t c0, int64_t c1) {
    F acc[kColumnGrain] = {};
    const int64_t m = c1 - c0;
    for (int64_t r0 = 0; r0 < R; r0 += chunk) {
      F part[kColumnGrain] = {};
      for (int64_t r = r0; r < std::min(R, r0 + chunk); ++r) {
        const F* x = inp + rows.Offset(r) + c0;
        const F* dy = dout + rows.Offset(r) + c0;
        const F s = rstd[r];
        for (int64_t j = 0; j < m; ++j) part[j] += dy[j] * (x[j] * s);
      }
      for (int64_t j = 0; j < m; ++j) acc[j] += part[j];
    }
    for (int64_t j = 0; j < m; ++j) dw[c0 + j] += acc[j];
  });
  th.ForChunks(R, RowGrain(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t at = rows.Offset(r);
      const F* x = inp + at;
      const F* dy = dout + at;
      F* dx = dinp + at;
      const F s = rstd[r];
      const F dot = math::RmsNormGradDot(dy, x, w, s, n);
      for (int64_t i = 0; i < n; ++i) {
        const F g = math::RmsNormInputGrad(dy[i], w[i], x[i], s, dot, n);
        dx[i] = accumulate_dinp ? dx[i] + g : g;
      }
    }
  });
}

std::vector<float> RopeInverseFrequencies(const GptConfig& c) {
  const int64_t D = c.head_dim(), half = D / 2;
  const float theta = static_cast<float>(c.rope_theta);
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(D);
    inv[i] = 1.0f / std::pow(theta, exponent);
  }
  const RopeScaling& s = c.rope_scaling;
  if (!s.llama3) return inv;
  const float factor = static_cast<float>(s.factor), low = static_cast<float>(s.low_freq_factor);
  const float high = static_cast<float>(s.high_freq_factor);
  const float old_len = static_cast<float>(s.original_max_position);
  const float low_wavelen = old_len / low, high_wavelen = old_len / high;
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  for (float& f : inv) {
    const float wavelen = two_pi / f;
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
      const float smooth = (old_len / wavelen - low) / (high - low);
      f = (1.0f - smooth) * scaled / factor + smooth * scaled;
    } else {
      f = scaled;
    }
  }
  return inv;
}

RopeTable RopeTable::For(const GptConfig& c, int64_t seq_len) {
  RopeTable t;
  t.seq_len = seq_len;
  t.half = c.head_dim() / 2;
  const std::vector<float> inv = RopeInverseFrequencies(c);
  t.cos.resize(static_cast<size_t>(seq_len * t.half));
  t.sin.resize(t.cos.size());
  for (int64_t p = 0; p < seq_len; ++p) {
    for (int64_t i = 0; i < t.half; ++i) {
      const float angle = static_cast<float>(p) * inv[i];
      t.cos[p * t.half + i] = std::cos(angle);
      t.sin[p * t.half + i] = std::sin(angle);
    }
  }
  return t;
}

namespace {

// Rotates the rows in place: forward, or the transposed rotation.
template <class F, bool kBackward>
void RopeRows(const ModelThreads& th, F* x, const RowSet& rows, int64_t seq_len, const RopeTable& table) {
  const int64_t half = rows.n / 2;
  ZINF_CHECK(half == table.half && seq_len <= table.seq_len);
  th.ForChunks(rows.rows, RowGrain(rows.n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      F* v = x + rows.Offset(r);
      const int64_t t = (r / rows.per_token) % seq_len;
      const float* cs = table.cos.data() + t * half;
      const float* sn = table.sin.data() + t * half;
      for (int64_t i = 0; i < half; ++i) {
        if constexpr (kBackward) {
          math::RopeRotateBack<F>(v[i], v[i + half], F(cs[i]), F(sn[i]));
        } else {
          math::RopeRotate<F>(v[i], v[i + half], F(cs[i]), F(sn[i]));
        }
      }
    }
  });
}

}  // namespace

template <class F>
void RopeForward(const ModelThreads& th, F* x, const RowSet& rows, int64_t seq_len, const RopeTable& table) {
  RopeRows<F, false>(th, x, rows, seq_len, table);
}

template <class F>
void RopeBackward(const ModelThreads& th, F* dx, const RowSet& rows, int64_t seq_len, const RopeTable& table) {
  RopeRows<F, true>(th, dx, rows, seq_len, table);
}

template <class F>
void SwiGluForward(const ModelThreads& th, F* out, const F* inp, int64_t rows, int64_t inter) {
  th.ForChunks(rows, RowGrain(2 * inter), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const F* gate = inp + r * 2 * inter;
      const F* up = gate + inter;
      F* o = out + r * inter;
      for (int64_t i = 0; i < inter; ++i) o[i] = math::SwiGlu(gate[i], up[i]);
    }
  });
}

namespace {

// An fc output element's value: as stored, or bf16 bits widened.
template <class F>
F InputValue(F x) {
  return x;
}
float InputValue(uint16_t bits) { return Bf16BitsToFloat(bits); }

// SwiGluBackward over an fc output stored as X (F, or bf16 bits).
template <class F, class X>
void SwiGluBackwardOf(const ModelThreads& th, F* dinp, const X* inp, const F* dout, int64_t rows, int64_t inter) {
  th.ForChunks(rows, RowGrain(2 * inter), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const X* gate = inp + r * 2 * inter;
      const X* up = gate + inter;
      const F* dy = dout + r * inter;
      F* dgate = dinp + r * 2 * inter;
      F* dup = dgate + inter;
      for (int64_t i = 0; i < inter; ++i) {
        math::SwiGluGrad<F>(InputValue(gate[i]), InputValue(up[i]), dy[i], dgate[i], dup[i]);
      }
    }
  });
}

}  // namespace

template <class F>
void SwiGluBackward(const ModelThreads& th, F* dinp, const F* inp, const F* dout, int64_t rows, int64_t inter) {
  SwiGluBackwardOf(th, dinp, inp, dout, rows, inter);
}

void SwiGluBackward(const ModelThreads& th, float* dinp, const uint16_t* inp, const float* dout, int64_t rows,
                    int64_t inter) {
  SwiGluBackwardOf(th, dinp, inp, dout, rows, inter);
}

#define ZINF_MODEL_INSTANTIATE_DECODER_LAYERS(F)                                                              \
  template void RmsNormForward<F>(const ModelThreads&, F*, F*, const F*, const F*, const RowSet&, F);         \
  template void RmsNormBackward<F>(const ModelThreads&, F*, bool, F*, const F*, const F*, const F*, const F*, \
                                   const RowSet&);                                                            \
  template void RopeForward<F>(const ModelThreads&, F*, const RowSet&, int64_t, const RopeTable&);            \
  template void RopeBackward<F>(const ModelThreads&, F*, const RowSet&, int64_t, const RopeTable&);           \
  template void SwiGluForward<F>(const ModelThreads&, F*, const F*, int64_t, int64_t);                        \
  template void SwiGluBackward<F>(const ModelThreads&, F*, const F*, const F*, int64_t, int64_t);

ZINF_MODEL_INSTANTIATE_DECODER_LAYERS(float)
ZINF_MODEL_INSTANTIATE_DECODER_LAYERS(double)

}  // namespace zinf::model
