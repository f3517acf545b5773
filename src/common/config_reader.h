// The schema walker of config loading (config.cc): ObjectReader reads one
// JSON object key by key, each with its type and range, folds aliases to
// one canonical name, records "auto" where allowed, and reports what is left
// over as unknown keys with a "did you mean" suggestion. Problems collect in
// Diagnostics, so a file's errors are reported together.
// Internal to src/common. Thread-safety: one reader per thread.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/units.h"

namespace zinf::config_internal {

using json = nlohmann::json;
inline constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// "the string \"x\"", "the number 1.5", "true", "an object", ...
std::string Describe(const json& v);
std::string FormatDouble(double v);
// Case-insensitive Levenshtein distance.
size_t EditDistance(std::string_view a, std::string_view b);

// A file of a million bad keys is reported by its first problems and a count.
inline constexpr size_t kMaxErrorsKept = 20;

struct Diagnostics {
  std::vector<std::string> errors;  // at most kMaxErrorsKept
  size_t errors_not_kept = 0;
  std::vector<std::string> warnings;
  std::vector<std::string> auto_keys;

  bool Full() const { return errors.size() >= kMaxErrorsKept; }
  void AddError(std::string e) {
    if (Full()) {
      ++errors_not_kept;
    } else {
      errors.push_back(std::move(e));
    }
  }
};

// A key as zinf names it, plus the other spellings DeepSpeed accepts.
struct Key {
  Key(const char* n) : name(n) {}  // NOLINT
  Key(const char* n, std::initializer_list<const char*> a) : name(n), aliases(a) {}
  const char* name;
  std::vector<const char*> aliases;
};

class ObjectReader {
 public:
  ObjectReader(const json& obj, std::string path, Diagnostics& diag) : obj_(obj), path_(std::move(path)), d_(diag) {}

