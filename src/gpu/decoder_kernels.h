// The CUDA kernels of the Llama family's layers (model/decoder_layers.h):
// RMSNorm over dense rows or over the heads of a fused qkv, rotary position
// embeddings (RoPE) and SwiGLU, forward and backward. Each kernel evaluates
// the per-element functions of math/decoder_math.h that the CPU kernels use,
// and the row and column sums add in the CPU's order (math/lane_math.h's 16
// lanes, ColumnChunkRows' chunks), so a kernel and its CPU twin agree bit for
// bit.
//
// Conventions as gpu/kernels.h: every function enqueues on `stream` (a
// cudaStream_t; nullptr is the legacy default stream) and returns without
// waiting; pointers are device memory that must stay valid until the stream
// reaches the work; kInvalidArgument names a bad argument, a failed launch is
// kInternal naming the kernel. No CUDA header leaks from here.
// Thread-safety: concurrent calls are safe on disjoint outputs.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "zinf/status.h"

namespace zinf::gpu {

// A strided set of rows of n floats, model::RowSet's addressing: row r
// (0 <= r < rows) starts at (r / per_token) · token_stride + (r % per_token)
// · n. A dense [rows, n] matrix is per_token 1, token_stride n; the query
// heads of a fused [B·T, (H + 2 H_kv)·D] qkv are rows B·T·H, n D,
// per_token H, token_stride (H + 2 H_kv)·D.
struct StridedRows {
  int64_t rows = 0;
  int64_t n = 0;
  int64_t per_token = 1;
  int64_t token_stride = 0;
  ZINF_HOST_DEVICE int64_t Offset(int64_t r) const { return (r / per_token) * token_stride + (r % per_token) * n; }
  static StridedRows Dense(int64_t rows, int64_t n) { return StridedRows{rows, n, 1, n}; }
};

// Per row: y = RMSNorm(x) · w (model::RmsNormForward), rstd[r] = the row's
// 1/rms. y may be x (in place); w has n elements.
Status RmsNormForward(const float* x, const float* w, float* y, float* rstd, const StridedRows& rows, float eps,
                      void* stream);
// As RmsNormForward, with y written as bf16 rounded to nearest even (the
// rounding a bf16 product's operand takes), at the same element offsets;
// y must not overlap x.
Status RmsNormForwardBf16(const float* x, const float* w, uint16_t* y, float* rstd, const StridedRows& rows, float eps,
                          void* stream);
// The gradients of RmsNormForward given dy and the stored rstd
// (model::RmsNormBackward): dw [n] accumulates (+=), each column summed in
// ColumnChunkRows' chunks; dx is added to when accumulate_dx, else written,
// and may then be dy (in place). x must not overlap dx.
Status RmsNormBackward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                       bool accumulate_dx, float* dw, const StridedRows& rows, void* stream);

// Rotates the heads `rows` describes in place (n = D, even): row r is at
// position (r / per_token) % seq_len, and its pairs (i, i + D/2) turn by the
// angle whose cosine and sine are cos[t · D/2 + i], sin[t · D/2 + i]
// (model::RopeTable's [seq_len, D/2] tables, copied to the device).
// Backward applies the transposed rotation to the gradients, in place.
Status RopeForward(float* x, const StridedRows& rows, int64_t seq_len, const float* cos, const float* sin,
                   void* stream);
Status RopeBackward(float* dx, const StridedRows& rows, int64_t seq_len, const float* cos, const float* sin,
                    void* stream);
// RopeForward and RopeBackward on rows kept in bf16 (model::QkvInBf16):
// each pair widened, rotated in fp32 and rounded to nearest even, in place.
Status RopeForwardBf16(uint16_t* x, const StridedRows& rows, int64_t seq_len, const float* cos, const float* sin,
                       void* stream);
Status RopeBackwardBf16(uint16_t* dx, const StridedRows& rows, int64_t seq_len, const float* cos, const float* sin,
                        void* stream);

// out[r, i] = silu(x[r, i]) · x[r, I + i] for x [rows, 2I] (gate | up) and
// out [rows, I].
Status SwiGluForward(const float* x, float* out, int64_t rows, int64_t inter, void* stream);
// dx [rows, 2I] (overwritten; must not overlap x or dy) from dy [rows, I].
Status SwiGluBackward(const float* x, const float* dy, float* dx, int64_t rows, int64_t inter, void* stream);
// The two above with the output written as bf16 rounded to nearest even
// (for an output that is only ever a bf16 product's operand); the output
// must not overlap the inputs.
Status SwiGluForwardBf16(const float* x, uint16_t* out, int64_t rows, int64_t inter, void* stream);
Status SwiGluBackwardBf16(const float* x, const float* dy, uint16_t* dx, int64_t rows, int64_t inter, void* stream);
// The same from x and dy in bf16 (model::SwiGluInBf16: the fc product's
// output and the activation's gradient kept in bf16 alone), each element
// widened to fp32: the fp32 kernels' results for those inputs, rounded.
Status SwiGluForwardBf16(const uint16_t* x, uint16_t* out, int64_t rows, int64_t inter, void* stream);
Status SwiGluBackwardBf16(const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t rows, int64_t inter,
                          void* stream);

}  // namespace zinf::gpu
