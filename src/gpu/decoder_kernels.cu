// The launches and argument checks of gpu/decoder_kernels.h; the kernels,
// and the order of their sums, are gpu/decoder_kernels.cuh's.
#include "gpu/decoder_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/decoder_kernels.cuh"
#include "gpu/launch_util.cuh"

namespace zinf::gpu {
namespace {

using namespace decoder;  // NOLINT(build/namespaces): the kernels' own header

Status CheckRows(const char* fn, const StridedRows& rows) {
  if (rows.rows < 0 || rows.n < 1 || rows.per_token < 1 || rows.token_stride < rows.per_token * rows.n) {
    return InvalidArgument(std::string(fn) + ": rows " + std::to_string(rows.rows) + ", n " + std::to_string(rows.n) +
                           ", per_token " + std::to_string(rows.per_token) + ", token_stride " +
                           std::to_string(rows.token_stride) +
                           " (need rows >= 0, n >= 1, per_token >= 1, token_stride >= per_token · n)");
  }
  return Status::Ok();
}

template <class T>
Status Rope(const char* fn, bool backward, T* x, const StridedRows& rows, int64_t seq_len, const float* cos,
            const float* sin, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows(fn, rows));
  if (rows.n % 2 != 0) return InvalidArgument(std::string(fn) + ": head size " + std::to_string(rows.n) + " is odd");
  if (seq_len < 1) return InvalidArgument(std::string(fn) + ": seq_len " + std::to_string(seq_len));
  if (rows.rows == 0) return Status::Ok();
  if (!x || !cos || !sin) return InvalidArgument(std::string(fn) + ": null x, cos or sin");
  const size_t n = static_cast<size_t>(rows.rows) * static_cast<size_t>(rows.n / 2);
  auto s = static_cast<cudaStream_t>(stream);
  const bool vector = RopeVector(x, rows, cos, sin);
  const unsigned blocks = elementwise::BlocksForElements(n, vector);
  if (backward) {
    RopeKernel<true, T><<<blocks, kThreads, 0, s>>>(x, rows, seq_len, cos, sin, vector);
  } else {
    RopeKernel<false, T><<<blocks, kThreads, 0, s>>>(x, rows, seq_len, cos, sin, vector);
  }
  return ZINF_CHECK_LAUNCH("RopeKernel");
}

Status CheckSwiGlu(const char* fn, int64_t rows, int64_t inter) {
  if (rows < 0 || inter < 1) {
    return InvalidArgument(std::string(fn) + ": rows " + std::to_string(rows) + ", inter " + std::to_string(inter) +
                           " (need rows >= 0, inter >= 1)");
  }
  return Status::Ok();
}

template <class Out>
Status LaunchRmsNormForward(const char* fn, const float* x, const float* w, Out* y, float* rstd,
                            const StridedRows& rows, float eps, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows(fn, rows));
  if (!(eps > 0.0f)) return InvalidArgument(std::string(fn) + ": eps must be positive");
  if (rows.rows == 0) return Status::Ok();
  if (!x || !w || !y || !rstd) return InvalidArgument(std::string(fn) + ": null x, w, y or rstd");
  if constexpr (sizeof(Out) != sizeof(float)) {  // a narrower y may not overlap x (y == x is fine in fp32)
    const size_t extent = static_cast<size_t>(rows.Offset(rows.rows - 1) + rows.n);
    if (Overlap(x, extent * sizeof(float), y, extent * sizeof(Out))) {
      return InvalidArgument(std::string(fn) + ": y overlaps x");
    }
  }
  RmsNormForwardKernel<Out>
      <<<BlocksForHalfWarpRows(rows.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, w, y, rstd, rows, eps);
  return ZINF_CHECK_LAUNCH("RmsNormForwardKernel");
}

}  // namespace

Status RmsNormForward(const float* x, const float* w, float* y, float* rstd, const StridedRows& rows, float eps,
                      void* stream) {
  return LaunchRmsNormForward("gpu::RmsNormForward", x, w, y, rstd, rows, eps, stream);
}

Status RmsNormForwardBf16(const float* x, const float* w, uint16_t* y, float* rstd, const StridedRows& rows, float eps,
                          void* stream) {
  return LaunchRmsNormForward("gpu::RmsNormForwardBf16", x, w, y, rstd, rows, eps, stream);
}

Status RmsNormBackward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                       bool accumulate_dx, float* dw, const StridedRows& rows, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckRows("gpu::RmsNormBackward", rows));
  if (rows.rows == 0) return Status::Ok();
  if (!dy || !x || !w || !rstd || !dx || !dw) {
    return InvalidArgument("gpu::RmsNormBackward: null dy, x, w, rstd, dx or dw");
  }
  auto s = static_cast<cudaStream_t>(stream);
  // The weight gradient first: with dx == dy the row pass overwrites dy.
  const unsigned tiles = static_cast<unsigned>((rows.n + 31) / 32);
  RmsNormWeightGradKernel<<<tiles, kColumnWarps * 32, 0, s>>>(dy, x, rstd, dw, rows);
  ZINF_RETURN_IF_ERROR(ZINF_CHECK_LAUNCH("RmsNormWeightGradKernel"));
  RmsNormBackwardRowsKernel<<<BlocksForHalfWarpRows(rows.rows), kThreads, 0, s>>>(dy, x, w, rstd, dx, accumulate_dx,
                                                                                  rows);
  return ZINF_CHECK_LAUNCH("RmsNormBackwardRowsKernel");
}

