// Flash attention on tensor cores: the launches and their checks (the
// kernels and what they compute: gpu/flash_attention_kernels.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "gpu/cuda_check.h"
#include "gpu/flash_attention_kernels.cuh"
#include "gpu/kernels.h"
#include "math/attention_math.h"

namespace zinf::gpu {
namespace {

using namespace flash;  // NOLINT(build/namespaces): the kernels' own header

Status Check(const char* fn, const AttentionShape& s, const AttentionTensors& t, bool backward) {
  ZINF_RETURN_IF_ERROR(math::CheckAttentionShape(s, t, backward).WithContext(fn));
  if (s.head_dim != 64 && s.head_dim != 128) {
    return InvalidArgument(std::string(fn) + ": head_dim " + std::to_string(s.head_dim) +
                           " (the CUDA kernels take 64 or 128)");
  }
  // The grid (LaunchShape): batch · heads blocks along x, the query blocks along y (at most 65535).
  if (s.batch * s.heads > 0x7fffffff) return InvalidArgument(std::string(fn) + ": batch · heads above 2^31 - 1");
  if ((s.seq_len + kB - 1) / kB > 65535) {
    return InvalidArgument(std::string(fn) + ": seq_len " + std::to_string(s.seq_len) + " above " +
                           std::to_string(65535 * kB) + " (65535 blocks of " + std::to_string(kB) + " queries)");
  }
  return Status::Ok();
}

// Whether the kernels read the bf16 copies (AttentionTensors::q16 ...):
// q16, k16 and v16 (and dout16 in backward) all given, each 16-byte aligned
// with a stride that is a multiple of 8, or none of them.
Result<bool> ReadsCopies(const char* fn, const AttentionTensors& t, bool backward) {
  struct Copy {
    const char* name;
    const uint16_t* p;
    int64_t stride;
  };
  const Copy copies[] = {{"q16", t.q16, t.q_stride},
                         {"k16", t.k16, t.kv_stride},
                         {"v16", t.v16, t.kv_stride},
                         {"dout16", t.dout16, t.out_stride}};
  const int n = backward ? 4 : 3;
  int given = 0;
  for (int i = 0; i < n; ++i) given += copies[i].p != nullptr;
  if (given == 0) return false;
  if (given < n) {
    return InvalidArgument(std::string(fn) + ": bf16 copies of q, k, v" + (backward ? " and dout" : "") +
                           " go together (" + std::to_string(given) + " of " + std::to_string(n) + " given)");
  }
  for (int i = 0; i < n; ++i) {
    if (reinterpret_cast<uintptr_t>(copies[i].p) % 16 != 0 || copies[i].stride % 8 != 0) {
      return InvalidArgument(std::string(fn) + ": bf16 copy " + copies[i].name + " must be 16-byte aligned with a " +
                             "stride that is a multiple of 8 (stride " + std::to_string(copies[i].stride) + ")");
    }
  }
  return true;
}

// Whether a block of the current device may take `bytes` of shared memory.
// The two-buffer kernels for head_dim 128 take up to 103 KiB, past the
// 99 KiB of sm_86, sm_89 and sm_120 parts: those run the one-buffer kernels,
// which read the fp32 inputs (the same bits either way).
Result<bool> BlockSmemFits(int bytes) {
  int device = 0, optin = 0;
  ZINF_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  ZINF_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes <= optin;
}

// Launches the kernel with launch shape l, after raising its shared-memory
// limit where it takes any.
template <class Kernel>
Status Launch(Kernel kernel, const char* name, const LaunchShape& l, void* stream, const AttentionShape& s,
              const AttentionTensors& t) {
  if (l.smem > 0) {
    ZINF_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, l.smem));
  }
  kernel<<<dim3(l.grid_x, l.grid_y), l.threads, l.smem, static_cast<cudaStream_t>(stream)>>>(s, t);
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::Ok();
  return CudaError(err, (std::string("launch of ") + name).c_str(), __FILE__, __LINE__);
}

template <int D, bool kAsync, int kM>
Status Forward(const AttentionShape& s, const AttentionTensors& t, void* stream) {
  return Launch(FlashForwardKernel<D, kAsync, kM>, "FlashForwardKernel", ForwardLaunch<D, kAsync, kM>(s), stream, s, t);
}

template <int D, bool kAsync, int kKvMin = kKvMinBlocks<D>>
Status Backward(const AttentionShape& s, const AttentionTensors& t, void* stream) {
  ZINF_RETURN_IF_ERROR(Launch(FlashDeltaKernel<D>, "FlashDeltaKernel", DeltaLaunch(s), stream, s, t));
  ZINF_RETURN_IF_ERROR(Launch(FlashBackwardKvKernel<D, kAsync, kKvMin>, "FlashBackwardKvKernel",
                              BackwardKvLaunch<D, kAsync>(s), stream, s, t));
  return Launch(FlashBackwardQKernel<D, kAsync>, "FlashBackwardQKernel", BackwardQLaunch<D, kAsync>(s), stream, s, t);
}

