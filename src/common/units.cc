// ParseSize / FormatBytes. Parsing goes through a long double so "1e9" and
// "1.5G" are exact, then insists the result is a whole number that fits.
#include "common/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace zinf {
namespace {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace

namespace {

enum class UnitBase { kBytes, kCount };

Result<uint64_t> ParseWithUnits(std::string_view text, UnitBase base) {
  const bool bytes_mode = base == UnitBase::kBytes;
  auto bad = [&](std::string_view why) {
    return InvalidArgument(
        std::string(bytes_mode ? "invalid size '" : "invalid count '") + std::string(text) + "': " + std::string(why) +
        (bytes_mode ? " (examples: 4096, 512K, 4G, 1.5GiB, 1e9)" : " (examples: 1000, 350K, 124M, 1.5B, 7e9)"));
  };
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) return bad("empty");
  if (s.front() == '-') return bad("negative");
  if (!std::isdigit(static_cast<unsigned char>(s.front())) && s.front() != '.')
    return bad("does not start with a number");

  // Split number and suffix: the number may contain digits, '.', and an exponent.
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E') && i + 1 < s.size() &&
      (std::isdigit(static_cast<unsigned char>(s[i + 1])) || s[i + 1] == '+')) {
    ++i;
    if (s[i] == '+') ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  }
  std::string number(s.substr(0, i));
  std::string_view suffix = s.substr(i);
  while (!suffix.empty() && std::isspace(static_cast<unsigned char>(suffix.front()))) suffix.remove_prefix(1);

  char* end = nullptr;
  long double value = std::strtold(number.c_str(), &end);
  if (end != number.c_str() + number.size() || number == ".") return bad("not a number");

  long double multiplier = 1;
  if (!suffix.empty() && !bytes_mode) {
    static constexpr std::string_view kCountUnits = "KMGT";
    char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(suffix.front())));
    size_t power = kCountUnits.find(unit);
    if (unit == 'B') power = 2;  // "1.5B" parameters
    if (suffix.size() != 1 || power == std::string_view::npos)
      return bad("unknown unit '" + std::string(suffix) + "' (use K, M, G or B, T; decimal)");
    multiplier = std::pow(1000.0L, static_cast<long double>(power + 1));
  } else if (!suffix.empty()) {
    static constexpr std::string_view kUnits = "KMGTP";
    char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(suffix.front())));
    size_t power = kUnits.find(unit);
    std::string_view rest = suffix.substr(1);
    if (EqualsIgnoreCase(suffix, "B")) {
      multiplier = 1;
    } else if (power != std::string_view::npos &&
               (rest.empty() || EqualsIgnoreCase(rest, "B") || EqualsIgnoreCase(rest, "iB"))) {
      multiplier = std::pow(1024.0L, static_cast<long double>(power + 1));
    } else {
      return bad("unknown unit '" + std::string(suffix) + "' (use K, M, G, T, P, optionally followed by B or iB)");
    }
  }
  long double bytes = value * multiplier;
  if (!std::isfinite(bytes) || bytes >= 18446744073709551616.0L) return bad("too large");
  if (bytes != std::floor(bytes)) return bad(bytes_mode ? "not a whole number of bytes" : "not a whole number");
  return static_cast<uint64_t>(bytes);
}

}  // namespace

Result<uint64_t> ParseSize(std::string_view text) { return ParseWithUnits(text, UnitBase::kBytes); }
Result<uint64_t> ParseCount(std::string_view text) { return ParseWithUnits(text, UnitBase::kCount); }

Result<int64_t> ParseParamCount(std::string_view text) {
  ZINF_ASSIGN_OR_RETURN(uint64_t n, ParseCount(text));
  if (n < 1) return InvalidArgument("invalid count '" + std::string(text) + "': must be at least 1");
  if (n > static_cast<uint64_t>(kMaxParamCount)) {
    return InvalidArgument("invalid count '" + std::string(text) + "': " + FormatCount(static_cast<double>(n)) +
                           " parameters is more than zinf counts (at most " + std::to_string(kMaxParamCount) + ")");
  }
  return static_cast<int64_t>(n);
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[u]);
  return buf;
}

std::string FormatCount(double count) {
  static constexpr const char* kUnits[] = {"", " K", " M", " G", " T", " P"};
  int u = 0;
  while (std::fabs(count) >= 1000.0 && u < 5) {
    count /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f%s" : "%.2f%s", count, kUnits[u]);
  return buf;
}

}  // namespace zinf
