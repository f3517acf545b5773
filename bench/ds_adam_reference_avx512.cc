// The ds-shape reference Adam (ds_adam_reference.h) on AVX-512: 16 floats a
// vector, DeepSpeed's SIMD_WIDTH on that build. Compiled with -mavx512f
// -mavx512bw -mfma -mf16c (bench/CMakeLists.txt); only used after
// DetectedSimdLevel() reported AVX-512.
#include "bench/ds_adam_reference_impl.h"

namespace zinf::bench {

DsAdamKernels DsAdamKernelsAvx512() { return KernelsOf<VecOps<16>>("avx512"); }

}  // namespace zinf::bench