std::atomic<bool> copies_disabled{false};  // DisableFlashAttentionCopiesForTesting

}  // namespace

void DisableFlashAttentionCopiesForTesting(bool disabled) { copies_disabled.store(disabled); }

Result<bool> FlashAttentionCopiesFit(int64_t head_dim) {
  if (head_dim != 64 && head_dim != 128) {
    return InvalidArgument("gpu::FlashAttentionCopiesFit: head_dim " + std::to_string(head_dim));
  }
  if (copies_disabled.load()) return false;
  static_assert(BackwardKvSmem<128, true>() >= BackwardQSmem<128, true>() &&
                BackwardKvSmem<128, true>() >= ForwardSmem<128, true>() &&
                BackwardKvSmem<64, true>() >= BackwardQSmem<64, true>() &&
                BackwardKvSmem<64, true>() >= ForwardSmem<64, true>());
  return BlockSmemFits(head_dim == 64 ? BackwardKvSmem<64, true>() : BackwardKvSmem<128, true>());
}

Status FlashAttentionForward(const AttentionShape& shape, const AttentionTensors& tensors, void* stream,
                             int query_tiles) {
  const char* fn = "gpu::FlashAttentionForward";
  ZINF_RETURN_IF_ERROR(Check(fn, shape, tensors, false));
  ZINF_ASSIGN_OR_RETURN(bool copies, ReadsCopies(fn, tensors, false));
  if (copies) {
    ZINF_ASSIGN_OR_RETURN(copies, FlashAttentionCopiesFit(shape.head_dim));
  }
  if (shape.head_dim == 64) {
    if (query_tiles != 0 && query_tiles != 1 && query_tiles != 2) {
      return InvalidArgument(std::string(fn) + ": query_tiles " + std::to_string(query_tiles) +
                             " (0 for the default, 1 or 2 at head_dim 64)");
    }
    static_assert(kForwardTiles<64> == 2);
    if (query_tiles == 1) {
      return copies ? Forward<64, true, 1>(shape, tensors, stream) : Forward<64, false, 1>(shape, tensors, stream);
    }
    return copies ? Forward<64, true, 2>(shape, tensors, stream) : Forward<64, false, 2>(shape, tensors, stream);
  }
  if (query_tiles != 0 && query_tiles != 1) {
    return InvalidArgument(std::string(fn) + ": query_tiles " + std::to_string(query_tiles) +
                           " (0 for the default or 1 at head_dim 128)");
  }
  static_assert(kForwardTiles<128> == 1);
  return copies ? Forward<128, true, 1>(shape, tensors, stream) : Forward<128, false, 1>(shape, tensors, stream);
}

Status FlashAttentionBackward(const AttentionShape& shape, const AttentionTensors& tensors, void* stream,
                              int kv_min_blocks) {
  const char* fn = "gpu::FlashAttentionBackward";
  ZINF_RETURN_IF_ERROR(Check(fn, shape, tensors, true));
  ZINF_ASSIGN_OR_RETURN(bool copies, ReadsCopies(fn, tensors, true));
  if (copies) {
    ZINF_ASSIGN_OR_RETURN(copies, FlashAttentionCopiesFit(shape.head_dim));
  }
  // With dout null the copies are all given (ReadsCopies); the kernels
  // without them would load their dO tiles from fp32 dout.
  if (!copies && !tensors.dout) {
    return InvalidArgument(std::string(fn) + ": dout null (dO in dout16 alone) needs the bf16 copies' kernels, " +
                           "whose shared memory this device does not fit at head_dim " +
                           std::to_string(shape.head_dim) + " (FlashAttentionCopiesFit)");
  }
  if (shape.head_dim == 64) {
    if (kv_min_blocks != 0 && kv_min_blocks != 1 && kv_min_blocks != 3) {
      return InvalidArgument(std::string(fn) + ": kv_min_blocks " + std::to_string(kv_min_blocks) +
                             " (0 for the default, 1 or 3 at head_dim 64)");
    }
    static_assert(kKvMinBlocks<64> == 3);
    if (kv_min_blocks == 1) {
      return copies ? Backward<64, true, 1>(shape, tensors, stream) : Backward<64, false, 1>(shape, tensors, stream);
    }
    return copies ? Backward<64, true>(shape, tensors, stream) : Backward<64, false>(shape, tensors, stream);
  }
  if (kv_min_blocks != 0 && kv_min_blocks != 1) {
    return InvalidArgument(std::string(fn) + ": kv_min_blocks " + std::to_string(kv_min_blocks) +
                           " (0 for the default or 1 at head_dim 128)");
  }
  static_assert(kKvMinBlocks<128> == 1);
  return copies ? Backward<128, true>(shape, tensors, stream) : Backward<128, false>(shape, tensors, stream);
}

}  // namespace zinf::gpu
