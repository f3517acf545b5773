// A seam for tests of the engine's schedule: a function called at the start
// of every unit's host update (the boundary's Adam on the host: HostDevice,
// or the optimizer offloaded), on the thread that runs it, with the unit's
// index and the boundary. A test holds one update back with it and watches
// what the caller's stream can do meanwhile. Not for production use: the
// hook is process-wide. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>

namespace zinf::sched::testing {

using HostUpdateHook = std::function<void(int unit, int64_t boundary)>;

// Installs `hook` (an empty function removes it). Install it before the
// engine's first step and remove it after the engine's last.
void SetHostUpdateHook(HostUpdateHook hook);

}  // namespace zinf::sched::testing
