#include "cpu/io_memory.h"

#include <sys/mman.h>
#include <unistd.h>

namespace zinf {
namespace {

constexpr uint64_t kHugePage = uint64_t{2} << 20;

uint64_t RoundToPages(uint64_t bytes) {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

}  // namespace

void* MapIoMemory(uint64_t bytes) {
  const uint64_t len = RoundToPages(bytes == 0 ? 1 : bytes);
  if (len < kHugePage) {
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  // Map a huge page more than asked, keep the 2 MiB-aligned middle.
  void* raw = mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + kHugePage - 1) & ~(kHugePage - 1);
  if (start > base) munmap(raw, start - base);
  const uintptr_t end = base + len + kHugePage;
  if (end > start + len) munmap(reinterpret_cast<void*>(start + len), end - (start + len));
  void* p = reinterpret_cast<void*>(start);
  madvise(p, len, MADV_HUGEPAGE);  // advice: ordinary pages where it is not taken
  return p;
}

void UnmapIoMemory(void* p, uint64_t bytes) {
  if (p != nullptr) munmap(p, RoundToPages(bytes == 0 ? 1 : bytes));
}

IoMemory AllocateIoMemory(uint64_t bytes) {
  return IoMemory(static_cast<char*>(MapIoMemory(bytes)), IoMemoryDeleter{bytes});
}

}  // namespace zinf
