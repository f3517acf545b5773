// The row reductions of the GPT layers in 16 fixed lanes: element i of a row
// goes to lane i % 16 over the full groups of 16, the remainder to a tail,
// and the lanes are combined in one fixed order. Written once for the CPU
// layers (model/layers.cc, where GCC vectorises the lane loops) and the CUDA
// kernels (gpu/kernels.cu, one thread per row), so both give the same bits.
// Header only; pure functions, thread-safe.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/host_device.h"
#include "math/gpt_math.h"

namespace zinf::math {

inline constexpr int kLanes = 16;

// Column sums over `rows` rows (bias and LayerNorm gradients) add in
// chunks: rows [k·R, (k+1)·R) in order into chunk k's partial, then the
// partials in chunk order, R = ColumnChunkRows(rows). At most
// kMaxColumnChunks chunks of at least kMinColumnChunkRows rows, a rule of
// the row count alone, so that a GPU can sum the chunks of a column in
// parallel and the CPU, column-vectorised, gives the same bits.
inline constexpr int64_t kMaxColumnChunks = 128;
inline constexpr int64_t kMinColumnChunkRows = 64;
ZINF_HOST_DEVICE inline int64_t ColumnChunkRows(int64_t rows) {
  const int64_t even = (rows + kMaxColumnChunks - 1) / kMaxColumnChunks;
  return even > kMinColumnChunkRows ? even : kMinColumnChunkRows;
}

template <class F>
ZINF_HOST_DEVICE inline F LaneMax(const F* x, int64_t n) {
  F acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  }
  F m = -INFINITY;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (int j = 0; j < kLanes; ++j) m = acc[j] > m ? acc[j] : m;
  return m;
}

// out[i] = exp(x[i] - max); returns Σ out.
template <class F>
ZINF_HOST_DEVICE inline F LaneExpSum(F* out, const F* x, F row_max, int64_t n) {
  F acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const F e = SoftmaxExp(x[i + j], row_max);
      out[i + j] = e;
      acc[j] += e;
    }
  }
  F tail = 0;
  for (; i < n; ++i) {
    out[i] = SoftmaxExp(x[i], row_max);
    tail += out[i];
  }
  F s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s + tail;
}

// Σ a[i] · b[i].
template <class F>
ZINF_HOST_DEVICE inline F LaneDot(const F* a, const F* b, int64_t n) {
  F acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  F tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  F s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s + tail;
}

// Softmax of row[0 .. n) in place (the causal prefix of an attention row).
template <class F>
ZINF_HOST_DEVICE inline void SoftmaxInPlace(F* row, int64_t n) {
  const F row_max = LaneMax(row, n);
  const F inv_sum = F(1) / LaneExpSum(row, row, row_max, n);
  for (int64_t j = 0; j < n; ++j) row[j] *= inv_sum;
}

// Row i of a T × T causal attention matrix: the softmax of its first i + 1
// entries, the rest zeroed (AttentionForward's row loop).
template <class F>
ZINF_HOST_DEVICE inline void CausalSoftmaxRow(F* row, int64_t i, int64_t T) {
  SoftmaxInPlace(row, i + 1);
  for (int64_t j = i + 1; j < T; ++j) row[j] = 0;
}

// Through CausalSoftmaxRow: d (d row on entry) becomes scale · d(scores) on
// the causal prefix, 0 after it (AttentionBackward's row loop).
template <class F>
ZINF_HOST_DEVICE inline void CausalSoftmaxBackwardRow(const F* p, F* d, int64_t i, int64_t T, F scale) {
  const F dot = LaneDot(p, d, i + 1);
  for (int64_t j = 0; j <= i; ++j) d[j] = scale * SoftmaxInputGrad(p[j], d[j], dot);
  for (int64_t j = i + 1; j < T; ++j) d[j] = 0;
}

}  // namespace zinf::math
