// PeakRssBytes and ResetPeakRss: a benchmark measures one phase's peak.
#include "common/runtime_info.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

namespace zinf {
namespace {

constexpr uint64_t kBytes = uint64_t{256} << 20;

// Touches kBytes of fresh anonymous memory and gives it back to the kernel.
void TouchAndUnmap() {
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, kBytes);
  ASSERT_EQ(munmap(p, kBytes), 0);
}

TEST(RuntimeInfoTest, PeakRssCountsMemoryAlreadyGivenBack) {
  const uint64_t before = PeakRssBytes();
  ASSERT_GT(before, 0u);
  TouchAndUnmap();
  EXPECT_GE(PeakRssBytes(), before + kBytes - (uint64_t{16} << 20));
}

TEST(RuntimeInfoTest, ResetStartsANewPeak) {
  TouchAndUnmap();
  const uint64_t with_phase = PeakRssBytes();
  if (!ResetPeakRss()) GTEST_SKIP() << "/proc/self/clear_refs refused the reset";
  const uint64_t after_reset = PeakRssBytes();
  EXPECT_LE(after_reset + kBytes - (uint64_t{16} << 20), with_phase);
  // A later phase counts again from there.
  TouchAndUnmap();
  EXPECT_GE(PeakRssBytes(), after_reset + kBytes - (uint64_t{16} << 20));
}

}  // namespace
}  // namespace zinf
