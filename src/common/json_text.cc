// ParseJsonText: a depth check over the raw text, then nlohmann's SAX parser
// (iterative) driving a DOM builder that knows the key path, so an error can
// say which key it was reading. nlohmann's own DOM parser throws on a number
// that overflows a double even when told not to throw for syntax errors;
// through SAX every error arrives as a call instead.
#include "common/json_text.h"

#include <algorithm>
#include <new>
#include <utility>

namespace zinf {
namespace {

using json = nlohmann::json;

// Drops nlohmann's "[json.exception.parse_error.101] parse error at line 1,
// column 10: " prefix: the caller says where.
std::string WhatWithoutPrefix(const std::string& what) {
  size_t col = what.find("column ");
  size_t colon = col == std::string::npos ? std::string::npos : what.find(": ", col);
  if (colon != std::string::npos) return what.substr(colon + 2);
  if (what.rfind("[json.exception.", 0) == 0) {
    size_t close = what.find("] ");
    if (close != std::string::npos) return what.substr(close + 2);
  }
  return what;
}

// Bytes [0, n) of `s` without a trailing partial UTF-8 sequence.
size_t Utf8SafeCut(std::string_view s, size_t n) {
  if (n >= s.size()) return s.size();
  size_t cut = n;
  // Back off over continuation bytes to the start of the character at `cut`.
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80 && n - cut < 4) --cut;
  return cut;
}

class DomBuilder {
 public:
  DomBuilder(json& root, int max_depth) : root_(root), max_depth_(max_depth) {}

  bool null() { return Place(json(nullptr)); }
  bool boolean(bool v) { return Place(json(v)); }
  bool number_integer(json::number_integer_t v) { return Place(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return Place(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t& /*text*/) { return Place(json(v)); }
  bool string(json::string_t& v) { return Place(json(std::move(v))); }
  bool binary(json::binary_t& v) { return Place(json::binary(std::move(v))); }
  bool start_object(std::size_t /*elements*/) { return Open(json::object()); }
  bool start_array(std::size_t /*elements*/) { return Open(json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(json::string_t& k) {
    Frame& f = stack_.back();
    auto& object = f.value->get_ref<json::object_t&>();
    auto [it, inserted] = object.emplace(k, nullptr);
    if (!inserted) {
      if (duplicates_.size() < kMaxDuplicateKeysListed) duplicates_.push_back({PathWith(k), k});
      it->second = nullptr;  // the later value replaces it
    }
    f.slot = &it->second;
    f.key = std::move(k);
    return true;
  }

  bool parse_error(std::size_t position, const std::string& /*last_token*/, const nlohmann::detail::exception& ex) {
    error_position_ = position;
    error_ = WhatWithoutPrefix(ex.what());
    error_path_ = CurrentPath();
    return false;
  }

  const std::string& error() const { return error_; }
  size_t error_position() const { return error_position_; }
  const std::string& error_path() const { return error_path_; }
  bool too_deep() const { return too_deep_; }
  std::vector<DuplicateKey> TakeDuplicates() { return std::move(duplicates_); }

 private:
  struct Frame {
    json* value = nullptr;
    json* slot = nullptr;  // objects: where the value of `key` goes
    std::string key;
    size_t next_index = 0;  // arrays
  };

  bool Place(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      placed_ = &root_;
      return true;
    }
    Frame& f = stack_.back();
    if (f.value->is_array()) {
      auto& array = f.value->get_ref<json::array_t&>();
      array.push_back(std::move(v));
      ++f.next_index;
      placed_ = &array.back();
    } else {
      *f.slot = std::move(v);
      placed_ = f.slot;
    }
    return true;
  }
  bool Open(json&& container) {
    if (static_cast<int>(stack_.size()) >= max_depth_) {
      too_deep_ = true;
      error_path_ = CurrentPath();
      return false;
    }
    Place(std::move(container));
    // A child is complete before its parent gets another element, so the
    // pointer stays valid while the child is open.
    Frame f;
    f.value = placed_;
    stack_.push_back(std::move(f));
    return true;
  }
  bool Close() {
    stack_.pop_back();
    return true;
  }

  // The path of the value being read: keys and [indices] of the open frames.
  // An open frame below the top holds its child as its last element; the
  // top frame is reading its next one.
  std::string CurrentPath() const {
    std::string path;
    for (size_t i = 0; i < stack_.size(); ++i) AppendSegment(stack_[i], i + 1 == stack_.size(), &path);
    return path;
  }
  std::string PathWith(const std::string& key) const {
    std::string path;
    for (size_t i = 0; i + 1 < stack_.size(); ++i) AppendSegment(stack_[i], false, &path);
    if (!path.empty()) path += '.';
    return path + key;
  }
  static void AppendSegment(const Frame& f, bool top, std::string* path) {
    if (f.value->is_array()) {
      *path += "[" + std::to_string(top ? f.next_index : f.next_index - 1) + "]";
    } else if (f.slot != nullptr) {
      if (!path->empty()) *path += '.';
      *path += f.key;
    }
  }

  json& root_;
  const int max_depth_;
  std::vector<Frame> stack_;
  json* placed_ = nullptr;
  std::vector<DuplicateKey> duplicates_;
  std::string error_, error_path_;
  size_t error_position_ = 0;
  bool too_deep_ = false;
};

std::string QuotedPath(const std::string& path) {
  std::string p = path.size() > 200 ? path.substr(0, Utf8SafeCut(path, 197)) + "..." : path;
  return p.empty() ? std::string() : " (at " + p + ")";
}

void AppendSnippet(const json& v, size_t limit, std::string* out) {
  if (out->size() > limit) return;
  switch (v.type()) {
    case json::value_t::object: {
      *out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end() && out->size() <= limit; ++it) {
        if (!first) *out += ',';
        first = false;
        AppendSnippet(json(it.key().substr(0, Utf8SafeCut(it.key(), limit + 1))), limit, out);
        *out += ':';
        AppendSnippet(it.value(), limit, out);
      }
      *out += '}';
      return;
    }
    case json::value_t::array: {
      *out += '[';
      bool first = true;
      for (auto it = v.begin(); it != v.end() && out->size() <= limit; ++it) {
        if (!first) *out += ',';
        first = false;
        AppendSnippet(*it, limit, out);
      }
      *out += ']';
      return;
    }
    case json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      const json head = s.size() > limit ? json(s.substr(0, Utf8SafeCut(s, limit + 1))) : json();
      *out += (head.is_null() ? v : head).dump(-1, ' ', false, json::error_handler_t::replace);
      return;
    }
    default:
      *out += v.dump(-1, ' ', false, json::error_handler_t::replace);
      return;
  }
}

}  // namespace

JsonNesting MeasureJsonNesting(std::string_view text, int limit) {
  JsonNesting n;
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
      if (depth > n.depth) n.depth = depth;
      if (depth > limit && n.first_too_deep == std::string_view::npos) n.first_too_deep = i;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return n;
}

std::string JsonLineColumn(std::string_view text, size_t offset) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return std::to_string(line) + ":" + std::to_string(column);
}

