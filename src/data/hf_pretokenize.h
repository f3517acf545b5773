// The split regexes of Hugging Face tokenizer.json files that zinf knows, as
// hand-written scanners. Each scanner gives exactly the pieces that the
// regex's leftmost-first matching gives (the `Split` pre-tokenizer with
// behavior "Isolated"; the patterns match every character, so the pieces
// cover the text). Known patterns:
//   kGpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//            (GPT-2; also what a ByteLevel pre-tokenizer with use_regex uses)
//   kLlama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//            (Llama 3; also OpenAI's cl100k)
//   kQwen2   the same with \p{N} for \p{N}{1,3} (Qwen2, Qwen2.5, Qwen3)
// \s is Unicode White_Space, \p{L} and \p{N} the general categories, from the
// tables of unicode_classes.h. A byte that is not valid UTF-8 is a one-byte
// character of none of the classes. (?i:...) folds ASCII case only.
// Pure functions; thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <string_view>
#include <vector>

namespace zinf::data {

enum class SplitPattern { kGpt2, kLlama3, kQwen2 };

// The pattern whose regex text (as written in tokenizer.json, after JSON
// unescaping) is `regex`, or nullopt for any other text.
std::optional<SplitPattern> RecognizeSplitRegex(std::string_view regex);

// Calls `piece` with each piece of `text` under `pattern`, in order (views
// into `text`), as the scan finds them: no memory in proportion to the text.
void SplitByPattern(SplitPattern pattern, std::string_view text, const std::function<void(std::string_view)>& piece);
// The same, appending the pieces to *pieces.
void SplitByPattern(SplitPattern pattern, std::string_view text, std::vector<std::string_view>* pieces);

}  // namespace zinf::data
