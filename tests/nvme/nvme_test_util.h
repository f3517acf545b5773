// Helpers for the NVMe tests: aligned buffers, random bytes, a fresh
// directory per test under zinf::test::TestDir().
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "test_util.h"

namespace zinf::nvme::testing {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<char[], AlignedFree>;

inline AlignedBuffer Aligned(size_t bytes) {
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096);
  std::memset(p, 0, (bytes + 4095) / 4096 * 4096 + 4096);
  return AlignedBuffer(static_cast<char*>(p));
}

inline void FillRandom(char* p, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < bytes; ++i) p[i] = static_cast<char>(rng());
}

// A new, empty directory for the running test.
inline std::string FreshDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char& c : name)
    if (c == '/') c = '_';
  std::string dir = zinf::test::TestDir() + "/nvme/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace zinf::nvme::testing
