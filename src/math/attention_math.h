// Blocked causal attention with an online softmax (flash attention; Dao et
// al. 2022, "FlashAttention", Algorithm 1, and Dao 2023, "FlashAttention-2",
// Algorithms 1 and 2): the shapes, the tensors' addressing and the
// per-element steps, written once for the CPU twin (model/flash_attention.cc)
// and the CUDA kernels (gpu/flash_attention.cu). Header only; pure
// functions, thread-safe.
//
// The algorithm, per (batch row, head) and per block of kFlashBlock queries,
// with s = scale · q·k over the keys j <= i (causal):
//   forward, over the key blocks in order: m' = max(m, max_j s_j),
//     α = exp(m - m'), p_j = exp(s_j - m'), l = α l + Σ_j p_j,
//     o = α o + Σ_j p_j v_j; at the end o /= l and lse = m + log l
//     (computed in base 2: FlashExp2 below).
//   backward, with δ_i = Σ_d dO_i,d · O_i,d and p_ij = exp(s_ij - lse_i):
//     dV_j = Σ_i p_ij dO_i;  dp_ij = dO_i · v_j;  ds_ij = p_ij (dp_ij - δ_i);
//     dQ_i = scale Σ_j ds_ij k_j;  dK_j = scale Σ_i ds_ij q_i.
// Only O(T) is kept from forward to backward (lse), never the T × T scores.
//
// With bf16 operands (the tensor-core form) the inputs q, k, v, dO and the
// intermediate p and ds are rounded to bf16 (to nearest even) where they
// enter a product; every sum is fp32. With fp32 operands nothing is rounded.
// Grouped-query attention: head h reads key/value head h / (heads /
// kv_heads).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "common/float16.h"
#include "common/host_device.h"
#include "math/gpt_math.h"
#include "zinf/status.h"

namespace zinf::math {

// Queries per block and keys per block, on the CPU and on CUDA alike.
inline constexpr int kFlashBlock = 64;

struct AttentionShape {
  int64_t batch = 0;     // B
  int64_t seq_len = 0;   // T
  int64_t heads = 0;     // H, the query heads
  int64_t kv_heads = 0;  // H_kv, dividing H (H for multi-head attention)
  int64_t head_dim = 0;  // D
  float scale = 0.0f;    // usually 1 / sqrt(D)
};

// Token t of batch row b, head h, is the D elements at
//   base + (b · T + t) · stride + h · D
// of each tensor: q and dq with q_stride; k, v, dk and dv (the key/value
// heads) with kv_stride; out and dout with out_stride. So the GPT's fused
// [B·T, 3C] qkv is q = qkv, k = qkv + C, v = qkv + 2C with stride 3C, and
// its gradient has the same layout. lse and delta are [B, H, T].
struct AttentionTensors {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t q_stride = 0, kv_stride = 0;
  float* out = nullptr;  // forward writes; backward reads O
  int64_t out_stride = 0;
  float* lse = nullptr;  // forward writes; backward reads
  // Backward only. dq, dk, dv are overwritten (strides q_stride and
  // kv_stride); delta is scratch the backward fills first.
  const float* dout = nullptr;
  float* delta = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  // Optional, read by the CUDA kernels alone: bf16 roundings (to nearest
  // even) of q, k, v (with q_stride and kv_stride) and of dout (out_stride),
  // 16-byte aligned with strides a multiple of 8. With q16, k16 and v16 set
  // (and dout16 too, in backward) the kernels copy their tiles from these
  // instead of rounding the fp32 tensors as the tiles load: the same
  // operands, so the same results bit for bit, from half the bytes.
  const uint16_t* q16 = nullptr;
  const uint16_t* k16 = nullptr;
  const uint16_t* v16 = nullptr;
  const uint16_t* dout16 = nullptr;
  // Optional, CUDA kernels alone: O kept in bf16 alone (out_stride). Forward
  // writes O rounded to nearest even here instead of into `out` (which may
  // then be null); backward's δ reads O from here. Likewise backward takes
  // a null `dout` with dout16 given: δ then reads dO from dout16 (the model
  // keeps O and dO as bf16 values with bf16 products, AttentionInBf16), and
  // the tiles must come from the copies.
  uint16_t* out16 = nullptr;
  // Optional, CUDA kernels alone: backward writes dq, dk and dv rounded to
  // bf16 here (q_stride, kv_stride) instead of into dq, dk and dv (which may
  // then be null), all three or none (the model's QkvInBf16).
  uint16_t* dq16 = nullptr;
  uint16_t* dk16 = nullptr;
  uint16_t* dv16 = nullptr;
};

// The value a product's operand carries: x itself, or x rounded to bf16.
ZINF_HOST_DEVICE inline float FlashOperand(float x, bool bf16) {
  return bf16 ? Bf16BitsToFloat(FloatToBf16Bits(x)) : x;
}

// Whether query i sees key j (both positions inside [0, T)).
ZINF_HOST_DEVICE inline bool FlashVisible(int64_t i, int64_t j, int64_t seq_len) { return j <= i && i < seq_len; }

// The softmax works in base 2, as the GPU's special-function unit does:
// a score is kept as z = log2(e) · s, so exp(s - m) = 2^(z - m₂) with m₂
// the row's maximum of z. log2(e) folds into the scale (FlashLog2Scale),
// so each score costs one multiply and one 2^x.
inline constexpr float kFlashLog2e = 1.44269504088896341f;
inline constexpr float kFlashLn2 = 0.693147180559945309f;

// z per unit of q·k.
ZINF_HOST_DEVICE inline float FlashLog2Scale(float scale) { return scale * kFlashLog2e; }

// 2^x, and 0 for x = -inf. On a GPU the special-function unit's
// ex2.approx.ftz.f32 (about 2 ulp; results below 2^-126 flushed to 0); on
// the CPU Exp(x · ln 2) (gpt_math.h, within 2 ulp of exp, plus the rounding
// of the product; 0 below about 2^-125.5). The two differ by a few ulp of
// p, far below the bf16 rounding p takes before it enters a product.
ZINF_HOST_DEVICE inline float FlashExp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return x < -126.0f ? 0.0f : Exp(x * kFlashLn2);
#endif
}

