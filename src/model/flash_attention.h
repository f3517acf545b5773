// Flash attention on the CPU: the blocked, online-softmax causal attention
// of math/attention_math.h, block for block as the CUDA kernels
// (gpu/flash_attention.cu) compute it. It is the CUDA kernels' reference and
// the GPT model's attention when GptRunOptions::attention is kFlash: only
// the per-row log-sum-exp is kept from forward to backward, so memory grows
// with T, not T².
//
// Operands are rounded to bf16 where they enter a product when the pool's
// matmul dtype is kBFloat16 (ModelThreads::matmul_dtype), and stay fp32
// otherwise; every sum is fp32, in a fixed order, so results are
// independent of the thread count. Work splits by (batch row, head, block).
//
// Thread-safety: each call blocks until done and touches only its tensors.
#pragma once

#include "math/attention_math.h"
#include "model/parallel.h"

namespace zinf::model {

// The shape is checked by the caller (CheckAttentionShape); the twin reads
// and writes the fp32 tensors alone (t.out, t.dout, t.dq, t.dk and t.dv
// non-null; the bf16 copies, out16 and dq16 ... are the CUDA kernels').
// Writes t.out and t.lse from t.q, t.k, t.v.
void FlashAttentionForward(const ModelThreads& th, const math::AttentionShape& shape, const math::AttentionTensors& t);

// From t.q, t.k, t.v, t.out, t.lse and t.dout: fills t.delta, then
// overwrites t.dq, t.dk and t.dv.
void FlashAttentionBackward(const ModelThreads& th, const math::AttentionShape& shape, const math::AttentionTensors& t);

}  // namespace zinf::model
