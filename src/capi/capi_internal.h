// What every C ABI entry point shares: the thread-local last error, the
// mapping from Status to zinf_status, and Guard, which runs an entry point's
// body so that no exception leaves it. Private to src/capi.
// Thread-safety: the last error is per thread; everything else is stateless.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <new>
#include <string>

#include "zinf/status.h"
#include "zinf/zinf.h"

namespace zinf::capi {

// Clears the calling thread's last error (each entry point does, on entry).
void ClearLastError() noexcept;
// Records "<function>: <message>" as the calling thread's last error and
// returns the status's code as a zinf_status. Never throws.
int SetLastError(const char* function, const Status& status) noexcept;

// zinf_call_cpu_accounting's switch, and the calling thread's total.
extern std::atomic<bool> g_count_call_cpu;
void AddCallCpu(int64_t ns) noexcept;

// While accounting is on, adds the thread's CPU time from construction to
// destruction to the thread's total.
class CallCpuClock {
 public:
  CallCpuClock() noexcept : on_(g_count_call_cpu.load(std::memory_order_relaxed)) {
    if (on_) on_ = ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start_) == 0;
  }
  ~CallCpuClock() {
    timespec end;
    if (on_ && ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end) == 0) {
      AddCallCpu((end.tv_sec - start_.tv_sec) * int64_t{1000000000} + (end.tv_nsec - start_.tv_nsec));
    }
  }
  CallCpuClock(const CallCpuClock&) = delete;
  CallCpuClock& operator=(const CallCpuClock&) = delete;

 private:
  bool on_;
  timespec start_{};
};

// Runs `body` (returning a zinf::Status) with the last error cleared first;
// a non-OK status or any exception becomes the returned code and the last
// error. The only way the C ABI's entry points run C++ code.
template <typename Body>
int Guard(const char* function, Body&& body) noexcept {
  const CallCpuClock clock;
  ClearLastError();
  try {
    Status status = body();
    return status.ok() ? ZINF_OK : SetLastError(function, status);
  } catch (const std::bad_alloc&) {
    return SetLastError(function, OutOfMemory("out of memory (std::bad_alloc)"));
  } catch (const std::exception& e) {
    return SetLastError(function, Internal(std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return SetLastError(function, Internal("unexpected exception of unknown type"));
  }
}

// For the functions that return nothing (destroy, close, free): runs `body`
// and swallows whatever it throws, since there is no way to report it.
template <typename Body>
void GuardVoid(Body&& body) noexcept {
  try {
    body();
  } catch (...) {
  }
}

// kInvalidArgument "<what> is NULL" when `p` is null.
inline Status NotNull(const void* p, const char* what) {
  return p ? Status::Ok() : InvalidArgument(std::string(what) + " is NULL");
}

}  // namespace zinf::capi
