// The per-element math of the GPT model, written once for the CPU kernels
// (src/model/layers.cc, T = float, and T = double for the finite-difference
// tests) and the CUDA kernels of the GPU issue (ZINF_HOST_DEVICE). Only
// + - * /, sqrt, log and Exp below; the build forbids contraction into FMAs.
// Header only; pure functions, thread-safe.
//
// The formulas:
//   GELU (tanh form, GPT-2; Hendrycks & Gimpel 2016, eq. 2):
//     gelu(x) = x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x³)
//   computed as x · s with s = 1 / (1 + exp(-2u)) = (1 + tanh u) / 2, which
//   has no cancellation; its derivative is
//     gelu'(x) = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 · 0.044715 x²).
//   LayerNorm (Ba et al. 2016) over a row of C: x̂ = (x - mean) · rstd,
//     rstd = 1 / sqrt(var + eps) with the biased variance; y = x̂ w + b;
//     dx = rstd (g - mean(g) - x̂ mean(g x̂)),  g = dy · w.
//   Softmax: p_j = exp(x_j - max) / Σ exp(x_k - max);
//     dx_j = p_j (dp_j - Σ_k p_k dp_k).
//   Cross-entropy of a row with target t: log Σ exp(x_k - max) + max - x_t;
//     d/dx_j = p_j - [j = t].
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace zinf::math {

inline constexpr double kLayerNormEps = 1e-5;  // T(1e-5) in each precision

// exp for fp32: Cody-Waite range reduction x = n ln2 + r (ln2 split in two
// parts), then Cephes' degree-7 polynomial for exp(r) on |r| <= ln2/2 and a
// scale by 2^n built from the exponent bits; within 2 ulp of the true value
// for x in [-87, 88]. Below -87 it returns 0 (no subnormals), above 88 it
// returns exp(88). Branch-free apart from selects, so loops over it vectorise.
ZINF_HOST_DEVICE inline float Exp(float x) {
  constexpr float kMinArg = -87.0f, kMaxArg = 88.0f;
  const float xc = x < kMinArg ? kMinArg : (x > kMaxArg ? kMaxArg : x);
  // Round x / ln2 to nearest by adding and subtracting 1.5 · 2^23.
  constexpr float kMagic = 12582912.0f;
  const float t = xc * 1.44269504088896341f + kMagic;
  const float n = t - kMagic;
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n for n in [-126, 127]: the biased exponent in the exponent field.
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof(scale));
  const float y = p * scale;
  return x < kMinArg ? 0.0f : y;
}

// The double instantiation (finite-difference tests, the reference) uses the
// correctly rounded-ish libm exp: it is the reference the fp32 one is tested
// against.
ZINF_HOST_DEVICE inline double Exp(double x) { return std::exp(x); }

template <class T>
ZINF_HOST_DEVICE inline T GeluSigmoid(T x) {
  constexpr T kSqrt2OverPi = T(0.7978845608028654);
  constexpr T kCubic = T(0.044715);
  const T u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return T(1) / (T(1) + Exp(T(-2) * u));
}

template <class T>
ZINF_HOST_DEVICE inline T Gelu(T x) {
  return x * GeluSigmoid(x);
}

template <class T>
ZINF_HOST_DEVICE inline T GeluGrad(T x) {
  constexpr T kSqrt2OverPi = T(0.7978845608028654);
  constexpr T kCubic3 = T(3 * 0.044715);
  const T s = GeluSigmoid(x);
  const T du = kSqrt2OverPi * (T(1) + kCubic3 * x * x);
  return s + T(2) * x * s * (T(1) - s) * du;
}

// 1 / sqrt(var + eps).
template <class T>
ZINF_HOST_DEVICE inline T LayerNormRstd(T variance) {
  return T(1) / std::sqrt(variance + T(kLayerNormEps));
}

template <class T>
ZINF_HOST_DEVICE inline T LayerNormNormalize(T x, T mean, T rstd) {
  return (x - mean) * rstd;
}

template <class T>
ZINF_HOST_DEVICE inline T LayerNormAffine(T xhat, T w, T b) {
  return xhat * w + b;
}

// dx for one element given g = dy·w, x̂, and the row means of g and g·x̂.
template <class T>
ZINF_HOST_DEVICE inline T LayerNormInputGrad(T g, T xhat, T mean_g, T mean_g_xhat, T rstd) {
  return rstd * ((g - mean_g) - xhat * mean_g_xhat);
}

template <class T>
ZINF_HOST_DEVICE inline T SoftmaxExp(T x, T row_max) {
  return Exp(x - row_max);
}

// dx_j = p_j (dp_j - Σ_k p_k dp_k); `dot` is that sum.
template <class T>
ZINF_HOST_DEVICE inline T SoftmaxInputGrad(T p, T dp, T dot) {
  return p * (dp - dot);
}

// The loss of one row from its softmax statistics.
template <class T>
ZINF_HOST_DEVICE inline T CrossEntropyLoss(T row_max, T sum_exp, T target_logit) {
  return std::log(sum_exp) + row_max - target_logit;
}

// d(scale · loss)/d logit_j = scale (p_j - [j is the target]).
template <class T>
ZINF_HOST_DEVICE inline T CrossEntropyLogitGrad(T p, bool is_target, T scale) {
  return (is_target ? p - T(1) : p) * scale;
}

}  // namespace zinf::math