// 2^(m_old - m_new): the factor that rescales a row's running sum and
// output when its maximum (of z) rises; 0 when the row had no score yet.
ZINF_HOST_DEVICE inline float FlashRescale(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.0f : FlashExp2(m_old - m_new);
}

// p = 2^(z - m) for a visible score z (log2 units) and the row's m: its
// running maximum in forward, FlashLse2(lse) in backward.
ZINF_HOST_DEVICE inline float FlashProb(float z, float m) { return FlashExp2(z - m); }

// The log-sum-exp kept for backward, in natural units, from the row's
// maximum of z and its sum l of 2^(z - m).
ZINF_HOST_DEVICE inline float FlashLse(float m, float l) { return (m + std::log2(l)) * kFlashLn2; }

// lse in log2 units, as backward subtracts it from z.
ZINF_HOST_DEVICE inline float FlashLse2(float lse) { return lse * kFlashLog2e; }

// d(score) from the probability, its gradient and the row's δ.
ZINF_HOST_DEVICE inline float FlashScoreGrad(float p, float dp, float delta) { return p * (dp - delta); }

// kInvalidArgument (naming the field) for a shape the algorithm cannot take:
// a non-positive size, kv_heads not dividing heads, a stride shorter than
// the heads it holds, or a missing tensor.
inline Status CheckAttentionShape(const AttentionShape& s, const AttentionTensors& t, bool backward) {
  auto bad = [](const std::string& what) { return InvalidArgument("flash attention: " + what); };
  if (s.batch <= 0 || s.seq_len <= 0 || s.heads <= 0 || s.kv_heads <= 0 || s.head_dim <= 0) {
    return bad("batch, seq_len, heads, kv_heads and head_dim must be positive");
  }
  if (s.heads % s.kv_heads != 0) {
    return bad("kv_heads " + std::to_string(s.kv_heads) + " does not divide heads " + std::to_string(s.heads));
  }
  if (!(s.scale > 0.0f)) return bad("scale must be positive");
  if (!t.q || !t.k || !t.v || (!t.out && !t.out16) || !t.lse) return bad("null q, k, v, out (and out16) or lse");
  if (t.q_stride < s.heads * s.head_dim || t.out_stride < s.heads * s.head_dim) {
    return bad("q or out stride shorter than heads · head_dim");
  }
  if (t.kv_stride < s.kv_heads * s.head_dim) return bad("kv stride shorter than kv_heads · head_dim");
  const bool grads16 = t.dq16 && t.dk16 && t.dv16;
  if (backward && ((!t.dout && !t.dout16) || !t.delta || (!grads16 && (!t.dq || !t.dk || !t.dv)))) {
    return bad("null dout (and dout16), delta, dq, dk or dv (and dq16, dk16, dv16)");
  }
  if (backward && !grads16 && (t.dq16 || t.dk16 || t.dv16)) return bad("dq16, dk16 and dv16 go together");
  return Status::Ok();
}

}  // namespace zinf::math
