// The CUDA kernels of the GPU path: the Adam/AdamW step, dtype casts, and the
// GPT layers that are not matrix products (GELU, LayerNorm, softmax +
// cross-entropy, token/position embedding). Each kernel evaluates the same
// ZINF_HOST_DEVICE per-element functions as the CPU code (math/adam_math.h,
// common/float16.h, math/gpt_math.h), and the row reductions add in the same
// order as the CPU layers (model/layers.cc), so a kernel and its CPU twin
// agree bit for bit except where noted (the log of the cross-entropy loss).
//
// Every function enqueues work on `stream` (a cudaStream_t; nullptr is the
// legacy default stream) and returns without waiting; all pointers are
// device memory (or managed memory) and must stay valid until the stream
// reaches the work. Errors: kInvalidArgument for a bad argument (named), and
// the launch error (kInternal, naming the kernel and device) when a launch
// fails; errors of the asynchronous execution surface at the next
// synchronisation of the stream. No CUDA header leaks from here.
// Thread-safety: concurrent calls are safe on disjoint outputs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "math/adam_math.h"
#include "math/attention_math.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::gpu {

// One Adam/AdamW step over n elements (adam_math.h, steps (1)-(7)):
// params, exp_avg and exp_avg_sq are fp32 and updated in place; grads holds
// grad_dtype elements (fp32, bf16 or fp16); param_copy, when not null,
// receives the updated parameter as param_copy_dtype (bf16 or fp16, rounded
// to nearest even). Bit-identical to the CPU AdamStep at every SIMD level.
Status AdamStep(const math::AdamStepConstants& constants, float* params, float* exp_avg, float* exp_avg_sq,
                const void* grads, DType grad_dtype, void* param_copy, DType param_copy_dtype, size_t n, void* stream);

// dst[i] = src[i] converted (widen to fp32, round to nearest even on
// narrowing); bit-identical to the CPU Cast. src and dst must not overlap.
// The same dtype on both sides is a copy.
Status Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, void* stream);

// The gradient norm's per-block partials of n fp32 values: block_partials[b]
// (NumNormBlocks(n) doubles, device memory) = the sum of squares of elements
// [b * 65536, (b + 1) * 65536), squared in double and added in the 16 lanes
// and the lane order of math/norm_math.h: bit-identical to the CPU's
// SumSquaresBlocks at every SIMD level. A block holding an inf or NaN gives a
// non-finite partial, as on the CPU.
Status SumSquaresBlocks(const float* data, size_t n, double* block_partials, void* stream);

// a[i] = a[i] + b[i] over n fp32 values (gradient accumulation); a and b may
// not overlap.
Status AddInPlace(float* a, const float* b, size_t n, void* stream);

// y = gelu(x) (tanh form), elementwise; y may be x.
Status GeluForward(const float* x, float* y, size_t n, void* stream);
// As GeluForward, with y written as bf16 rounded to nearest even (for an
// output that is only ever a bf16 product's operand); y must not overlap x.
Status GeluForwardBf16(const float* x, uint16_t* y, size_t n, void* stream);
// dx = gelu'(x) · dy, overwritten; dx may be dy.
Status GeluBackward(const float* x, const float* dy, float* dx, size_t n, void* stream);

// Per row of x [rows, cols]: y = (x - mean) · rstd · w + b, with mean[r] and
// rstd[r] = 1 / sqrt(var + 1e-5) stored (biased variance, two-pass). y is
// overwritten and must not overlap x.
Status LayerNormForward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                        int64_t rows, int64_t cols, void* stream);
// As LayerNormForward, with y written as bf16 rounded to nearest even.
Status LayerNormForwardBf16(const float* x, const float* w, const float* b, uint16_t* y, float* mean, float* rstd,
                            int64_t rows, int64_t cols, void* stream);
// The gradients of LayerNormForward given dy and the stored mean and rstd:
// dx [rows, cols], dw [cols] and db [cols] all accumulate (+=), as on the CPU.
// dw and db are each column summed in row order, then added.
Status LayerNormBackward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                         float* dx, float* dw, float* db, int64_t rows, int64_t cols, void* stream);

