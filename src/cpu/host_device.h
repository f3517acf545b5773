// HostDevice: the CPU standing in for an accelerator, so the whole engine
// runs and is tested on a machine without a GPU.
//
// "Device memory" is one budgeted host reservation (mmap), sub-allocated by
// DeviceAllocator. Each stream is a worker thread running its work in FIFO
// order; copies are handed to one copy-engine thread, so they overlap compute
// on other streams as DMA does. Events are generation counters. Fewer
// hand-offs: a host thread waiting on a stream runs the operations still
// queued itself while the worker is between operations, and a copy runs on
// its caller's thread while the copy engine is idle (still one operation at
// a time per stream, one copy at a time per device, in order).
//
// Checking mode (on in tests) makes the CPU catch what would break on a GPU:
// device pointers carry a tag bit that makes them non-canonical, so host code
// that dereferences one outside a stream task faults at once; tasks get the
// real address from StreamContext::Host. And every stream operation is
// delayed by a random 0-2 ms, so a missing event wait shows up here rather
// than on a customer's GPU.
//
// The host's waits on the device (Device::wait_stats) are counted exactly:
// a Synchronize from a thread that is not one of the device's own, that
// blocked, and whether it left the stream it waited on with nothing queued.
//
// Thread-safe. Streams and events must not outlive their device.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "zinf/device.h"

namespace zinf::cpu {

Result<std::unique_ptr<Device>> CreateHostDevice(const DeviceOptions& options);

// Whether `p` is a tagged device pointer of some HostDevice in checking mode
// (for assertions in tests and checking-mode code).
bool IsTaggedDevicePointer(const void* p);

// Where the host addresses all of `device`'s memory as it is: a HostDevice
// not in checking mode, whose one reservation holds every pointer it hands
// out. Empty for any other device, and in checking mode (tagged pointers).
std::span<std::byte> HostAddressableMemory(const Device& device);

}  // namespace zinf::cpu
