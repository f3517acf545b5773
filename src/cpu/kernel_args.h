// Argument checks shared by the CPU kernels' entry points (adam.cc, cast.cc,
// norm.cc): a SIMD level this CPU can run, a known dtype, and buffers that do
// not overlap.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "cpu/simd_level.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::cpu {

inline Status CheckSimdLevel(SimdLevel level) {
  if (static_cast<int>(level) > static_cast<int>(DetectedSimdLevel())) {
    return InvalidArgument("SIMD level " + std::string(SimdLevelName(level)) + " is not supported by this CPU (best: " +
                           std::string(SimdLevelName(DetectedSimdLevel())) + ")");
  }
  return Status::Ok();
}

inline Status CheckDType(DType dtype, const char* what) {
  if (static_cast<unsigned>(dtype) > 2) {
    return InvalidArgument(std::string(what) + ": unknown dtype " + std::to_string(static_cast<int>(dtype)));
  }
  return Status::Ok();
}

struct NamedRange {
  const void* ptr;  // nullptr: absent, not checked
  size_t bytes;
  const char* name;
};

// kInvalidArgument naming the first two ranges that share a byte.
inline Status CheckNoOverlap(std::initializer_list<NamedRange> ranges) {
  for (auto a = ranges.begin(); a != ranges.end(); ++a) {
    for (auto b = a + 1; b != ranges.end(); ++b) {
      if (!a->ptr || !b->ptr || a->bytes == 0 || b->bytes == 0) continue;
      const auto a0 = reinterpret_cast<uintptr_t>(a->ptr), b0 = reinterpret_cast<uintptr_t>(b->ptr);
      if (a0 < b0 + b->bytes && b0 < a0 + a->bytes) {
        return InvalidArgument(std::string(a->name) + " and " + b->name + " overlap");
      }
    }
  }
  return Status::Ok();
}

}  // namespace zinf::cpu