// Per row r of logits [rows, vocab]: probs[r] = softmax(logits[r]) and
// losses[r] = cross-entropy of targets[r]; a negative target is ignored
// (loss 0). Rows are ld >= vocab elements apart in logits and probs (a
// padded stride keeps a product's rows 16-byte aligned); probs may be
// logits (in place). Targets must be < vocab (not checked on the device).
// The loss uses the device's logf (within 1 ulp), so it may differ from the
// CPU's in the last bits; probs are bit-identical.
Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* targets, float* probs, float* losses,
                                  int64_t rows, int64_t vocab, int64_t ld, void* stream);
// dlogits[r] = scale · (probs[r] - onehot(targets[r])), 0 for ignored rows
// (rows ld apart); overwritten, and may be probs (in place).
Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, int64_t rows,
                                   int64_t vocab, int64_t ld, float scale, void* stream);
// SoftmaxCrossEntropyBackward with scale 1, then ScaleByCount(scale, count),
// then the cast to bf16 (rounded to nearest even), in one pass: dlogits
// (rows ld apart) as bf16 bits, the same bits as those three in turn. For a
// product on bf16 operands, which is all the fp32 gradient would be used for.
Status SoftmaxCrossEntropyBackwardBf16(const float* probs, const int32_t* targets, uint16_t* dlogits, int64_t rows,
                                       int64_t vocab, int64_t ld, float scale, const float* count, void* stream);
// The same bf16 gradient straight from the logits: SoftmaxCrossEntropyForward's
// probabilities, computed as it does but not stored, then
// SoftmaxCrossEntropyBackwardBf16 — the same bits as those two, in one
// kernel that reads the logits three times and writes only dlogits. For a
// chunked loss, whose backward computes each chunk's logits again. logits
// and dlogits must not overlap.
Status SoftmaxCrossEntropyGradBf16(const float* logits, const int32_t* targets, uint16_t* dlogits, int64_t rows,
                                   int64_t vocab, int64_t ld, float scale, const float* count, void* stream);

// out[r] = wte[tokens[r]] + wpe[r % seq_len] for each of `rows` rows of
// `channels` (rows = batch · seq_len); wpe may be null (a plain gather,
// out[r] = wte[tokens[r]]). Tokens must be in [0, vocab) (not checked on the
// device). Bit-identical to the CPU EncoderForward.
Status EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* out, int64_t rows,
                        int64_t seq_len, int64_t channels, void* stream);
// The same with wte given as bf16 bits (bf16 parameters, read in place):
// the rows of their widened values.
Status EmbeddingForward(const int32_t* tokens, const uint16_t* wte, const float* wpe, float* out, int64_t rows,
                        int64_t seq_len, int64_t channels, void* stream);
// dwte[tokens[r]] += dout[r]; dwpe[r % seq_len] += dout[r] when dwpe is not
// null; each element adds its rows in increasing r, as the CPU
// EncoderBackward does, so the two agree bit for bit and a run repeats
// itself (no atomics). The rows are ordered by (token, row) first, a
// bitonic sort of 64-bit keys in `workspace` (device memory of at least
// EmbeddingBackwardWorkspaceBytes(rows) bytes, 8-byte aligned, free for
// this call's work on `stream`); then one thread block per distinct token
// adds its rows, and one thread per (position, channel) its batch rows.
// rows < 2^31.
Status EmbeddingBackward(const float* dout, const int32_t* tokens, float* dwte, float* dwpe, int64_t rows,
                         int64_t seq_len, int64_t channels, void* workspace, size_t workspace_bytes, void* stream);
// 8 bytes per row, the rows rounded up to a power of two.
size_t EmbeddingBackwardWorkspaceBytes(int64_t rows);

// ---- the rest of the GPT layers (model/layers.h), for the model on CUDA.
// The matrix products are cuBLAS's (exec/gpt_cuda.cc); these are the pieces
// between them, each the same per-element math and order as its CPU twin.

