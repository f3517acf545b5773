// The warp- and block-level instructions the hand-written tensor-core
// kernels use, in one place: under nvcc, inline PTX (mma.sync, ldmatrix,
// cp.async) and CUDA's intrinsics; in a host compiler, the CPU emulation of
// gpu/simt_emu.h, with the CUDA keywords and built-ins a kernel file names
// (__global__, threadIdx, float4 ...) defined for it. A kernel header that
// uses only these compiles both ways, so its logic is tested without a GPU
// (tests/gpu/flash_attention_emu_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/float16.h"

// The block's dynamic shared memory, 128-byte aligned.
#define ZINF_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
// A shared array of `count` T, the block's own: `name` indexes as T*.
#define ZINF_STATIC_SMEM(T, name, count) __shared__ T name[count]

namespace zinf::gpu::simt {

using bf16 = __nv_bfloat16;

__device__ inline bf16 Bf16FromBits(uint16_t bits) { return __ushort_as_bfloat16(bits); }
template <class T>
__host__ __device__ constexpr T Min(T a, T b) {
  return a < b ? a : b;
}
template <class T>
__host__ __device__ constexpr T Max(T a, T b) {
  return a < b ? b : a;
}
// An output element as fp32, or as its bf16 rounding to nearest even
// (common/float16.h, as the CPU rounds a product's operand): the kernels
// whose output is only ever a bf16 product's operand write it so directly.
__device__ inline void StoreAs(float* p, float v) { *p = v; }
__device__ inline void StoreAs(uint16_t* p, float v) { *p = FloatToBf16Bits(v); }
// A grid-stride loop's first index and stride, over x.
__device__ inline size_t GlobalThread() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline size_t GridStride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }
// lo and hi rounded to bf16 (nearest even) in one register, lo in the lower
// half: one cvt for two values. The bits of common/float16.h's
// FloatToBf16Bits for every value but NaN (cvt gives the canonical 0x7fff).
__device__ inline uint32_t PackBf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));  // the first source goes high
  return d;
}
// 16 bytes of global memory as four 32-bit words, in one access (the
// address 16-byte aligned): the elementwise kernels' vector loads and stores.
struct Words4 {
  uint32_t x, y, z, w;
};
__device__ inline Words4 Load16(const void* p) {
  const uint4 u = *static_cast<const uint4*>(p);
  return Words4{u.x, u.y, u.z, u.w};
}
__device__ inline void Store16(void* p, const Words4& v) { *static_cast<uint4*>(p) = make_uint4(v.x, v.y, v.z, v.w); }
__device__ inline void SyncThreads() { __syncthreads(); }
// The value of lane (this lane ^ lane_mask), all 32 lanes taking part.
__device__ inline float ShflXor(float x, int lane_mask) { return __shfl_xor_sync(0xffffffffu, x, lane_mask); }
// The value of lane (this lane / width) · width + src_lane % width, the
// lanes of `members` taking part (each with the same arguments).
__device__ inline float ShflIdx(unsigned members, float x, int src_lane, int width) {
  return __shfl_sync(members, x, src_lane, width);
}

// d += a · b over the warp's m16n8k16 tile: bf16 operands, fp32 accumulators.
__device__ inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline uint32_t SharedAddress(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// ldmatrix .x4: lane 8i + r gives the shared address of row r of 8×8 matrix
// i; each lane receives, of matrix i, into m[i], row lane / 4's columns
// 2 (lane % 4) and 2 (lane % 4) + 1 (Trans: column lane / 4's rows).
__device__ inline void LoadMatrices(uint32_t (&m)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(m[0]), "=r"(m[1]), "=r"(m[2]), "=r"(m[3])
               : "r"(SharedAddress(row)));
}
__device__ inline void LoadMatricesTrans(uint32_t (&m)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(m[0]), "=r"(m[1]), "=r"(m[2]), "=r"(m[3])
               : "r"(SharedAddress(row)));
}

