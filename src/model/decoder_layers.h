// The Llama family's layers as CPU kernels on host pointers: RMSNorm, rotary
// position embeddings (RoPE, with the frequency table of the config) and
// SwiGLU, forward and backward. Per-element and per-row math is
// math/decoder_math.h, shared with the CUDA kernels. Instantiated for
// F = float (the model) and F = double (the finite-difference tests).
//
// Conventions as model/layers.h: row-major dense tensors, work split by
// rows (or by columns for sums over rows, each column summed in the row
// chunks of lane_math.h's ColumnChunkRows), so every result is independent
// of the thread count.
//
// Thread-safety: each call blocks until done and uses only its arguments.
#pragma once

#include <cstdint>
#include <vector>

#include "model/gpt_config.h"
#include "model/parallel.h"

namespace zinf::model {

// A strided set of rows of n elements: row r (0 <= r < rows) starts at
// base + (r / per_token) · token_stride + (r % per_token) · n. A plain
// [rows, n] matrix is per_token 1, token_stride n; the query heads of a fused
// qkv are per_token H, token_stride (H + 2 H_kv) · D, n = D.
struct RowSet {
  int64_t rows = 0;
  int64_t n = 0;
  int64_t per_token = 1;
  int64_t token_stride = 0;
  int64_t Offset(int64_t r) const { return (r / per_token) * token_stride + (r % per_token) * n; }
  static RowSet Dense(int64_t rows, int64_t n) { return RowSet{rows, n, 1, n}; }
};

// out = RMSNorm(inp) · w per row; rstd[r] keeps each row's 1/rms. out may be
// inp (in place).
template <class F>
void RmsNormForward(const ModelThreads& th, F* out, F* rstd, const F* inp, const F* w, const RowSet& rows, F eps);
// dw += Σ_rows dout · x̂; dinp = the input gradient, added to dinp when
// accumulate_dinp, else written (dinp may then be dout).
template <class F>
void RmsNormBackward(const ModelThreads& th, F* dinp, bool accumulate_dinp, F* dw, const F* dout, const F* inp,
                     const F* w, const F* rstd, const RowSet& rows);

// RoPE's angles for positions 0 .. seq_len-1: cos and sin [seq_len, D/2],
// computed in fp32 the way Hugging Face's Llama does (inv_freq =
// 1 / theta^(2i/D) in fp32, Llama 3 rescaling, angle = t · inv_freq, then
// cos and sin), so both give the same table.
struct RopeTable {
  int64_t seq_len = 0, half = 0;  // half = D / 2
  std::vector<float> cos, sin;
  static RopeTable For(const GptConfig& c, int64_t seq_len);
};
// The inverse frequencies of RopeTable (D/2 values, fp32).
std::vector<float> RopeInverseFrequencies(const GptConfig& c);

// Rotates, in place, the heads `rows` describes (n = D); row r is at
// position (r / per_token) % seq_len. Backward applies the transposed
// rotation to the gradients, in place.
template <class F>
void RopeForward(const ModelThreads& th, F* x, const RowSet& rows, int64_t seq_len, const RopeTable& table);
template <class F>
void RopeBackward(const ModelThreads& th, F* dx, const RowSet& rows, int64_t seq_len, const RopeTable& table);

// out[r, i] = silu(inp[r, i]) · inp[r, I + i] for inp [rows, 2I] (gate | up),
// out [rows, I].
template <class F>
void SwiGluForward(const ModelThreads& th, F* out, const F* inp, int64_t rows, int64_t inter);
// dinp [rows, 2I] (overwritten) from dout [rows, I].
template <class F>
void SwiGluBackward(const ModelThreads& th, F* dinp, const F* inp, const F* dout, int64_t rows, int64_t inter);
// The same for an fc output given as bf16 bits (SwiGluInBf16).
void SwiGluBackward(const ModelThreads& th, float* dinp, const uint16_t* inp, const float* dout, int64_t rows,
                    int64_t inter);

}  // namespace zinf::model
