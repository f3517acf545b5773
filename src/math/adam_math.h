// The per-element Adam/AdamW update, written once for every tier: the scalar
// twin and the CUDA kernels instantiate it with T = float, the SIMD kernels
// with T = xsimd::batch<float, Arch>. Only + - * / and a correctly rounded
// sqrt are used, and the build forbids contraction (-ffp-contract=off, nvcc
// --fmad=false), so every instantiation rounds the same operations in the same
// order and produces bit-identical results. Header only; pure, thread-safe.
//
// The operation sequence, each step one IEEE fp32 operation (rounded to
// nearest even), per element, for gradient `grad` (already widened to fp32):
//
//   (1) g = grad * grad_scale                         grad_scale = clip_coef / loss_scale
//   (2) [Adam, weight_decay != 0]  g = g + weight_decay * p        (L2, coupled)
//   (3) m = beta1 * m + one_minus_beta1 * g
//   (4) v = beta2 * v + one_minus_beta2 * (g * g)
//   (5) d = sqrt(v) * inv_sqrt_bc2 + eps
//   (6) [AdamW, weight_decay != 0] p = p * decay_factor            (decoupled)
//   (7) p = p - step_size * (m / d)
//
// with the per-call constants computed once in double and rounded to fp32
// (MakeAdamStepConstants in src/cpu/adam.h), for step t >= 1:
//   one_minus_beta1 = 1 - beta1, one_minus_beta2 = 1 - beta2,
//   step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t)
//   (both bias corrections are 1 when bias correction is off),
//   decay_factor = 1 - lr * weight_decay.
//
// This is PyTorch's torch.optim.Adam/AdamW (torch/optim/adam.py,
// _single_tensor_adam: param.mul_(1 - lr * wd); exp_avg.lerp_; exp_avg_sq
// .mul_(beta2).addcmul_; denom = sqrt(v)/sqrt(bc2) + eps; param.addcdiv_(
// exp_avg, denom, value=-lr/bc1)) in the grouping of DeepSpeed's CPU Adam
// (csrc/includes/cpu_adam_impl.h, Step_1: the bias correction of v is a
// multiplication by 1/sqrt(1 - beta2^t), the step size is folded into one
// constant), which costs one division and one sqrt per element. Mathematically
// both are Kingma & Ba's Algorithm 1 with eps added to the bias-corrected
// sqrt(v); decoupled decay is Loshchilov & Hutter's AdamW.
#pragma once

#include <cmath>

#include "common/host_device.h"

namespace zinf::math {

// How weight decay enters the update (uniform over a call).
enum class AdamDecay : int {
  kNone = 0,       // weight_decay == 0: steps (2) and (6) are skipped
  kL2 = 1,         // Adam: step (2)
  kDecoupled = 2,  // AdamW: step (6)
};

// The fp32 constants of one optimizer call, shared by every tier. Plain data,
// so the CUDA kernels can take it by value.
struct AdamStepConstants {
  float grad_scale = 1.0f;
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float step_size = 1e-3f;
  float inv_sqrt_bc2 = 1.0f;
  float weight_decay = 0.0f;  // used by kL2
  float decay_factor = 1.0f;  // used by kDecoupled
  AdamDecay decay = AdamDecay::kNone;
};

// Correctly rounded square root (IEEE 754 requires sqrt to be; no rsqrt
// approximation). The template serves SIMD batches through ADL (xsimd::sqrt).
ZINF_HOST_DEVICE inline float SqrtRn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}
template <class T>
ZINF_HOST_DEVICE inline T SqrtRn(const T& x) {
  return sqrt(x);
}

// AdamStepConstants broadcast to T (a float or a SIMD batch of floats).
template <class T>
struct AdamCoefficients {
  ZINF_HOST_DEVICE explicit AdamCoefficients(const AdamStepConstants& c)
      : grad_scale(c.grad_scale),
        beta1(c.beta1),
        one_minus_beta1(c.one_minus_beta1),
        beta2(c.beta2),
        one_minus_beta2(c.one_minus_beta2),
        eps(c.eps),
        step_size(c.step_size),
        inv_sqrt_bc2(c.inv_sqrt_bc2),
        weight_decay(c.weight_decay),
        decay_factor(c.decay_factor),
        decay(c.decay) {}
  T grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inv_sqrt_bc2, weight_decay,
      decay_factor;
  AdamDecay decay;
};

// One element (or one SIMD batch of elements): the sequence (1)-(7) above.
// Updates param, exp_avg (m) and exp_avg_sq (v) in place.
template <class T>
ZINF_HOST_DEVICE inline void AdamUpdate(const AdamCoefficients<T>& k, const T& grad, T& param, T& exp_avg,
                                        T& exp_avg_sq) {
  T g = grad * k.grad_scale;                                        // (1)
  if (k.decay == AdamDecay::kL2) g = g + k.weight_decay * param;    // (2)
  exp_avg = k.beta1 * exp_avg + k.one_minus_beta1 * g;              // (3)
  exp_avg_sq = k.beta2 * exp_avg_sq + k.one_minus_beta2 * (g * g);  // (4)
  const T denom = SqrtRn(exp_avg_sq) * k.inv_sqrt_bc2 + k.eps;      // (5)
  T p = param;
  if (k.decay == AdamDecay::kDecoupled) p = p * k.decay_factor;  // (6)
  param = p - k.step_size * (exp_avg / denom);                   // (7)
}

}  // namespace zinf::math