// out = a + b elementwise; out may be a or b.
Status ResidualForward(const float* a, const float* b, float* out, size_t n, void* stream);
// out[r, :] = row[0 .. cols) for each of `rows` rows (a bias before a GEMM with beta 1).
Status BroadcastRow(const float* row, float* out, int64_t rows, int64_t cols, void* stream);
// out[c] += Σ_r x[r, c], each column summed from zero in row order, then
// added: bit-identical to model::ColumnSumAccumulate.
Status ColumnSumAccumulate(const float* x, float* out, int64_t rows, int64_t cols, void* stream);
// `matrices` T × T attention-score matrices: row i becomes the softmax of its
// first i + 1 entries (math/lane_math.h's SoftmaxInPlace), the rest 0.
Status CausalSoftmaxForward(float* att, int64_t matrices, int64_t T, void* stream);
// Through that softmax: datt (d att on entry) becomes scale · d(scores) on
// the causal prefix, 0 after it; as model::AttentionBackward's row loop.
Status CausalSoftmaxBackward(const float* att, float* datt, int64_t matrices, int64_t T, float scale, void* stream);
// count[0] = the rows with a target >= 0; loss[0] (when not null) = the mean
// of their losses, summed in double in row order (0 when there is none).
Status MeanLoss(const float* losses, const int32_t* targets, int64_t rows, float* loss, float* count, void* stream);
// x[i] = (scale / count[0]) · x[i], or 0 when count[0] is 0.
Status ScaleByCount(float* x, size_t n, float scale, const float* count, void* stream);

// Occupies `stream` for `seconds` of device time (one thread polling the
// global timer, sleeping between polls; no host CPU): synthetic compute for
// benchmarks.
Status BusyWait(double seconds, void* stream);

// Causal flash attention (math/attention_math.h) on tensor cores: bf16
// operands rounded to nearest even as they are loaded, fp32 sums, head_dim
// 64 or 128, grouped-query heads. Forward writes tensors.out and
// tensors.lse; backward fills tensors.delta and overwrites dq, dk and dv.
// Matches the CPU twin (model/flash_attention.h, bf16 operands) up to the
// order of the sums; deterministic (no atomics). kInvalidArgument for a bad
// shape (CheckAttentionShape) or another head_dim. With the bf16 copies of
// AttentionTensors (q16 ...) the kernels copy their tiles from those into
// two buffers a tile, where the device's shared memory per block allows it
// (FlashAttentionCopiesFit), else they read the fp32 tensors: the same bits.
// With tensors.out16, forward writes O in bf16 there (rounded to nearest
// even) and backward's δ reads it; with dout null, δ reads dO from dout16,
// and backward needs the copies' kernels (else kInvalidArgument). With
// dq16, dk16 and dv16, backward writes the gradients rounded to bf16 there.
// query_tiles: the forward's queries a thread block, in 64-row tiles (0: the
// default, 2 at head_dim 64, where each warp's k and v operands then feed
// two row tiles, and 1 at 128; 1 or 2 at 64 for a comparison): the same
// bits either way. kv_min_blocks: the dK/dV kernel's register cap, as the
// blocks a SM it is built to keep (0: the default, 3 at head_dim 64 and 1,
// no cap, at 128; 1 at 64 for a comparison; the register counts are in
// docs/figures.md): the same bits either way.
Status FlashAttentionForward(const math::AttentionShape& shape, const math::AttentionTensors& tensors, void* stream,
                             int query_tiles = 0);
Status FlashAttentionBackward(const math::AttentionShape& shape, const math::AttentionTensors& tensors, void* stream,
                              int kv_min_blocks = 0);
// Whether the current device runs the two-buffer kernels that read bf16
// copies, forward and backward, for this head_dim (64 or 128).
Result<bool> FlashAttentionCopiesFit(int64_t head_dim);
// Tests: with `disabled`, FlashAttentionCopiesFit says false on any device
// (process-wide, until called again with false), so that a GPU with room
// for the copies' kernels runs the paths of one without.
void DisableFlashAttentionCopiesForTesting(bool disabled);

}  // namespace zinf::gpu
