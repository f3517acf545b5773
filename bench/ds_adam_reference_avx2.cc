// The ds-shape reference Adam (ds_adam_reference.h) on AVX2: 8 floats a
// vector, DeepSpeed's SIMD_WIDTH on its AVX256 build, which needs FMA and
// F16C as well. Compiled with -mavx2 -mfma -mf16c (bench/CMakeLists.txt);
// only used after the CPU reported all three.
#include "bench/ds_adam_reference_impl.h"

namespace zinf::bench {

DsAdamKernels DsAdamKernelsAvx2() { return KernelsOf<VecOps<8>>("avx2"); }

}  // namespace zinf::bench
