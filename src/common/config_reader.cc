#include "common/config_reader.h"

#include <cctype>
#include <sstream>

#include "common/json_text.h"

namespace zinf::config_internal {

// "the string \"x\"", "the number 1.5", "true", "an object", ...
std::string Describe(const json& v) {
  const std::string dump = JsonSnippet(v, 48);
  switch (v.type()) {
    case json::value_t::string:
      return "the string " + dump;
    case json::value_t::boolean:
      return dump;
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "the array " + dump;
    default:
      return "the number " + dump;
  }
}

std::string FormatDouble(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace zinf::config_internal
