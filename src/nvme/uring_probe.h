// Whether io_uring works here, for `zinf --version` and for choosing the I/O
// backend: sets up a small ring once and reports the kernel's features, or
// the errno that stopped it (old kernel, seccomp, EPERM). Thread-safe.
#pragma once

#include "common/runtime_info.h"

namespace zinf::nvme {

BackendInfo ProbeIoUring();

}  // namespace zinf::nvme
