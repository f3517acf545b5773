// SIMD level detection through xsimd's CPUID probe.
#include "cpu/simd_level.h"

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/logging.h"

namespace zinf::cpu {

std::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kSse2:
      return "sse2";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512bw";
  }
  return "?";
}

Result<SimdLevel> ParseSimdLevel(std::string_view name) {
  if (name == "scalar") return SimdLevel::kScalar;
  if (name == "sse2") return SimdLevel::kSse2;
  if (name == "avx2") return SimdLevel::kAvx2;
  if (name == "avx512" || name == "avx512bw") return SimdLevel::kAvx512;
  return InvalidArgument("unknown SIMD level '" + std::string(name) + "'; expected scalar, sse2, avx2 or avx512");
}

SimdLevel DetectedSimdLevel() {
  static const SimdLevel level = [] {
    auto arch = xsimd::available_architectures();
    if (arch.avx512f && arch.avx512cd && arch.avx512dq && arch.avx512bw) return SimdLevel::kAvx512;
    if (arch.avx2) return SimdLevel::kAvx2;
    if (arch.sse2) return SimdLevel::kSse2;
    return SimdLevel::kScalar;
  }();
  return level;
}

SimdLevel ActiveSimdLevel() {
  static const SimdLevel level = [] {
    SimdLevel best = DetectedSimdLevel();
    if (const char* env = std::getenv("ZINF_SIMD")) {
      auto cap = ParseSimdLevel(env);
      if (!cap.ok()) {
        ZINF_LOG_WARN("ZINF_SIMD: {}; using {}", cap.status().message(), SimdLevelName(best));
      } else {
        best = std::min(best, *cap);
      }
    }
    return best;
  }();
  return level;
}

}  // namespace zinf::cpu
