// The device contract: memory with a budget, ordered streams, events and
// async copies. HostDevice (the CPU standing in for an accelerator) and
// CudaDevice implement it; the engine, the model and the communicators use
// only this. No CUDA header is needed to use it.
//
// Streams run work in FIFO order. Work on different streams is unordered
// unless an event orders it (Event::Record on one stream, Stream::Wait on
// another). Calls that enqueue return once the work is queued, never waiting
// for it; an error that happens while queued work runs is sticky on its
// stream and returned by the stream's next Synchronize (and by every later
// one). Device memory is reached from host code only inside a stream task,
// through StreamContext::Host — on a GPU it is not host-addressable at all,
// and HostDevice's checking mode enforces the same rule on the CPU.
//
// Thread-safety: every method may be called from any thread; one stream's
// order is the order its enqueue calls return in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "zinf/status.h"

namespace zinf {

class Stream;

// Recorded on a stream; completes when the work before it on that stream has.
class Event {
 public:
  virtual ~Event() = default;
  // Captures the current tail of `stream`. Re-recording moves the event.
  virtual Status Record(Stream& stream) = 0;
  // True when the captured work has completed (or the event was never recorded).
  virtual Result<bool> Query() = 0;
  // Blocks the calling host thread until the captured work has completed.
  virtual Status Synchronize() = 0;
  // Seconds from `start`'s completion to this event's, as the device saw
  // them, without waiting: kFailedPrecondition while either has not
  // completed. Both must come from Device::CreateTimingEvent. Timing device
  // work this way puts no host code on a stream.
  virtual Result<double> SecondsSince(Event& start) = 0;
};

// Passed to stream tasks: the only place host code may touch device memory.
class StreamContext {
 public:
  virtual ~StreamContext() = default;
  // A host address for `device_ptr` (identity unless HostDevice checks).
  // Valid only during the task. On CUDA, device memory is not addressable:
  // this returns nullptr and tasks must not touch device memory.
  virtual void* Host(const void* device_ptr) const = 0;
};

// A unit of work on a stream: host code run in stream order on the stream's
// own worker thread (HostDevice and CUDA alike: on CUDA the worker waits for
// an event recorded at the task's place and the stream then waits for the
// task, so tasks of different streams never queue behind one another as
// CUDA host functions may; HostDevice also runs tasks on a host thread
// that synchronizes the stream, or enqueues a short one on an idle stream).
// It must not call CUDA. A non-OK status becomes the stream's sticky error.
using StreamTask = std::function<Status(const StreamContext&)>;

class Stream {
 public:
  virtual ~Stream() = default;
  // Runs `task` after everything enqueued before it.
  virtual Status Enqueue(StreamTask task) = 0;
  // Enqueue for a task its caller knows to be short (bookkeeping, or work
  // on a few KiB) that takes no lock the caller may hold. A stream run by a
  // host thread (HostDevice) with nothing queued or running may run it on
  // the calling thread before returning, in its place in stream order,
  // which costs less than waking the stream's thread for it. Elsewhere it
  // is Enqueue.
  virtual Status EnqueueShort(StreamTask task) { return Enqueue(std::move(task)); }
  // Later work on this stream waits until `event` completes.
  virtual Status Wait(Event& event) = 0;
  // Blocks until all work enqueued so far has run; returns the sticky error.
  virtual Status Synchronize() = 0;
  // The sticky error so far, without waiting (work still queued may fail
  // later): a loop that never synchronizes still stops at a failure.
  virtual Status sticky_error() = 0;
  // cudaStream_t for CudaDevice, nullptr for HostDevice.
  virtual void* native_handle() const = 0;
  // Unique for the process lifetime (addresses are reused; ids are not).
  virtual uint64_t id() const = 0;
};

struct DeviceMemoryStats {
  uint64_t budget_bytes = 0;  // the reservation; nothing is allocated beyond it
  uint64_t in_use_bytes = 0;  // handed out, in size-class blocks
  uint64_t peak_in_use_bytes = 0;
  uint64_t requested_bytes = 0;     // what callers asked for (in_use minus rounding)
  uint64_t largest_free_bytes = 0;  // the biggest contiguous free range
  uint64_t allocations = 0;         // live allocations
};

// Host threads waiting on the device: Stream::Synchronize and
// Event::Synchronize called from outside the device's own workers that found
// the work unfinished and blocked. `draining` counts those after which the
// stream waited on had nothing queued (the device idles until the host
// enqueues again: a bubble), as a stream Synchronize always does. A wait for
// an event with later work queued behind it (a bounded run-ahead) blocks the
// host but keeps the device fed. HostDevice counts both exactly; CudaDevice
// counts blocking waits, and as draining only the stream Synchronize calls
// (kernels launched outside zinf's Stream calls are invisible to it).
struct DeviceWaitStats {
  uint64_t blocking = 0;
  uint64_t draining = 0;
};

enum class DeviceKind { kHost, kCuda };

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  // "host", "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string name() const = 0;

