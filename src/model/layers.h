// The GPT model's layers as CPU kernels on host pointers: forward and
// backward of the token/position embedding, LayerNorm, Linear (x · W + b),
// causal multi-head self-attention, GELU, the residual add, and the fused
// softmax + cross-entropy of the LM head. Instantiated for F = float (the
// model) and F = double (the finite-difference tests).
//
// Conventions: tensors are row-major and dense; `rows` is batch · seq_len;
// activations are [rows, channels]. Per-element math is gpt_math.h. Matrix
// products go through ParallelGemm; the rest is split by rows (or, for
// gradients summed over rows, by columns, each column summed in the row chunks of
// lane_math.h's ColumnChunkRows),
// so every result is independent of the thread count. Backward functions
// say which outputs they overwrite and which they accumulate into (+=).
//
// Thread-safety: each call blocks until done and uses only its arguments;
// concurrent calls on disjoint outputs are safe.
#pragma once

#include <cstdint>

#include "model/parallel.h"

namespace zinf::model {

// out[b, t] = wte[tokens[b, t]] + wpe[t] (wpe may be null: no learned
// positions). Tokens must be in [0, V).
template <class F>
void EncoderForward(const ModelThreads& th, F* out, const int32_t* tokens, const F* wte, const F* wpe, int64_t batch,
                    int64_t seq_len, int64_t channels);
// dwte[tokens[b, t]] += dout[b, t]; dwpe[t] += dout[b, t] (accumulates;
// dwpe may be null).
template <class F>
void EncoderBackward(const ModelThreads& th, F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int64_t batch,
                     int64_t seq_len, int64_t channels);

// out = LayerNorm(inp) · w + b per row; also stores each row's mean and rstd.
template <class F>
void LayerNormForward(const ModelThreads& th, F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b,
                      int64_t rows, int64_t channels);
// dinp, dw, db: all accumulate.
template <class F>
void LayerNormBackward(const ModelThreads& th, F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w,
                       const F* mean, const F* rstd, int64_t rows, int64_t channels);

// out[rows, out_dim] = inp[rows, in_dim] · w[in_dim, out_dim] + bias (bias may be null).
template <class F>
void LinearForward(const ModelThreads& th, F* out, const F* inp, const F* w, const F* bias, int64_t rows,
                   int64_t in_dim, int64_t out_dim);
// dinp = dout · wᵀ (overwritten, or accumulated when accumulate_dinp);
// dw += inpᵀ · dout; dbias += Σ_rows dout (dbias may be null).
template <class F>
void LinearBackward(const ModelThreads& th, F* dinp, bool accumulate_dinp, F* dw, F* dbias, const F* dout, const F* inp,
                    const F* w, int64_t rows, int64_t in_dim, int64_t out_dim);
// The same with bf16 products (th.matmul_dtype() kBFloat16) and inp given
// as bf16 bits: the gradients LinearBackward<float> gives for an inp of
// those values.
void LinearBackward(const ModelThreads& th, float* dinp, bool accumulate_dinp, float* dw, float* dbias,
                    const float* dout, const uint16_t* inp, const float* w, int64_t rows, int64_t in_dim,
                    int64_t out_dim);

// Causal self-attention over qkv [batch·seq_len, 3C] (q | k | v, head h at
// columns h·D .. h·D+D-1 of each third): att[b, h] = softmax(q kᵀ / sqrt(D))
// with keys after the query masked (stored [batch, H, seq_len, seq_len], the
// masked entries 0), out[b, t, h·D + d] = (att v)[t, d].
template <class F>
void AttentionForward(const ModelThreads& th, F* out, F* att, const F* qkv, int64_t batch, int64_t seq_len,
                      int64_t channels, int64_t num_heads);
// dqkv is overwritten; datt is scratch of att's size.
template <class F>
void AttentionBackward(const ModelThreads& th, F* dqkv, F* datt, const F* dout, const F* qkv, const F* att,
                       int64_t batch, int64_t seq_len, int64_t channels, int64_t num_heads);

// The same with grouped-query attention and any head size D: qkv is
// [batch·seq_len, (H + 2 H_kv)·D] (q | k | v), query head h reads key/value
// head h / (H / H_kv), out is [batch·seq_len, H·D]. With H_kv = H and
// H·D = C these are the functions above.
template <class F>
void AttentionForward(const ModelThreads& th, F* out, F* att, const F* qkv, int64_t batch, int64_t seq_len,
                      int64_t num_heads, int64_t kv_heads, int64_t head_dim);
// dqkv is overwritten (the key/value gradients summed over each group's
// query heads in head order).
template <class F>
void AttentionBackward(const ModelThreads& th, F* dqkv, F* datt, const F* dout, const F* qkv, const F* att,
                       int64_t batch, int64_t seq_len, int64_t num_heads, int64_t kv_heads, int64_t head_dim);

// out = gelu(inp) (tanh form), elementwise.
template <class F>
void GeluForward(const ModelThreads& th, F* out, const F* inp, int64_t n);
// dinp = gelu'(inp) · dout, overwritten; dinp may be dout.
template <class F>
void GeluBackward(const ModelThreads& th, F* dinp, const F* inp, const F* dout, int64_t n);

// out = a + b; out may be a or b.
template <class F>
void ResidualForward(const ModelThreads& th, F* out, const F* a, const F* b, int64_t n);

// Per row r: probs[r] = softmax(logits[r]) and losses[r] = cross-entropy of
// target targets[r]; a negative target is ignored (loss 0). probs may be
// logits (in place). Targets must be < vocab. Returns the number of rows
// with a target.
template <class F>
int64_t SoftmaxCrossEntropyForward(const ModelThreads& th, F* probs, F* losses, const F* logits, const int32_t* targets,
                                   int64_t rows, int64_t vocab);
// dlogits[r] = scale · (probs[r] - onehot(targets[r])), 0 for ignored rows;
// overwritten, and may be probs (in place).
template <class F>
void SoftmaxCrossEntropyBackward(const ModelThreads& th, F* dlogits, const F* probs, const int32_t* targets,
                                 int64_t rows, int64_t vocab, F scale);

// Σ_rows x[r, c] added to out[c] (each column summed in row order).
template <class F>
void ColumnSumAccumulate(const ModelThreads& th, F* out, const F* x, int64_t rows, int64_t cols);

}  // namespace zinf::model
