// Untrusted JSON text into a DOM, for every reader of a user's file
// (DeepSpeed configs, tokenizer.json, Hugging Face config.json and shard
// indexes, chat JSONL, checkpoint manifests and rank tables). It does what
// nlohmann::json::parse leaves to its caller:
//   - nesting is bounded before anything deep is built, so nothing that walks
//     the DOM recursively (dump(), copies, the readers' own recursion) can
//     run out of stack;
//   - no exception escapes: a number too large for a double, invalid UTF-8 or
//     a syntax error is a kInvalidArgument naming the source, the line and
//     column, and the key being read;
//   - keys given twice in one object are listed with their path (the later
//     value is kept, as Python's json and nlohmann do).
// JsonSnippet renders a value for an error message in bounded time and
// space, whatever its size.
// Thread-safe (pure functions).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf {

// Deeper than any file zinf reads (a DeepSpeed config nests 4 levels, a
// tokenizer.json 6), shallow enough for any recursion over the DOM.
inline constexpr int kMaxJsonDepth = 64;
// Duplicate keys listed at most (a file of a million repeats is one message).
inline constexpr size_t kMaxDuplicateKeysListed = 16;

struct DuplicateKey {
  std::string path;  // where it appears a second time: "zero_optimization.stage", "a[2].b"
  std::string key;   // the key itself: "stage", "b"
};

struct ParsedJson {
  nlohmann::json value;
  // Keys given a second time in one object, in order (at most
  // kMaxDuplicateKeysListed of them).
  std::vector<DuplicateKey> duplicate_keys;
};

// Parses `text` (a whole JSON document; whitespace around it is allowed).
// Errors, all kInvalidArgument:
//   SOURCE:LINE:COLUMN: malformed JSON: WHAT (at KEY)
//   SOURCE:LINE:COLUMN: JSON nests deeper than MAX levels
// LINE and COLUMN are 1-based, COLUMN counts bytes; "(at KEY)" is left out at
// the top level.
Result<ParsedJson> ParseJsonText(std::string_view text, const std::string& source, int max_depth = kMaxJsonDepth);

// The deepest nesting of objects and arrays in `text` (strings skipped), and
// the byte offset of the first bracket that reaches `limit` + 1 levels
// (npos when none does). Linear; no DOM.
struct JsonNesting {
  int depth = 0;
  size_t first_too_deep = std::string_view::npos;
};
JsonNesting MeasureJsonNesting(std::string_view text, int limit);

// "LINE:COLUMN" (1-based) of byte `offset` of `text`.
std::string JsonLineColumn(std::string_view text, size_t offset);

// `v` as compact JSON, cut to at most `max_chars` bytes (ending in "..." when
// cut, never inside a UTF-8 sequence). Never throws: invalid UTF-8 in a
// string is written as U+FFFD. Time and memory are O(max_chars) beyond the
// values it skips, whatever the size or depth of `v`.
std::string JsonSnippet(const nlohmann::json& v, size_t max_chars = 48);

}  // namespace zinf
