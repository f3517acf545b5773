// Dispatch of the CPU kernels by SIMD level, the fixed combination of norm
// lanes, and the FP-environment guard. Compiled with the baseline flags.
#include "cpu/kernels.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

#include "common/check.h"

namespace zinf::cpu {

const KernelTable& Kernels(SimdLevel level) {
  ZINF_CHECK_MSG(static_cast<int>(level) <= static_cast<int>(DetectedSimdLevel()),
                 "SIMD level above what this CPU supports");
#if defined(__x86_64__) || defined(_M_X64)
  switch (level) {
    case SimdLevel::kAvx512:
      return Avx512Kernels();
    case SimdLevel::kAvx2:
      return Avx2Kernels();
    case SimdLevel::kSse2:
      return Sse2Kernels();
    case SimdLevel::kScalar:
      return ScalarKernels();
  }
#endif
  return ScalarKernels();
}

#if defined(__x86_64__) || defined(_M_X64)
// MXCSR: all exceptions masked, round to nearest, FTZ (bit 15) and DAZ (bit 6)
// off. The low 6 bits are sticky exception flags, which do not matter.
constexpr unsigned kDefaultMxcsr = 0x1f80;
constexpr unsigned kFlagBits = 0x3f;
DefaultFpEnvironment::DefaultFpEnvironment() : saved_(_mm_getcsr()) {
  if ((saved_ & ~kFlagBits) != kDefaultMxcsr) _mm_setcsr(kDefaultMxcsr);
}
DefaultFpEnvironment::~DefaultFpEnvironment() {
  if ((saved_ & ~kFlagBits) != kDefaultMxcsr) _mm_setcsr(saved_);
}
#else
DefaultFpEnvironment::DefaultFpEnvironment() = default;
DefaultFpEnvironment::~DefaultFpEnvironment() = default;
#endif

}  // namespace zinf::cpu
