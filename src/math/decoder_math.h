// The per-element and per-row math of the Llama family's operations —
// RMSNorm, rotary position embeddings (RoPE) and SwiGLU — written once for
// the CPU kernels (model/decoder_layers.cc, T = float, and T = double for the
// finite-difference tests) and the CUDA kernels (ZINF_HOST_DEVICE). Only
// + - * /, sqrt, sin/cos of the tables (built once on the host) and the
// model's Exp; the build forbids contraction into FMAs. Header only; pure
// functions, thread-safe.
//
// The formulas:
//   RMSNorm (Zhang & Sennrich 2019) over a row of n: rstd = 1 / sqrt(Σx²/n +
//     eps), x̂ = x · rstd, y = x̂ · w (Hugging Face's LlamaRMSNorm order);
//     backward with g = dy · w: dx = rstd (g - x̂ · Σ(g x̂)/n), dw += dy · x̂.
//   RoPE, rotate-half layout, for a head vector x of D and position t, pairs
//     (i, i + D/2) for i < D/2 at angle θ = t · inv_freq[i]:
//       y_i = x_i cos θ - x_{i+D/2} sin θ,  y_{i+D/2} = x_{i+D/2} cos θ + x_i sin θ;
//     backward is the transposed rotation (the angle negated).
//   SwiGLU (Shazeer 2020): y = silu(a) · b, silu(a) = a · σ(a),
//     σ(a) = 1 / (1 + exp(-a)); da = dy · b · σ(a) (1 + a (1 - σ(a))),
//     db = dy · silu(a).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"
#include "math/gpt_math.h"
#include "math/lane_math.h"

namespace zinf::math {

// Σ x[i]², in the 16 lanes of lane_math.h.
template <class F>
ZINF_HOST_DEVICE inline F LaneSumSquares(const F* x, int64_t n) {
  return LaneDot(x, x, n);
}

template <class T>
ZINF_HOST_DEVICE inline T RmsNormRstd(T sum_squares, int64_t n, T eps) {
  return T(1) / std::sqrt(sum_squares / static_cast<T>(n) + eps);
}

// One row of n: y = (x · rstd) · w; returns rstd (kept for backward).
template <class F>
ZINF_HOST_DEVICE inline F RmsNormRow(F* y, const F* x, const F* w, int64_t n, F eps) {
  const F rstd = RmsNormRstd(LaneSumSquares(x, n), n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * rstd) * w[i];
  return rstd;
}

// Σ (dy · w) · x̂ over the row, in the 16 lanes.
template <class F>
ZINF_HOST_DEVICE inline F RmsNormGradDot(const F* dy, const F* x, const F* w, F rstd, int64_t n) {
  F acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += (dy[i + j] * w[i + j]) * (x[i + j] * rstd);
  }
  F tail = 0;
  for (; i < n; ++i) tail += (dy[i] * w[i]) * (x[i] * rstd);
  F s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s + tail;
}

// dx for one element, given the row's dot = Σ g x̂ (RmsNormGradDot).
template <class T>
ZINF_HOST_DEVICE inline T RmsNormInputGrad(T dy, T w, T x, T rstd, T dot, int64_t n) {
  return rstd * (dy * w - (x * rstd) * (dot / static_cast<T>(n)));
}

// The per-element terms of the loops above, one element at a time, for
// kernels that spread a row over threads (gpu/decoder_kernels.cu); each is
// the expression its row function evaluates for element i.
// RmsNormRow's y[i]:
template <class T>
ZINF_HOST_DEVICE inline T RmsNormOutput(T x, T rstd, T w) {
  return (x * rstd) * w;
}
// RmsNormGradDot's term for element i:
template <class T>
ZINF_HOST_DEVICE inline T RmsNormGradDotTerm(T dy, T w, T x, T rstd) {
  return (dy * w) * (x * rstd);
}
// The weight gradient's term of one row for element i (dw += Σ_rows of it):
template <class T>
ZINF_HOST_DEVICE inline T RmsNormWeightGradTerm(T dy, T x, T rstd) {
  return dy * (x * rstd);
}

// One rotated pair: (a, b) = (x_i, x_{i+D/2}).
template <class T>
ZINF_HOST_DEVICE inline void RopeRotate(T& a, T& b, T cos_t, T sin_t) {
  const T ra = a * cos_t - b * sin_t;
  const T rb = b * cos_t + a * sin_t;
  a = ra;
  b = rb;
}

// The transposed rotation (backward): (da, db) of the inputs from those of
// the outputs.
template <class T>
ZINF_HOST_DEVICE inline void RopeRotateBack(T& da, T& db, T cos_t, T sin_t) {
  const T ra = da * cos_t + db * sin_t;
  const T rb = db * cos_t - da * sin_t;
  da = ra;
  db = rb;
}

template <class T>
ZINF_HOST_DEVICE inline T Sigmoid(T a) {
  return T(1) / (T(1) + Exp(-a));
}

template <class T>
ZINF_HOST_DEVICE inline T SwiGlu(T gate, T up) {
  return (gate * Sigmoid(gate)) * up;
}

// (d gate, d up) from dy.
template <class T>
ZINF_HOST_DEVICE inline void SwiGluGrad(T gate, T up, T dy, T& dgate, T& dup) {
  const T s = Sigmoid(gate);
  dgate = (dy * up) * (s * (T(1) + gate * (T(1) - s)));
  dup = dy * (gate * s);
}

}  // namespace zinf::math