Result<ParsedJson> ParseJsonText(std::string_view text, const std::string& source, int max_depth) {
  const JsonNesting nesting = MeasureJsonNesting(text, max_depth);
  if (nesting.first_too_deep != std::string_view::npos) {
    return InvalidArgument(source + ":" + JsonLineColumn(text, nesting.first_too_deep) + ": JSON nests deeper than " +
                           std::to_string(max_depth) + " levels");
  }
  ParsedJson out;
  DomBuilder builder(out.value, max_depth);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &builder, json::input_format_t::json, /*strict=*/true,
                         /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    return InvalidArgument(source + ": malformed JSON: " + WhatWithoutPrefix(e.what()));
  } catch (const std::bad_alloc&) {
    return OutOfMemory(source + ": not enough memory for a JSON text of " + std::to_string(text.size()) + " bytes");
  }
  if (builder.too_deep()) {
    return InvalidArgument(source + ": JSON nests deeper than " + std::to_string(max_depth) + " levels" +
                           QuotedPath(builder.error_path()));
  }
  if (!ok) {
    // nlohmann's position is one past the byte where parsing stopped.
    const size_t at = builder.error_position() > 0 ? builder.error_position() - 1 : 0;
    return InvalidArgument(source + ":" + JsonLineColumn(text, at) + ": malformed JSON: " + builder.error() +
                           QuotedPath(builder.error_path()));
  }
  out.duplicate_keys = builder.TakeDuplicates();
  return out;
}

std::string JsonSnippet(const nlohmann::json& v, size_t max_chars) {
  max_chars = std::max<size_t>(max_chars, 4);
  std::string out;
  AppendSnippet(v, max_chars, &out);
  if (out.size() <= max_chars) return out;
  return out.substr(0, Utf8SafeCut(out, max_chars - 3)) + "...";
}

}  // namespace zinf
