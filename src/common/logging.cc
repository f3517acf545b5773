// The named stderr logger and warn-once bookkeeping.
#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>
#include <unordered_set>

namespace zinf {
namespace {

std::shared_ptr<spdlog::logger> MakeLogger() {
  auto existing = spdlog::get("zinf");
  if (existing) return existing;
  auto logger = spdlog::stderr_color_mt("zinf");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [zinf] [%^%l%$] %v");
  logger->set_level(spdlog::level::info);
  if (const char* env = std::getenv("ZINF_LOG_LEVEL")) {
    auto level = spdlog::level::from_str(env);
    // from_str answers "off" for anything unknown; only honour "off" when asked for.
    if (level != spdlog::level::off || std::string_view(env) == "off") logger->set_level(level);
  }
  return logger;
}

}  // namespace

spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = MakeLogger();
  return *logger;
}

bool SetLogLevel(std::string_view level) {
  std::string name(level);
  auto parsed = spdlog::level::from_str(name);
  if (parsed == spdlog::level::off && name != "off") return false;
  Log().set_level(parsed);
  return true;
}

bool WarnOnce(const std::string& message) {
  static std::mutex mu;
  static std::unordered_set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.insert(message).second) return false;
  }
  Log().warn("{}", message);
  return true;
}

}  // namespace zinf
