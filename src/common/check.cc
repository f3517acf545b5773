// The abort behind ZINF_CHECK. Writes straight to stderr (the logger may be
// the thing that is broken) and aborts so a core dump or debugger catches it.
#include "common/check.h"

#include <cstdio>
#include <cstdlib>

namespace zinf::internal {

void CheckFailed(const char* condition, const char* file, int line, const char* message) {
  std::fprintf(stderr, "zinf: check failed at %s:%d: %s%s%s\n", file, line, condition, message ? ": " : "",
               message ? message : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace zinf::internal
