// The "zinf" logger. The library never writes to stdout: everything it says
// goes through this named spdlog logger to stderr. The level comes from
// ZINF_LOG_LEVEL (trace, debug, info, warn, error, off; default info) unless
// SetLogLevel is called. Thread-safe.
#pragma once

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

namespace zinf {

spdlog::logger& Log();

// Returns false (and changes nothing) for an unknown level name.
bool SetLogLevel(std::string_view level);

// Logs `message` at warn level the first time this exact text is seen in the
// process; later calls are silent. Returns true if it logged.
bool WarnOnce(const std::string& message);

}  // namespace zinf

#define ZINF_LOG_TRACE(...) ::zinf::Log().trace(__VA_ARGS__)
#define ZINF_LOG_DEBUG(...) ::zinf::Log().debug(__VA_ARGS__)
#define ZINF_LOG_INFO(...) ::zinf::Log().info(__VA_ARGS__)
#define ZINF_LOG_WARN(...) ::zinf::Log().warn(__VA_ARGS__)
#define ZINF_LOG_ERROR(...) ::zinf::Log().error(__VA_ARGS__)
