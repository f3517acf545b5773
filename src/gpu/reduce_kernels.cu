// The rank-order reduction on the GPU: one thread per output element (grid
// stride), each applying reduce::ReduceElement — the same fp32 widen,
// combine in rank order, and single rounding as the host's
// ReduceInRankOrder. Built with --fmad=false, like every zinf kernel, though
// a sum of additions has nothing to contract.
#include "gpu/reduce_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "gpu/cuda_check.h"

namespace zinf::gpu {
namespace {

template <typename Codec, ReduceOp kOp>
__global__ void ReduceInRankOrderKernel(const typename Codec::Storage* __restrict__ staging,
                                        const typename Codec::Storage* self, int self_rank, int n,
                                        typename Codec::Storage* out, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    auto element_of = [&](int r) {
      return r == self_rank ? self[i] : staging[static_cast<size_t>(r < self_rank ? r : r - 1) * count + i];
    };
    // Every input of element i is read before out[i] is written: out may be self.
    out[i] = reduce::ReduceElement<Codec, kOp>(element_of, n);
  }
}

template <typename Codec, ReduceOp kOp>
Status Launch(const void* staging, const void* self, int self_rank, int n, void* out, size_t count,
              cudaStream_t stream) {
  using T = typename Codec::Storage;
  constexpr unsigned kThreads = 256;
  const size_t blocks = std::min<size_t>((count + kThreads - 1) / kThreads, 1u << 16);
  ReduceInRankOrderKernel<Codec, kOp><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const T*>(staging), static_cast<const T*>(self), self_rank, n, static_cast<T*>(out), count);
  ZINF_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

template <typename Codec>
Status LaunchWithCodec(const void* staging, const void* self, int self_rank, int n, void* out, size_t count,
                       ReduceOp op, cudaStream_t stream) {
  if (op == ReduceOp::kSum) return Launch<Codec, ReduceOp::kSum>(staging, self, self_rank, n, out, count, stream);
  return Launch<Codec, ReduceOp::kMax>(staging, self, self_rank, n, out, count, stream);
}

}  // namespace

Status LaunchReduceInRankOrder(const void* staging, const void* self, int self_rank, int n, void* out, size_t count,
                               DType dtype, ReduceOp op, void* cuda_stream) {
  if (n < 1 || self_rank < 0 || self_rank >= n)
    return InvalidArgument("LaunchReduceInRankOrder: rank " + std::to_string(self_rank) + " of " + std::to_string(n));
  if (count == 0) return Status::Ok();
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  switch (dtype) {
    case DType::kFloat32:
      return LaunchWithCodec<reduce::Fp32Codec>(staging, self, self_rank, n, out, count, op, stream);
    case DType::kBFloat16:
      return LaunchWithCodec<reduce::Bf16Codec>(staging, self, self_rank, n, out, count, op, stream);
    case DType::kFloat16:
      return LaunchWithCodec<reduce::Fp16Codec>(staging, self, self_rank, n, out, count, op, stream);
  }
  return InvalidArgument("LaunchReduceInRankOrder: unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace zinf::gpu
