// The registry of the backends this build contains: the one place that asks
// which were built (the #if ZINF_HAVE_* of the device layer live in
// backends.cc). CreateDevice (zinf/device.h) is defined there too.
// Thread-safe.
#pragma once

#include "common/runtime_info.h"

namespace zinf {

// What this build of zinf contains and what it finds on the machine at run
// time: CUDA (and whether a device is present), NCCL, io_uring, oneTBB,
// hwloc's topology, the SIMD level, MPI and OpenBLAS. `zinf --version`
// prints it. Never fails (an unusable backend says why in its detail).
RuntimeInfo ProbeRuntime();

}  // namespace zinf
