// The loss kernels' launches and argument checks (gpu/kernels.h); the
// kernels, and the order of their sums, are gpu/loss_kernels.cuh's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/float16.h"
#include "gpu/cuda_check.h"
#include "gpu/kernels.h"
#include "gpu/launch_util.cuh"
#include "gpu/loss_kernels.cuh"

namespace zinf::gpu {
namespace {

using namespace loss;  // NOLINT(build/namespaces): the kernels' own header

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = size_t{1} << 16;

unsigned BlocksFor(size_t n) {
  return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

Status CheckLossRows(const char* fn, int64_t rows, int64_t vocab, int64_t ld) {
  ZINF_RETURN_IF_ERROR(CheckRows(fn, rows, vocab, "vocab"));
  if (ld < vocab) {
    return InvalidArgument(std::string(fn) + ": row stride " + std::to_string(ld) + " below vocab " +
                           std::to_string(vocab));
  }
  return Status::Ok();
}

}  // namespace

Status SoftmaxCrossEntropyForward(const float* logits, const int32_t* targets, float* probs, float* losses,
                                  int64_t rows, int64_t vocab, int64_t ld, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckLossRows("gpu::SoftmaxCrossEntropyForward", rows, vocab, ld));
  if (rows == 0) return Status::Ok();
  if (!logits || !targets || !probs || !losses)
    return InvalidArgument("gpu::SoftmaxCrossEntropyForward: null logits, targets, probs or losses");
  SoftmaxCrossEntropyForwardKernel<<<BlocksForRows(rows), kLossThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, targets, probs, losses, rows, vocab, ld);
  return ZINF_CHECK_LAUNCH("SoftmaxCrossEntropyForwardKernel");
}

Status SoftmaxCrossEntropyBackward(const float* probs, const int32_t* targets, float* dlogits, int64_t rows,
                                   int64_t vocab, int64_t ld, float scale, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckLossRows("gpu::SoftmaxCrossEntropyBackward", rows, vocab, ld));
  if (rows == 0) return Status::Ok();
  if (!probs || !targets || !dlogits)
    return InvalidArgument("gpu::SoftmaxCrossEntropyBackward: null probs, targets or dlogits");
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(vocab);
  SoftmaxCrossEntropyBackwardKernel<<<BlocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      probs, targets, dlogits, rows, vocab, ld, scale);
  return ZINF_CHECK_LAUNCH("SoftmaxCrossEntropyBackwardKernel");
}

Status SoftmaxCrossEntropyBackwardBf16(const float* probs, const int32_t* targets, uint16_t* dlogits, int64_t rows,
                                       int64_t vocab, int64_t ld, float scale, const float* count, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckLossRows("gpu::SoftmaxCrossEntropyBackwardBf16", rows, vocab, ld));
  if (rows == 0) return Status::Ok();
  if (!probs || !targets || !dlogits || !count)
    return InvalidArgument("gpu::SoftmaxCrossEntropyBackwardBf16: null probs, targets, dlogits or count");
  // Blocks across a row: enough for 4 elements a thread, at most 64.
  const int64_t across = std::min<int64_t>(64, (vocab + 4 * kThreads - 1) / (4 * kThreads));
  const dim3 grid(static_cast<unsigned>(across), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  SoftmaxCrossEntropyBackwardBf16Kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      probs, targets, dlogits, rows, vocab, ld, scale, count);
  return ZINF_CHECK_LAUNCH("SoftmaxCrossEntropyBackwardBf16Kernel");
}

Status SoftmaxCrossEntropyGradBf16(const float* logits, const int32_t* targets, uint16_t* dlogits, int64_t rows,
                                   int64_t vocab, int64_t ld, float scale, const float* count, void* stream) {
  const char* fn = "gpu::SoftmaxCrossEntropyGradBf16";
  ZINF_RETURN_IF_ERROR(CheckLossRows(fn, rows, vocab, ld));
  if (rows == 0) return Status::Ok();
  if (!logits || !targets || !dlogits || !count) {
    return InvalidArgument(std::string(fn) + ": null logits, targets, dlogits or count");
  }
  const size_t n = static_cast<size_t>((rows - 1) * ld + vocab);
  if (Overlap(logits, n * 4, dlogits, n * 2)) return InvalidArgument(std::string(fn) + ": dlogits overlaps logits");
  SoftmaxCrossEntropyGradBf16Kernel<<<BlocksForRows(rows), kLossThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, targets, dlogits, rows, vocab, ld, scale, count);
  return ZINF_CHECK_LAUNCH("SoftmaxCrossEntropyGradBf16Kernel");
}

Status MeanLoss(const float* losses, const int32_t* targets, int64_t rows, float* loss, float* count, void* stream) {
  if (rows < 0) return InvalidArgument("gpu::MeanLoss: rows " + std::to_string(rows));
  if (!count || (rows > 0 && (!losses || !targets)))
    return InvalidArgument("gpu::MeanLoss: null losses, targets or count");
  MeanLossKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(losses, targets, rows, loss, count);
  return ZINF_CHECK_LAUNCH("MeanLossKernel");
}

Status ScaleByCount(float* x, size_t n, float scale, const float* count, void* stream) {
  if (n == 0) return Status::Ok();
  if (!x || !count) return InvalidArgument("gpu::ScaleByCount: null x or count");
  ScaleByCountKernel<<<BlocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, scale, count);
  return ZINF_CHECK_LAUNCH("ScaleByCountKernel");
}

}  // namespace zinf::gpu
