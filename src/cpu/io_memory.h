// Anonymous memory for I/O buffers: 2 MiB-aligned and advised as transparent
// huge pages, so that an O_DIRECT block is one physical segment.
//
// Why: the kernel builds a direct I/O request from the buffer's physical
// segments. In 4 KiB pages a 1 MiB block is 256 segments, more than a
// virtio disk takes in one request (254 here), so the block layer splits
// every block and cannot merge neighbours. In a huge page a block is one
// segment and sequential blocks merge up to the device's largest request:
// the disk then sees fewer, larger requests and serves them faster (counted
// in /proc/diskstats; docs/figures.md, storage).
//
// Huge pages are advice: where the kernel has none to give (THP disabled,
// memory fragmented) the memory is ordinary pages and works the same.
//
// Where the machine keeps a pool of 2 MiB hugetlb pages (vm.nr_hugepages)
// with enough free, buffers of 2 MiB or more come from it instead
// (MAP_HUGETLB; ZINF_IO_HUGETLB=0 turns this off). Pool pages stay with the
// guest: on a VM whose balloon reports free memory to the host, a freshly
// faulted transparent huge page is faulted on the host as well, so its first
// touch costs many times a pool page's (docs/figures.md, storage).
// Thread-safe (plain functions).
#pragma once

#include <cstdint>
#include <memory>

namespace zinf::cpu {

// `bytes` of zeroed anonymous memory: below 2 MiB, whole pages; from 2 MiB,
// whole 2 MiB pages at a 2 MiB boundary, from the hugetlb pool when it has
// them, else advised MADV_HUGEPAGE. nullptr (errno set) when mmap fails.
// Release with UnmapIoMemory(p, bytes) (the same `bytes`), never plain
// munmap(p, bytes): the mapping may be longer.
void* MapIoMemory(uint64_t bytes);
// munmap's result (0, or -1 with errno); 0 without unmapping where the memory
// holds an abandoned transfer.
int UnmapIoMemory(void* p, uint64_t bytes);

// Memory that an abandoned MPI transfer may still read or write: a failed
// collective could not end it (MpiComm), and the transport moves its bytes
// in any later MPI call, MPI_Finalize at exit included. Unmapped, it would
// fault there. So whoever owns memory overlapping such a range leaves it
// mapped when releasing it, and gives only its pages back (MADV_DONTNEED:
// reads see zeros); UnmapIoMemory does, HostDevice's arena too. What stays
// behind after a failure is address space, not memory.
void KeepMappedForAbandonedTransfer(const void* p, uint64_t bytes);
bool HoldsAbandonedTransfer(const void* p, uint64_t bytes);

struct IoMemoryDeleter {
  uint64_t bytes = 0;
  void operator()(char* p) const { UnmapIoMemory(p, bytes); }
};
using IoMemory = std::unique_ptr<char, IoMemoryDeleter>;

// The owning form; empty when mmap fails (errno set).
IoMemory AllocateIoMemory(uint64_t bytes);

}  // namespace zinf::cpu
