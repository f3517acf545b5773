// ZINF_HOST_DEVICE marks a function that compiles both for the host and, under
// nvcc, for the GPU (`__host__ __device__`); elsewhere it expands to nothing.
// It is how the CPU kernels and the CUDA kernels share one per-element
// definition of their math (src/math/adam_math.h, src/common/float16.h). Header
// only; no state, so thread-safety does not arise.
#pragma once

#if defined(__CUDACC__)
#define ZINF_HOST_DEVICE __host__ __device__
#else
#define ZINF_HOST_DEVICE
#endif