  // Device memory from the budget, usable by work enqueued on `stream` after
  // this call (and on other streams once ordered after it by an event).
  // Beyond the budget — fragmentation included — it is kOutOfMemory naming
  // budget, in use and request. Never allocates from the driver on this path.
  virtual Result<void*> Allocate(uint64_t bytes, Stream& stream) = 0;
  // Returns memory once the work enqueued on `stream` so far is done with
  // it; another stream reuses it only after an event says so.
  virtual Status Free(void* device_ptr, Stream& stream) = 0;
  virtual DeviceMemoryStats memory_stats() const = 0;
  virtual DeviceWaitStats wait_stats() const = 0;

  virtual Result<std::unique_ptr<Stream>> CreateStream() = 0;
  // A framework's own stream as a zinf Stream (CUDA: a cudaStream_t of this
  // device; nullptr is the legacy default stream), so zinf's waits and work
  // go straight onto the stream the framework computes on. Not owned: the
  // framework keeps it alive past the returned Stream, which synchronizes it
  // when destroyed. kInvalidArgument for a stream of another device, and on
  // the host device, which has no native streams.
  virtual Result<std::unique_ptr<Stream>> AdoptStream(void* native_handle) = 0;
  virtual Result<std::unique_ptr<Event>> CreateEvent() = 0;
  // An event that can also be timed (Event::SecondsSince); on CUDA a little
  // dearer to record than a plain one.
  virtual Result<std::unique_ptr<Event>> CreateTimingEvent() = 0;

  // Async copies in `stream` order. Host memory should be pinned (the CPU
  // tier's pool) for transfers to overlap; HostDevice accepts any.
  virtual Status CopyToDevice(void* device_dst, const void* host_src, uint64_t bytes, Stream& stream) = 0;
  virtual Status CopyToHost(void* host_dst, const void* device_src, uint64_t bytes, Stream& stream) = 0;
  virtual Status CopyOnDevice(void* device_dst, const void* device_src, uint64_t bytes, Stream& stream) = 0;
  virtual Status Memset(void* device_dst, int byte, uint64_t bytes, Stream& stream) = 0;
};

struct DeviceOptions {
  std::string spec = "auto";   // auto | cpu | cuda | cuda:N
  uint64_t memory_budget = 0;  // bytes; 0 = HostDevice: 1/4 of RAM, CUDA: 90% of free memory
  bool checking = false;       // HostDevice: tagged pointers, random 0-2 ms delays per stream op
  // HostDevice: stream tasks (Stream::Enqueue) of all streams run one at a
  // time, as CUDA may serialize host functions across streams; copies,
  // memsets and event operations are not tasks and still overlap them. A
  // schedule that needs two tasks to run at once, or a task that waits for
  // another stream's task, hangs here as it would there. Also on when the
  // environment sets ZINF_SERIALIZE_TASKS=1.
  bool serialize_tasks = false;
  uint64_t seed = 0;  // for checking-mode delays (0 = from the clock)
};

// The registry: "auto" picks CUDA when a device is present, else the host,
// and logs which. A CUDA build on a machine without a GPU runs on the host.
Result<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options);

}  // namespace zinf
