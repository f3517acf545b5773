// Status and Result<T>: how every recoverable failure in zinf is reported.
//
// A Status is a code plus a message; context is prepended on the way up
// ("prefetch unit 12: pread /nvme/opt.17 offset=... : Input/output error").
// Result<T> holds either a value or a non-OK Status. Both are [[nodiscard]].
// Exceptions never cross the public API. Thread-safety: values, no sharing.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace zinf {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // the caller passed something wrong
  kNotFound = 2,         // a named thing does not exist
  kAlreadyExists = 3,
  kFailedPrecondition = 4,  // the call is valid, but not in the current state
  kOutOfRange = 5,
  kUnimplemented = 6,
  kIoError = 7,       // an operating-system I/O call failed
  kDataLoss = 8,      // bytes are missing or corrupt (checksum, short file)
  kOutOfMemory = 9,   // a budget or an allocator said no
  kUnavailable = 10,  // a peer or device is not there (dead rank, no GPU)
  kInternal = 11,     // a bug in zinf
};

// "InvalidArgument", "IoError", ...
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "IoError: pread ...". "OK" for success.
  std::string ToString() const;

  // Prepends "context: " to the message of a non-OK status; OK stays OK.
  Status WithContext(std::string_view context) const&;
  Status WithContext(std::string_view context) &&;

  // Explicitly drops a status the caller has decided not to act on.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) { return a.code_ == b.code_ && a.message_ == b.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Constructors for the common codes, e.g. InvalidArgument("block size 0").
Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status AlreadyExists(std::string message);
Status FailedPrecondition(std::string message);
Status OutOfRange(std::string message);
Status Unimplemented(std::string message);
Status IoError(std::string message);
Status DataLoss(std::string message);
Status OutOfMemory(std::string message);
Status Unavailable(std::string message);
Status Internal(std::string message);

// A value or the reason there is none. Accessing value() of an error Result
// is a bug and aborts with the status text.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "Result constructed from OK status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  T& value() & {
    CheckOk();
    return *value_;
  }
  const T& value() const& {
    CheckOk();
    return *value_;
  }
  T&& value() && {
    CheckOk();
    return std::move(*value_);
  }
  T* operator->() {
    CheckOk();
    return &*value_;
  }
  const T* operator->() const {
    CheckOk();
    return &*value_;
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  T value_or(T fallback) const& { return ok() ? *value_ : std::move(fallback); }

 private:
  void CheckOk() const {
    if (!value_) DieOnBadAccess(status_);
  }
  [[noreturn]] static void DieOnBadAccess(const Status& status);

  std::optional<T> value_;
  Status status_;
};

namespace internal {
[[noreturn]] void DieOnBadResultAccess(const Status& status);
}  // namespace internal

template <typename T>
void Result<T>::DieOnBadAccess(const Status& status) {
  internal::DieOnBadResultAccess(status);
}

}  // namespace zinf

#define ZINF_STATUS_CONCAT_INNER_(a, b) a##b
#define ZINF_STATUS_CONCAT_(a, b) ZINF_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when it is not OK.
#define ZINF_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::zinf::Status zinf_status_ = (expr);        \
    if (!zinf_status_.ok()) return zinf_status_; \
  } while (0)

// ZINF_ASSIGN_OR_RETURN(auto x, MakeX()); declares x or returns the error.
#define ZINF_ASSIGN_OR_RETURN(lhs, expr) \
  ZINF_ASSIGN_OR_RETURN_IMPL_(ZINF_STATUS_CONCAT_(zinf_result_, __LINE__), lhs, expr)
#define ZINF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()
