// A CPU emulation of the SIMT execution the hand-written tensor-core kernels
// rely on, so that their logic (indices, fragment layouts, barriers, the
// double-buffered copies) is checked on machines without a GPU. Each thread
// of a block is a fiber with its own stack; the blocks of a grid run one
// after another. The warp-wide instructions the kernels use (gpu/simt.cuh)
// wait for all 32 lanes of the warp, then compute every lane's result:
//   mma.sync m16n8k16 (bf16 operands, fp32 accumulators), ldmatrix .x4 and
//   .x4.trans, shfl.xor over the full warp, shfl.idx over any member mask
//   (a half-warp's: the lanes of a mask wait for one another alone);
// __syncthreads waits for the block's live threads (a thread that returned
// counts as arrived, as on sm_70 and later). cp.async copies land either as
// they are issued or only at the issuing thread's wait (CopyTiming), so a
// read that races its copy, or a copy into a buffer still being read, shows
// as a wrong result under one of the two.
//
// It checks what the hardware leaves undefined: a warp whose lanes reach
// different warp instructions, a lane that returns while its warp waits, a
// deadlock, an ldmatrix or cp.async address outside the block's shared
// memory or misaligned. Each is an error of Launch naming the block, thread
// and instruction.
//
// The products add in their k order in fp32, the tensor cores in their own:
// results agree with a GPU's within the rounding of the sums, not bit for
// bit. Timing says nothing about a GPU.
//
// Not thread-safe within a launch (kernels run on the calling thread);
// launches on different threads are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "zinf/status.h"

namespace zinf::gpu::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// When a cp.async copy writes its destination.
enum class CopyTiming {
  kAtIssue,  // at once: a copy into a buffer other warps still read corrupts it
  kAtWait,   // at the issuing thread's cp.async.wait_all: an early read sees stale data
};

struct LaunchConfig {
  Dim3 grid, block;
  size_t smem_bytes = 0;  // dynamic shared memory, filled with 0xff bytes (NaN) at each block's start, as
                          // the static shared memory is
  CopyTiming copies = CopyTiming::kAtWait;
  // 0: lockstep, every runnable thread once a pass in index order, so the
  // warps keep pace with one another; otherwise each pass runs the warps
  // in an order shuffled from this seed, each as far as it can go (to a
  // barrier or its end) before the next: warps run ahead of the others, as
  // a missing barrier needs to show.
  uint64_t schedule_seed = 0;
};

// Runs `kernel` once for every thread of every block (threadIdx ... valid
// inside it); kInvalidArgument for a block of no threads, more than 1024,
// or a count not a multiple of 32, kInternal for a broken rule (above).
Status Launch(const LaunchConfig& config, const std::function<void()>& kernel);

// ---- what a kernel reads and calls (through gpu/simt.cuh) ----
const Dim3& ThreadIdx();
const Dim3& BlockIdx();
const Dim3& BlockDim();
const Dim3& GridDim();
unsigned char* DynamicSmem();
// A static shared array of `bytes`: the same place for every thread of the
// block that passes the same key (at most kStaticSmemBytes in all).
void* StaticSmem(const void* key, size_t bytes, size_t align);
inline constexpr size_t kStaticSmemBytes = 48 << 10;

void SyncThreads();
uint32_t ShflXor(uint32_t value, int lane_mask);
// shfl.sync.idx over the lanes of `members` (this lane among them, each
// calling with the same mask, source lane and width): the value of lane
// (this lane / width) · width + src_lane % width, which must be a member.
uint32_t ShflIdx(uint32_t members, uint32_t value, int src_lane, int width);
// d = a · b + c for the warp's m16n8k16 tile (each lane's fragment).
void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16; `row` is this lane's
// row address (lane 8i + r: row r of matrix i).
void LoadMatrices(uint32_t (&m)[4], const void* row, bool trans);
// cp.async of `bytes` (4 or 16) from global src to shared dst, of which the
// first src_bytes are copied and the rest zero-filled.
void CpAsync(void* dst, const void* src, int bytes, int src_bytes);
void CpAsyncWaitAll();
// An error of the launch unless p is `bytes`-aligned (a vector access of
// global memory, which the hardware faults on otherwise).
void CheckAligned(const void* p, int bytes, const char* what);

}  // namespace zinf::gpu::emu
