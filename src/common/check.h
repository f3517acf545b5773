// ZINF_CHECK: invariants whose violation is a bug in zinf. Aborts with the
// condition, file:line and an optional message in every build type (unlike
// assert, which NDEBUG removes). Never use it for I/O, CUDA or user input:
// those return a Status.
#pragma once

namespace zinf::internal {
[[noreturn]] void CheckFailed(const char* condition, const char* file, int line, const char* message);
}  // namespace zinf::internal

#define ZINF_CHECK(cond)                                                 \
  do {                                                                   \
    if (!(cond)) [[unlikely]]                                            \
      ::zinf::internal::CheckFailed(#cond, __FILE__, __LINE__, nullptr); \
  } while (0)

#define ZINF_CHECK_MSG(cond, msg)                                      \
  do {                                                                 \
    if (!(cond)) [[unlikely]]                                          \
      ::zinf::internal::CheckFailed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