Status RopeForward(float* x, const StridedRows& rows, int64_t seq_len, const float* cos, const float* sin,
                   void* stream) {
  return Rope("gpu::RopeForward", false, x, rows, seq_len, cos, sin, stream);
}

Status RopeBackward(float* dx, const StridedRows& rows, int64_t seq_len, const float* cos, const float* sin,
                    void* stream) {
  return Rope("gpu::RopeBackward", true, dx, rows, seq_len, cos, sin, stream);
}

Status RopeForwardBf16(uint16_t* x, const StridedRows& rows, int64_t seq_len, const float* cos, const float* sin,
                       void* stream) {
  return Rope("gpu::RopeForwardBf16", false, x, rows, seq_len, cos, sin, stream);
}

Status RopeBackwardBf16(uint16_t* dx, const StridedRows& rows, int64_t seq_len, const float* cos, const float* sin,
                        void* stream) {
  return Rope("gpu::RopeBackwardBf16", true, dx, rows, seq_len, cos, sin, stream);
}

namespace {

template <class Out, class In>
Status LaunchSwiGluForward(const char* fn, const In* x, Out* out, int64_t rows, int64_t inter, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckSwiGlu(fn, rows, inter));
  if (rows == 0) return Status::Ok();
  if (!x || !out) return InvalidArgument(std::string(fn) + ": null x or out");
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(inter);
  if (Overlap(x, 2 * n * sizeof(In), out, n * sizeof(Out)))
    return InvalidArgument(std::string(fn) + ": out overlaps x");
  const bool vector = SwiGluVector(x, x, out, inter);
  SwiGluForwardKernel<Out, In>
      <<<elementwise::BlocksForElements(n, vector), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, out, rows,
                                                                                                      inter, vector);
  return ZINF_CHECK_LAUNCH("SwiGluForwardKernel");
}

template <class Out, class In, class Dy>
Status LaunchSwiGluBackward(const char* fn, const In* x, const Dy* dy, Out* dx, int64_t rows, int64_t inter,
                            void* stream) {
  ZINF_RETURN_IF_ERROR(CheckSwiGlu(fn, rows, inter));
  if (rows == 0) return Status::Ok();
  if (!x || !dy || !dx) return InvalidArgument(std::string(fn) + ": null x, dy or dx");
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(inter);
  if (Overlap(x, 2 * n * sizeof(In), dx, 2 * n * sizeof(Out)) || Overlap(dy, n * sizeof(Dy), dx, 2 * n * sizeof(Out))) {
    return InvalidArgument(std::string(fn) + ": dx overlaps x or dy");
  }
  const bool vector = SwiGluVector(x, dy, dx, inter);
  SwiGluBackwardKernel<Out, In, Dy>
      <<<elementwise::BlocksForElements(n, vector), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, dy, dx, rows,
                                                                                                      inter, vector);
  return ZINF_CHECK_LAUNCH("SwiGluBackwardKernel");
}

}  // namespace

Status SwiGluForward(const float* x, float* out, int64_t rows, int64_t inter, void* stream) {
  return LaunchSwiGluForward("gpu::SwiGluForward", x, out, rows, inter, stream);
}

Status SwiGluForwardBf16(const float* x, uint16_t* out, int64_t rows, int64_t inter, void* stream) {
  return LaunchSwiGluForward("gpu::SwiGluForwardBf16", x, out, rows, inter, stream);
}

Status SwiGluBackward(const float* x, const float* dy, float* dx, int64_t rows, int64_t inter, void* stream) {
  return LaunchSwiGluBackward("gpu::SwiGluBackward", x, dy, dx, rows, inter, stream);
}

Status SwiGluBackwardBf16(const float* x, const float* dy, uint16_t* dx, int64_t rows, int64_t inter, void* stream) {
  return LaunchSwiGluBackward("gpu::SwiGluBackwardBf16", x, dy, dx, rows, inter, stream);
}

Status SwiGluForwardBf16(const uint16_t* x, uint16_t* out, int64_t rows, int64_t inter, void* stream) {
  return LaunchSwiGluForward("gpu::SwiGluForwardBf16", x, out, rows, inter, stream);
}

Status SwiGluBackwardBf16(const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t rows, int64_t inter,
                          void* stream) {
  return LaunchSwiGluBackward("gpu::SwiGluBackwardBf16", x, dy, dx, rows, inter, stream);
}

}  // namespace zinf::gpu
