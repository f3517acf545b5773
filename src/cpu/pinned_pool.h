// Pinned, NUMA-bound host memory for the offload tiers. Every buffer is
// page-aligned, bound with hwloc to one NUMA node (the one nearest the GPU
// when there is one, else the caller's: numa.h), locked with mlock, and
// registered with every MemoryRegistrar the pool was given (CUDA, io_uring),
// so the same bytes serve host compute, device copies and fixed-buffer I/O.
//
// Buffers are reused by size class: a request is rounded up to whole pages,
// then to one of four classes per power of two (at most 25% above the
// request; exact for <= 4 pages), and a released buffer waits in its class
// for the next request of that class. No buffer exceeds 1 GiB, io_uring's
// limit on one registered buffer. Accounting: pinned_bytes counts every byte
// the pool holds (in use or cached) and never exceeds budget_bytes; when a new
// buffer would, cached buffers are freed first, and if that is not enough the
// request fails with kOutOfMemory naming budget and request. When mlock fails
// because RLIMIT_MEMLOCK is too low, the error names the limit, the request,
// what is already locked, and how to raise it.
//
// Thread-safety: PinnedPool is thread-safe (Acquire and buffer release from
// any thread; a new buffer is allocated, locked and registered outside its
// lock, evicted ones are freed under it so the budget holds at every instant).
// A PinnedBuffer is a move-only handle used by one owner at a time; the pool
// must outlive its buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/memory_registrar.h"
#include "cpu/numa.h"
#include "zinf/status.h"

namespace zinf::cpu {

class PinnedPool;

struct PinnedPoolOptions {
  uint64_t budget_bytes = 0;                 // required: the most the pool may hold at once
  std::string gpu_pci_bus_id;                // "0000:17:00.0": bind near this GPU; empty: no GPU
  int numa_node = -1;                        // the caller's node (without a GPU); -1: the calling thread's
  bool lock = true;                          // mlock each buffer (false only where locking is impossible: tests)
  std::vector<MemoryRegistrar*> registrars;  // not owned; must outlive the pool
};

struct PinnedPoolStats {
  uint64_t budget_bytes = 0;
  uint64_t pinned_bytes = 0;       // held now: in use + cached (+ being allocated)
  uint64_t peak_pinned_bytes = 0;  // the most pinned_bytes has been
  uint64_t in_use_bytes = 0;       // capacity of the buffers handed out
  uint64_t cached_bytes = 0;       // capacity of the released buffers kept for reuse
  uint64_t allocations = 0;        // buffers created
  uint64_t reuses = 0;             // requests served from the cache
};

// A buffer from a PinnedPool; returns itself to the pool when destroyed.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Release(); }

  void* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }          // as requested
  uint64_t capacity_bytes() const { return capacity_bytes_; }  // its size class; all of it is usable
  explicit operator bool() const { return data_ != nullptr; }

  // Returns the buffer to its pool now (no-op on an empty handle).
  void Release();

 private:
  friend class PinnedPool;
  PinnedBuffer(PinnedPool* pool, void* data, uint64_t size_bytes, uint64_t capacity_bytes)
      : pool_(pool), data_(data), size_bytes_(size_bytes), capacity_bytes_(capacity_bytes) {}
  PinnedPool* pool_ = nullptr;
  void* data_ = nullptr;
  uint64_t size_bytes_ = 0;
  uint64_t capacity_bytes_ = 0;
};

class PinnedPool {
 public:
  // The largest buffer: far above what a sub-group's state or a unit's
  // staging needs; a registrar splits a buffer where it must (io_uring
  // registers at most 1 GiB per slot: several slots).
  static constexpr uint64_t kMaxBufferBytes = uint64_t{64} << 30;

  // Loads this machine's topology (with PCI devices when a GPU is named) and
  // chooses the node. kInvalidArgument for a zero budget or a bad node.
  static Result<std::unique_ptr<PinnedPool>> Create(PinnedPoolOptions options);
  // The same on a given topology (tests: a synthetic one from XML, on which
  // binding is a no-op).
  static Result<std::unique_ptr<PinnedPool>> Create(PinnedPoolOptions options, HwlocTopology topology);

  // Frees the cached buffers. Every PinnedBuffer must have been released
  // (a bug otherwise: ZINF_CHECK).
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A buffer of at least `bytes` (1 B .. 1 GiB). kInvalidArgument outside
  // that range; kOutOfMemory over budget, when mmap or mlock fails; a
  // registrar's error with its name prepended.
  Result<PinnedBuffer> Acquire(uint64_t bytes);

  // Frees every cached buffer (unregisters, unlocks, unmaps).
  void Trim();

  PinnedPoolStats stats() const;
  int numa_node() const { return choice_.node; }
  const std::string& numa_reason() const { return choice_.reason; }

  // The capacity a request of `bytes` gets: whole pages, then the next of four
  // classes per power of two.
  static uint64_t SizeClassBytes(uint64_t bytes);

 private:
  friend class PinnedBuffer;
  PinnedPool(PinnedPoolOptions options, HwlocTopology topology, NumaChoice choice);

  Result<void*> CreateBuffer(uint64_t capacity_bytes);  // mmap, bind, lock, register
  void DestroyBuffer(void* data, uint64_t capacity_bytes);
  void Return(void* data, uint64_t capacity_bytes);
  // Frees cached buffers (largest first) until `needed` more bytes fit the
  // budget or the cache is empty. Requires mu_.
  void EvictLocked(uint64_t needed);

  const PinnedPoolOptions options_;
  const HwlocTopology topology_;
  const NumaChoice choice_;
  hwloc_nodeset_t nodeset_ = nullptr;  // {choice_.node}

  mutable std::mutex mu_;
  std::map<uint64_t, std::vector<void*>> cache_;  // capacity -> released buffers
  PinnedPoolStats stats_;
};

}  // namespace zinf::cpu
