// How a `zinf` subcommand's phases say what stopped it. A phase returns a
// Status whose message is the one line the command prints after its name
// ("zinf train: ..."), and whose code says only which exit code follows:
// InvalidArgument is bad input (exit code 2), any other code a failure while
// running (exit code 1). Thread-safety: values only.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include "zinf/status.h"

namespace zinf::tools {

// Bad input: the flags, a file the user named, a shape that cannot run.
inline Status BadInput(std::string message) { return InvalidArgument(std::move(message)); }

// A failure while running: "what: <cause as Code: message>". The cause's
// code is kept, except that an InvalidArgument cause becomes
// FailedPrecondition (the input was accepted; the run could not go on).
inline Status RunFailed(const Status& cause, std::string_view what) {
  const StatusCode code = cause.code() == StatusCode::kInvalidArgument ? StatusCode::kFailedPrecondition : cause.code();
  return Status(code, std::string(what) + ": " + cause.ToString());
}

// 0 for OK, 2 for bad input, 1 for a failure.
inline int ToolExitCode(const Status& s) { return s.ok() ? 0 : s.code() == StatusCode::kInvalidArgument ? 2 : 1; }

// Prints a non-OK status as "zinf <command>: <message>" on stderr; returns
// its exit code.
inline int ReportToolStatus(const char* command, const Status& s) {
  if (!s.ok()) std::fprintf(stderr, "zinf %s: %s\n", command, s.message().c_str());
  return ToolExitCode(s);
}

}  // namespace zinf::tools
