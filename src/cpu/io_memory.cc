#include "cpu/io_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

namespace zinf::cpu {
namespace {

constexpr uint64_t kHugePage = uint64_t{2} << 20;

uint64_t RoundToPages(uint64_t bytes) {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

uint64_t RoundToHugePages(uint64_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

// ZINF_IO_HUGETLB=0 keeps zinf's buffers out of the hugetlb pool.
bool UseHugetlbPool() {
  static const bool use = [] {
    const char* v = std::getenv("ZINF_IO_HUGETLB");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return use;
}

}  // namespace

void* MapIoMemory(uint64_t bytes) {
  const uint64_t len = RoundToPages(bytes == 0 ? 1 : bytes);
  if (len < kHugePage) {
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  // Whole huge pages from here on: both kinds of mapping cover hlen.
  const uint64_t hlen = RoundToHugePages(len);
  if (UseHugetlbPool()) {
    // Reserved at mmap time: fails at once (ENOMEM) when the pool is short.
    constexpr int kTwoMiBPages = 21 << MAP_HUGE_SHIFT;  // log2 of the page size
    void* p =
        mmap(nullptr, hlen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | kTwoMiBPages, -1, 0);
    if (p != MAP_FAILED) return p;
  }
  // Map a huge page more than asked, keep the 2 MiB-aligned middle.
  void* raw = mmap(nullptr, hlen + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + kHugePage - 1) & ~(kHugePage - 1);
  if (start > base) munmap(raw, start - base);
  const uintptr_t end = base + hlen + kHugePage;
  if (end > start + hlen) munmap(reinterpret_cast<void*>(start + hlen), end - (start + hlen));
  void* p = reinterpret_cast<void*>(start);
  madvise(p, hlen, MADV_HUGEPAGE);  // advice: ordinary pages where it is not taken
  return p;
}

namespace {
std::mutex abandoned_mu;
std::vector<std::pair<uintptr_t, uintptr_t>> abandoned;  // [begin, end), never shrinks
}  // namespace

void KeepMappedForAbandonedTransfer(const void* p, uint64_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(abandoned_mu);
  abandoned.emplace_back(begin, begin + bytes);
}

bool HoldsAbandonedTransfer(const void* p, uint64_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  std::lock_guard<std::mutex> lock(abandoned_mu);
  return std::any_of(abandoned.begin(), abandoned.end(),
                     [&](const auto& r) { return r.first < end && begin < r.second; });
}

int UnmapIoMemory(void* p, uint64_t bytes) {
  if (p == nullptr) return 0;
  const uint64_t len = RoundToPages(bytes == 0 ? 1 : bytes);
  const uint64_t mapped = len < kHugePage ? len : RoundToHugePages(len);
  if (HoldsAbandonedTransfer(p, mapped)) {
    madvise(p, mapped, MADV_DONTNEED);  // the pages go back; the addresses stay, reading zeros
    return 0;
  }
  return munmap(p, mapped);
}

IoMemory AllocateIoMemory(uint64_t bytes) {
  return IoMemory(static_cast<char*>(MapIoMemory(bytes)), IoMemoryDeleter{bytes});
}

}  // namespace zinf::cpu
