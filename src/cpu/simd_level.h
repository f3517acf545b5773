// Which SIMD instruction set the CPU kernels run with. Detected once at run
// time (xsimd's CPUID probe), capped by ZINF_SIMD (scalar|sse2|avx2|avx512)
// for testing and comparison. Thread-safe.
#pragma once

#include <string_view>

#include "zinf/status.h"

namespace zinf::cpu {

enum class SimdLevel { kScalar = 0, kSse2 = 1, kAvx2 = 2, kAvx512 = 3 };

std::string_view SimdLevelName(SimdLevel level);  // "scalar", "sse2", "avx2", "avx512bw"
Result<SimdLevel> ParseSimdLevel(std::string_view name);

// The best level this CPU supports (AVX-512 means F+CD+DQ+BW).
SimdLevel DetectedSimdLevel();
// DetectedSimdLevel(), lowered to ZINF_SIMD when that is set and lower.
SimdLevel ActiveSimdLevel();

}  // namespace zinf::cpu