  const std::string& path() const { return path_; }
  std::string PathOf(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  void Error(std::string_view key, const std::string& what) { d_.AddError(PathOf(key) + ": " + what); }

  // Finds the key under its name or one alias; marks them consumed.
  const json* Take(const Key& key) {
    const json* found = nullptr;
    const char* found_name = nullptr;
    for (size_t i = 0; i <= key.aliases.size(); ++i) {
      const char* name = i == 0 ? key.name : key.aliases[i - 1];
      known_.push_back(name);
      consumed_.insert(name);
      auto it = obj_.find(name);
      if (it == obj_.end()) continue;
      if (found) {
        Error(name, std::string("same setting as \"") + found_name + "\", which is also given; keep one");
        continue;
      }
      found = &*it;
      found_name = name;
      if (i > 0 && std::string_view(name).find("fp16_weights") != std::string_view::npos)
        d_.warnings.push_back(PathOf(name) + " is deprecated; read as " + PathOf(key.name));
    }
    return found;
  }

  bool IsAuto(const json& v) const { return v.is_string() && v.get<std::string>() == "auto"; }

  // Handles "auto": records it if allowed (returns true: caller keeps default),
  // or reports it. Returns false when the value is not "auto".
  bool HandleAuto(const Key& key, const json& v, bool allow_auto, const std::string& accepted) {
    if (!IsAuto(v)) return false;
    if (allow_auto) {
      d_.auto_keys.push_back(PathOf(key.name));
    } else {
      Error(key.name, "\"auto\" is not accepted here; expected " + accepted);
    }
    return true;
  }

  void Int(const Key& key, int64_t* out, int64_t min, int64_t max, bool allow_auto = false) {
    std::optional<int64_t> v;
    if (ReadInt(key, &v, min, max, allow_auto) && v) *out = *v;
  }
  void OptInt(const Key& key, std::optional<int64_t>* out, int64_t min, int64_t max, bool allow_auto = false) {
    ReadInt(key, out, min, max, allow_auto);
  }

  void Double(const Key& key, double* out, double min, double max, bool allow_auto = false, bool min_exclusive = false,
              bool max_exclusive = false) {
    const json* v = Take(key);
    if (!v) return;
    std::string accepted = "a number in " + std::string(min_exclusive ? "(" : "[") + FormatDouble(min) + ", " +
                           (max == kInf ? std::string("inf") : FormatDouble(max)) + (max_exclusive ? ")" : "]");
    if (HandleAuto(key, *v, allow_auto, accepted)) return;
    if (!v->is_number()) return Error(key.name, "expected " + accepted + ", found " + Describe(*v));
    double x = v->get<double>();
    if (x < min || x > max || (min_exclusive && x == min) || (max_exclusive && x == max))
      return Error(key.name, FormatDouble(x) + " is out of range; accepted: " + accepted);
    *out = x;
  }

  void Bool(const Key& key, bool* out, bool allow_auto = false) {
    const json* v = Take(key);
    if (!v) return;
    if (HandleAuto(key, *v, allow_auto, "true or false")) return;
    if (!v->is_boolean()) return Error(key.name, "expected true or false, found " + Describe(*v));
    *out = v->get<bool>();
  }

  // A bool that may also be null (DeepSpeed's Optional[bool]); null leaves *set false.
  void OptBool(const Key& key, bool* out, bool* set) {
    const json* v = Take(key);
    *set = false;
    if (!v || v->is_null()) return;
    if (!v->is_boolean()) return Error(key.name, "expected true, false or null, found " + Describe(*v));
    *out = v->get<bool>();
    *set = true;
  }

  template <typename E>
  void Enum(const Key& key, E* out, std::initializer_list<std::pair<const char*, E>> values, bool ignore_case = false) {
    const json* v = Take(key);
    if (!v) return;
    std::string accepted;
    for (const auto& [name, value] : values) accepted += (accepted.empty() ? "\"" : ", \"") + std::string(name) + "\"";
    if (v->is_string()) {
      std::string s = v->get<std::string>();
      for (const auto& [name, value] : values) {
        if (s == name || (ignore_case && s.size() == std::string_view(name).size() && EditDistance(s, name) == 0)) {
          *out = value;
          return;
        }
      }
    }
    Error(key.name, "expected one of " + accepted + ", found " + Describe(*v));
  }

  void String(const Key& key, std::string* out) {
    const json* v = Take(key);
    if (!v) return;
    if (!v->is_string()) return Error(key.name, "expected a string, found " + Describe(*v));
    *out = v->get<std::string>();
  }

  // A byte size: a whole number, or a string such as "4G" (see ParseSize).
  void Size(const Key& key, uint64_t* out) {
    const json* v = Take(key);
    if (!v) return;
    const std::string accepted = "a byte count such as 4294967296 or \"4G\"";
    if (v->is_string()) {
      auto parsed = ParseSize(v->get<std::string>());
      if (!parsed.ok()) return Error(key.name, parsed.status().message());
      *out = *parsed;
    } else if (v->is_number_unsigned() || (v->is_number_integer() && v->get<int64_t>() >= 0)) {
      *out = v->get<uint64_t>();
    } else {
      Error(key.name, "expected " + accepted + ", found " + Describe(*v));
    }
  }

  // One directory or a list of them; null means unset.
  void PathList(const Key& key, std::vector<std::string>* out) {
    const json* v = Take(key);
    if (!v || v->is_null()) return;
    const std::string accepted = "a directory path or a non-empty list of them";
    std::vector<std::string> paths;
    if (v->is_string()) {
      paths.push_back(v->get<std::string>());
    } else if (v->is_array() && !v->empty()) {
      for (const auto& e : *v) {
        if (!e.is_string()) return Error(key.name, "expected " + accepted + ", found " + Describe(*v));
        paths.push_back(e.get<std::string>());
      }
    } else {
      return Error(key.name, "expected " + accepted + ", found " + Describe(*v));
    }
    for (const auto& p : paths)
      if (p.empty()) return Error(key.name, "an empty path; expected " + accepted);
    *out = std::move(paths);
  }

  // Reads a nested object; null is treated as absent (DeepSpeed's Optional[...] = None).
  void Object(const Key& key, const std::function<void(ObjectReader&)>& fn) {
    const json* v = Take(key);
    if (!v || v->is_null()) return;
    if (!v->is_object()) return Error(key.name, "expected an object, found " + Describe(*v));
    ObjectReader child(*v, PathOf(key.name), d_);
    fn(child);
    child.Finish();
  }

  // A DeepSpeed key zinf does not implement and whose value cannot change
  // results: warned about once, then ignored.
  void Ignored(const char* key, const char* why) {
    const json* v = Take(key);
    if (!v) return;
    // Switched off: nothing is being ignored, so nothing to say.
    bool off = v->is_null() || (v->is_boolean() && !v->get<bool>()) ||
               (v->is_object() && (v->empty() || (v->contains("enabled") && (*v)["enabled"] == false)));
    if (!off)
      d_.warnings.push_back(PathOf(key) + " is a DeepSpeed setting zinf does not implement (" + why + "); ignored");
  }

  // A DeepSpeed key zinf does not implement and whose non-default values
  // would change results: accepted only with its no-op value.
  void RejectUnless(const char* key, const std::function<bool(const json&)>& harmless, const char* noop,
                    const char* what) {
    const json* v = Take(key);
    if (v && !harmless(*v))
      Error(key, std::string("zinf does not implement ") + what +
                     ", and ignoring it would change the result; remove it or set " + noop);
  }

  // Everything not consumed is unknown.
  void Finish() {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (consumed_.count(it.key())) continue;
      if (d_.Full()) {
        ++d_.errors_not_kept;
        continue;
      }
      std::string best;
      size_t best_distance = std::numeric_limits<size_t>::max();
      const size_t limit = std::max<size_t>(2, it.key().size() / 3);
      for (const auto& k : known_) {
        // The distance is at least the difference in length: a key far longer
        // than every known one costs nothing here.
        const size_t length_gap = it.key().size() > k.size() ? it.key().size() - k.size() : k.size() - it.key().size();
        if (length_gap > limit) continue;
        size_t dist = EditDistance(it.key(), k);
        if (dist < best_distance) best_distance = dist, best = k;
      }
      std::string msg = "unknown key";
      if (!best.empty() && best_distance <= limit) {
        msg += "; did you mean \"" + best + "\"?";
      } else {
        std::vector<std::string> sorted(known_.begin(), known_.end());
        std::sort(sorted.begin(), sorted.end());
        sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
        msg += "; accepted keys here: ";
        for (size_t i = 0; i < sorted.size(); ++i) msg += (i ? ", " : "") + sorted[i];
      }
      Error(it.key(), msg);
    }
  }

