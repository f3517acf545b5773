// io_memory: I/O buffers at a huge-page boundary, advised as huge pages.
#include "cpu/io_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace zinf::cpu {
namespace {

constexpr uint64_t kHugePage = uint64_t{2} << 20;

// The VmFlags line of the mapping that holds `p` in /proc/self/smaps.
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = addr >= lo && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(IoMemoryTest, LargeBuffersStartAtAHugePageAndAreAdvised) {
  const uint64_t bytes = 3 * kHugePage + 4096;  // not a whole number of huge pages
  IoMemory m = AllocateIoMemory(bytes);
  ASSERT_TRUE(m);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.get()) % kHugePage, 0u);
  for (uint64_t i = 0; i < bytes; i += 4096) ASSERT_EQ(m.get()[i], 0) << i;  // zeroed
  std::memset(m.get(), 0x5a, bytes);                                         // every byte writable
  EXPECT_EQ(m.get()[bytes - 1], 0x5a);
  const std::string flags = VmFlagsOf(m.get());
  ASSERT_FALSE(flags.empty()) << "no mapping holds the buffer";
  // MADV_HUGEPAGE, or (where the machine keeps a hugetlb pool) a pool mapping.
  EXPECT_TRUE(flags.find(" hg") != std::string::npos || flags.find(" ht") != std::string::npos) << flags;
}

// Where the hugetlb pool has free pages, a large buffer is made of them
// (VmFlags "ht", 2 MiB kernel pages), zeroed and writable to its last byte.
// Needs root: the test adds pages to the pool and gives them back.
TEST(IoMemoryTest, LargeBuffersComeFromTheHugetlbPoolWhenItHasPages) {
  const char* kPool = "/proc/sys/vm/nr_hugepages";
  auto read_pool = [&] {
    std::ifstream in(kPool);
    long n = -1;
    in >> n;
    return n;
  };
  const long old_pool = read_pool();
  if (old_pool < 0 || !std::ofstream(kPool, std::ios::app)) GTEST_SKIP() << "cannot write " << kPool << " (needs root)";
  struct Restore {
    const char* path;
    long pages;
    ~Restore() { std::ofstream(path) << pages; }
  } restore{kPool, old_pool};
  std::ofstream(kPool) << old_pool + 4;
  if (read_pool() < old_pool + 4) GTEST_SKIP() << "the kernel has no 2 MiB pages to add to the pool";
  const uint64_t bytes = kHugePage + 12345;  // two pool pages
  // Other processes may take the free pages between two calls: a few tries.
  bool pooled = false;
  for (int attempt = 0; attempt < 5 && !pooled; ++attempt) {
    IoMemory m = AllocateIoMemory(bytes);
    ASSERT_TRUE(m);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.get()) % kHugePage, 0u);
    const std::string flags = VmFlagsOf(m.get());
    pooled = flags.find(" ht") != std::string::npos;
    if (!pooled) continue;
    for (uint64_t i = 0; i < bytes; i += 4096) ASSERT_EQ(m.get()[i], 0) << i;
    std::memset(m.get(), 0x3c, bytes);
    EXPECT_EQ(m.get()[bytes - 1], 0x3c);
  }
  EXPECT_TRUE(pooled) << "five buffers in a row were not taken from a pool with free pages";
}

TEST(IoMemoryTest, SmallBuffersAreOrdinaryPages) {
  void* p = MapIoMemory(100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  std::memset(p, 1, 4096);  // the whole page is usable
  UnmapIoMemory(p, 100);
}

TEST(IoMemoryTest, TheTrimmedEndsAreGivenBack) {
  // Map and unmap many times: a leak of the alignment slack (2 MiB a call)
  // would show in the mappings left behind.
  auto mapped_kib = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7));
    }
    return 0ull;
  };
  const auto before = mapped_kib();
  for (int i = 0; i < 64; ++i) {
    void* p = MapIoMemory(kHugePage + 8192);
    ASSERT_NE(p, nullptr);
    UnmapIoMemory(p, kHugePage + 8192);
  }
  EXPECT_LT(mapped_kib(), before + 16 * 1024);  // 64 leaks would be 128 MiB and more
}

// Memory an abandoned MPI transfer may still use stays mapped when released,
// with its pages given back (it reads zeros); other memory is unmapped.
TEST(IoMemoryTest, MemoryHoldingAnAbandonedTransferStaysMapped) {
  const uint64_t bytes = 2 * kHugePage;
  char* held = static_cast<char*>(MapIoMemory(bytes));
  char* other = static_cast<char*>(MapIoMemory(bytes));
  ASSERT_NE(held, nullptr);
  ASSERT_NE(other, nullptr);
  std::memset(held, 0x5A, bytes);
  KeepMappedForAbandonedTransfer(held + kHugePage + 100, 4096);  // a send's piece, inside the buffer
  EXPECT_TRUE(HoldsAbandonedTransfer(held, bytes));
  EXPECT_TRUE(HoldsAbandonedTransfer(held + kHugePage + 4000, 200));
  EXPECT_FALSE(HoldsAbandonedTransfer(held, kHugePage));  // ends before the piece
  EXPECT_FALSE(HoldsAbandonedTransfer(other, bytes));
  EXPECT_EQ(UnmapIoMemory(held, bytes), 0);
  EXPECT_EQ(UnmapIoMemory(other, bytes), 0);
  auto is_mapped = [](const void* p) {  // mincore fails with ENOMEM on an unmapped page
    unsigned char resident = 0;
    return mincore(const_cast<void*>(p), 4096, &resident) == 0;
  };
  EXPECT_TRUE(is_mapped(held + kHugePage));
  EXPECT_FALSE(is_mapped(other));
  EXPECT_EQ(held[kHugePage + 100], 0) << "its pages should have been given back";
}

}  // namespace
}  // namespace zinf::cpu
