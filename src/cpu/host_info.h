// Probes of the CPU-side libraries for `zinf --version`: oneTBB, hwloc's
// topology, the SIMD level, MPI and OpenBLAS. Thread-safe.
#pragma once

#include "common/runtime_info.h"

namespace zinf::cpu {

BackendInfo ProbeTbb();
BackendInfo ProbeHwloc();
BackendInfo ProbeSimd();
BackendInfo ProbeMpi();
BackendInfo ProbeOpenBlas();

}  // namespace zinf::cpu
