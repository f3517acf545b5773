// What the engine's tests share: results the test cannot go on without
// (a failure is reported, then the process aborts, so that a rank that
// cannot go on never leaves the other ranks waiting on a deadline only),
// and the reproducible values in [-1, 1) their parameters and gradients
// are drawn from.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "test_util.h"
#include "zinf/status.h"

namespace zinf::test {

template <class T>
T Must(Result<T> r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) std::abort();
  return std::move(*r);
}

inline void MustOk(const Status& s) {
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) std::abort();
}

// Value (a, b, c) of a uniform draw in [-1, 1), 2^-23 apart.
inline float Uniform(uint64_t a, uint64_t b, uint64_t c) {
  return static_cast<float>(SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c) >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

}  // namespace zinf::test