// cp.async of 16 (through L2 only) or 4 bytes from global src to shared
// dst; with valid false, dst is zero-filled and src (which must still be an
// address) is not read.
__device__ inline void CpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SharedAddress(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ inline void CpAsync4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SharedAddress(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ inline void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits for the thread's own copies; a barrier after it shows every thread's.
__device__ inline void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace zinf::gpu::simt

#else  // a host compiler: the emulation

#include <cstring>

#include "common/float16.h"
#include "gpu/simt_emu.h"

#ifndef __global__
#define __global__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __host__
#define __host__
#endif
#ifndef __forceinline__
#define __forceinline__ inline
#endif
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#define threadIdx (::zinf::gpu::emu::ThreadIdx())
#define blockIdx (::zinf::gpu::emu::BlockIdx())
#define blockDim (::zinf::gpu::emu::BlockDim())
#define gridDim (::zinf::gpu::emu::GridDim())
#define ZINF_DYNAMIC_SMEM(name) unsigned char* name = ::zinf::gpu::emu::DynamicSmem()
// The array's place in the block's static shared memory, keyed by a
// variable of the kernel's own (one per instantiation).
#define ZINF_STATIC_SMEM(T, name, count)        \
  static const char name##_static_smem_key = 0; \
  T* name = static_cast<T*>(::zinf::gpu::emu::StaticSmem(&name##_static_smem_key, sizeof(T) * (count), alignof(T)))

struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct uint2 {
  uint32_t x, y;
};

namespace zinf::gpu::simt {

struct bf16 {
  uint16_t bits;
};

inline bf16 Bf16FromBits(uint16_t bits) { return bf16{bits}; }
template <class T>
constexpr T Min(T a, T b) {
  return a < b ? a : b;
}
template <class T>
constexpr T Max(T a, T b) {
  return a < b ? b : a;
}
inline void StoreAs(float* p, float v) { *p = v; }
inline void StoreAs(uint16_t* p, float v) { *p = FloatToBf16Bits(v); }
inline size_t GlobalThread() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
inline size_t GridStride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }
inline uint32_t PackBf16x2(float lo, float hi) {
  return FloatToBf16Bits(lo) | static_cast<uint32_t>(FloatToBf16Bits(hi)) << 16;
}
struct Words4 {
  uint32_t x, y, z, w;
};
inline Words4 Load16(const void* p) {
  emu::CheckAligned(p, 16, "16-byte global load");
  Words4 v;
  std::memcpy(&v, p, 16);
  return v;
}
inline void Store16(void* p, const Words4& v) {
  emu::CheckAligned(p, 16, "16-byte global store");
  std::memcpy(p, &v, 16);
}
inline void SyncThreads() { emu::SyncThreads(); }
inline float ShflXor(float x, int lane_mask) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = emu::ShflXor(u, lane_mask);
  std::memcpy(&x, &u, 4);
  return x;
}
inline float ShflIdx(unsigned members, float x, int src_lane, int width) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = emu::ShflIdx(members, u, src_lane, width);
  std::memcpy(&x, &u, 4);
  return x;
}
inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { emu::MmaBf16(d, a, b0, b1); }
inline void LoadMatrices(uint32_t (&m)[4], const void* row) { emu::LoadMatrices(m, row, false); }
inline void LoadMatricesTrans(uint32_t (&m)[4], const void* row) { emu::LoadMatrices(m, row, true); }
inline void CpAsync16(void* dst, const void* src, bool valid) { emu::CpAsync(dst, src, 16, valid ? 16 : 0); }
inline void CpAsync4(void* dst, const void* src, bool valid) { emu::CpAsync(dst, src, 4, valid ? 4 : 0); }
inline void CpAsyncCommit() {}
inline void CpAsyncWaitAll() { emu::CpAsyncWaitAll(); }

}  // namespace zinf::gpu::simt

#endif