 private:
  bool ReadInt(const Key& key, std::optional<int64_t>* out, int64_t min, int64_t max, bool allow_auto) {
    const json* v = Take(key);
    if (!v) return false;
    std::string accepted = "an integer " + (max == kMaxInt ? ">= " + std::to_string(min)
                                                           : std::to_string(min) + ".." + std::to_string(max));
    if (HandleAuto(key, *v, allow_auto, accepted)) {
      *out = std::nullopt;
      return false;
    }
    int64_t x = 0;
    if (v->is_number_integer() || v->is_number_unsigned()) {
      if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(kMaxInt)) {
        Error(key.name, v->dump() + " is out of range; accepted: " + accepted);
        return false;
      }
      x = v->get<int64_t>();
    } else if (v->is_number_float()) {
      // DeepSpeed configs write sizes as 5e8; accept a float with an integral value.
      double f = v->get<double>();
      if (f != std::floor(f) || std::fabs(f) >= 9.2e18) {
        Error(key.name, "expected " + accepted + ", found " + Describe(*v));
        return false;
      }
      x = static_cast<int64_t>(f);
    } else {
      Error(key.name, "expected " + accepted + ", found " + Describe(*v));
      return false;
    }
    if (x < min || x > max) {
      Error(key.name, std::to_string(x) + " is out of range; accepted: " + accepted);
      return false;
    }
    *out = x;
    return true;
  }

  const json& obj_;
  std::string path_;
  Diagnostics& d_;
  std::set<std::string> consumed_;
  std::vector<std::string> known_;
};

}  // namespace zinf::config_internal
