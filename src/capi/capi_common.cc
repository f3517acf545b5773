// The library-wide part of the C ABI: errors, version, logging, strings.
// Thread-safety: the last error and the call CPU total are thread-local;
// the accounting switch is atomic; the rest is stateless.
#include <cstdlib>
#include <string>

#include "capi/capi_internal.h"
#include "common/logging.h"
#include "zinf/zinf.h"

namespace zinf::capi {
namespace {

thread_local std::string t_last_error;
thread_local int64_t t_call_cpu_ns = 0;

// The C enum mirrors zinf::StatusCode value for value.
static_assert(ZINF_OK == static_cast<int>(StatusCode::kOk));
static_assert(ZINF_ERR_INVALID_ARGUMENT == static_cast<int>(StatusCode::kInvalidArgument));
static_assert(ZINF_ERR_NOT_FOUND == static_cast<int>(StatusCode::kNotFound));
static_assert(ZINF_ERR_ALREADY_EXISTS == static_cast<int>(StatusCode::kAlreadyExists));
static_assert(ZINF_ERR_FAILED_PRECONDITION == static_cast<int>(StatusCode::kFailedPrecondition));
static_assert(ZINF_ERR_OUT_OF_RANGE == static_cast<int>(StatusCode::kOutOfRange));
static_assert(ZINF_ERR_UNIMPLEMENTED == static_cast<int>(StatusCode::kUnimplemented));
static_assert(ZINF_ERR_IO == static_cast<int>(StatusCode::kIoError));
static_assert(ZINF_ERR_DATA_LOSS == static_cast<int>(StatusCode::kDataLoss));
static_assert(ZINF_ERR_OUT_OF_MEMORY == static_cast<int>(StatusCode::kOutOfMemory));
static_assert(ZINF_ERR_UNAVAILABLE == static_cast<int>(StatusCode::kUnavailable));
static_assert(ZINF_ERR_INTERNAL == static_cast<int>(StatusCode::kInternal));

}  // namespace

std::atomic<bool> g_count_call_cpu{false};

void AddCallCpu(int64_t ns) noexcept { t_call_cpu_ns += ns; }

void ClearLastError() noexcept { t_last_error.clear(); }

int SetLastError(const char* function, const Status& status) noexcept {
  try {
    t_last_error = std::string(function) + ": " + status.message();
  } catch (...) {
    t_last_error.clear();  // no memory for the message; the code still says what happened
  }
  return static_cast<int>(status.code());
}

}  // namespace zinf::capi

using zinf::capi::Guard;

extern "C" {

ZINF_API const char* zinf_last_error(void) { return zinf::capi::t_last_error.c_str(); }

ZINF_API void zinf_call_cpu_accounting(int enable) {
  zinf::capi::g_count_call_cpu.store(enable != 0, std::memory_order_relaxed);
}

ZINF_API double zinf_thread_call_cpu_seconds(void) { return zinf::capi::t_call_cpu_ns * 1e-9; }

ZINF_API const char* zinf_status_name(int code) {
  if (code < ZINF_OK || code > ZINF_ERR_INTERNAL) return "Unknown";
  // StatusCodeName returns views of string literals: NUL-terminated.
  return zinf::StatusCodeName(static_cast<zinf::StatusCode>(code)).data();
}

ZINF_API const char* zinf_version(void) {
#define ZINF_CAPI_STR2_(x) #x
#define ZINF_CAPI_STR_(x) ZINF_CAPI_STR2_(x)
  return ZINF_CAPI_STR_(ZINF_VERSION_MAJOR) "." ZINF_CAPI_STR_(ZINF_VERSION_MINOR) "." ZINF_CAPI_STR_(
      ZINF_VERSION_PATCH);
}

ZINF_API int zinf_abi_version(void) { return ZINF_ABI_VERSION; }

ZINF_API int zinf_set_log_level(const char* level) {
  return Guard(__func__, [&]() -> zinf::Status {
    ZINF_RETURN_IF_ERROR(zinf::capi::NotNull(level, "level"));
    if (!zinf::SetLogLevel(level)) {
      return zinf::InvalidArgument(std::string("unknown log level '") + level +
                                   "'; expected trace, debug, info, warn, error or off");
    }
    return zinf::Status::Ok();
  });
}

ZINF_API void zinf_string_free(char* str) { std::free(str); }

}  // extern "C"
