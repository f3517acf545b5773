#include "data/hf_pretokenize.h"

#include <array>
#include <cstdint>

#include "data/unicode_classes.h"

namespace zinf::data {
namespace {

constexpr std::string_view kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// kOther: none of \p{L}, \p{N}, \s (punctuation, symbols, emoji, marks,
// invalid bytes).
enum Cls : uint8_t { kOther = 0, kLetter = kClassLetter, kNumber = kClassNumber, kSpace = kClassSpace };

struct Char {
  Cls cls;
  int len;
};

const std::array<uint8_t, 128>& AsciiClass() {
  static const std::array<uint8_t, 128> table = [] {
    std::array<uint8_t, 128> t{};
    for (int c = 0; c < 128; ++c) t[c] = CodePointClass(c);
    return t;
  }();
  return table;
}

inline Char At(std::string_view text, size_t pos) {
  const auto b = static_cast<uint8_t>(text[pos]);
  if (b < 0x80) return {static_cast<Cls>(AsciiClass()[b]), 1};
  const Utf8Char c = DecodeUtf8(text, pos);
  return {static_cast<Cls>(CodePointClass(c.code_point)), c.length};
}

// End of the run of `cls` characters starting at pos.
inline size_t RunEnd(std::string_view text, size_t pos, Cls cls) {
  while (pos < text.size()) {
    const Char c = At(text, pos);
    if (c.cls != cls) break;
    pos += c.len;
  }
  return pos;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at text[pos] == '\'',
// or 0. The alternatives are tried in the regex's order.
inline size_t ContractionLength(std::string_view text, size_t pos, bool fold_case) {
  static constexpr std::string_view kSuffixes[] = {"s", "t", "re", "ve", "m", "ll", "d"};
  for (std::string_view s : kSuffixes) {
    if (pos + 1 + s.size() > text.size()) continue;
    bool match = true;
    for (size_t k = 0; k < s.size() && match; ++k) {
      char c = text[pos + 1 + k];
      if (fold_case && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      match = c == s[k];
    }
    if (match) return 1 + s.size();
  }
  return 0;
}

// The whitespace alternatives shared by the patterns, at a whitespace
// character: \s+(?!\S) then \s+. A run followed by a non-space keeps its
// last character for the next piece.
inline size_t WhiteSpaceEnd(std::string_view text, size_t i) {
  size_t j = i, last = i;
  while (j < text.size()) {
    const Char w = At(text, j);
    if (w.cls != kSpace) break;
    last = j;
    j += w.len;
  }
  return (j < text.size() && last > i) ? last : j;
}

template <class Piece>
void SplitGpt2(std::string_view text, Piece& piece) {
  const size_t n = text.size();
  size_t i = 0;
  auto emit = [&](size_t end) {
    piece(text.substr(i, end - i));
    i = end;
  };
  while (i < n) {
    if (text[i] == '\'') {
      if (size_t len = ContractionLength(text, i, /*fold_case=*/false)) {
        emit(i + len);
        continue;
      }
    }
    const Char c = At(text, i);
    if (c.cls != kSpace) {  // \p{L}+ | \p{N}+ | [^\s\p{L}\p{N}]+
      emit(RunEnd(text, i, c.cls));
      continue;
    }
    if (text[i] == ' ' && i + 1 < n) {  // " ?X+" with the optional space present
      const Char next = At(text, i + 1);
      if (next.cls != kSpace) {
        emit(RunEnd(text, i + 1, next.cls));
        continue;
      }
    }
    emit(WhiteSpaceEnd(text, i));
  }
}

// kLlama3 (max_digits 3) and kQwen2 (max_digits 1).
template <class Piece>
void SplitLlama3(std::string_view text, size_t max_digits, Piece& piece) {
  const size_t n = text.size();
  size_t i = 0;
  auto emit = [&](size_t end) {
    piece(text.substr(i, end - i));
    i = end;
  };
  auto is_newline = [&](size_t pos) { return text[pos] == '\r' || text[pos] == '\n'; };
  while (i < n) {
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (text[i] == '\'') {
      if (size_t len = ContractionLength(text, i, /*fold_case=*/true)) {
        emit(i + len);
        continue;
      }
    }
    const Char c = At(text, i);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c.cls == kLetter) {
      emit(RunEnd(text, i, kLetter));
      continue;
    }
    if (c.cls != kNumber && !is_newline(i) && i + c.len < n && At(text, i + c.len).cls == kLetter) {
      emit(RunEnd(text, i + c.len, kLetter));
      continue;
    }
    // \p{N}{1,max_digits}
    if (c.cls == kNumber) {
      size_t j = i;
      for (size_t k = 0; k < max_digits && j < n; ++k) {
        const Char d = At(text, j);
        if (d.cls != kNumber) break;
        j += d.len;
      }
      emit(j);
      continue;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    {
      size_t j = i;
      if (text[j] == ' ' && j + 1 < n && At(text, j + 1).cls == kOther) ++j;
      if (At(text, j).cls == kOther) {
        j = RunEnd(text, j, kOther);
        while (j < n && is_newline(j)) ++j;
        emit(j);
        continue;
      }
    }
    // Here c is whitespace. \s*[\r\n]+ : up to and including the run's last
    // newline, if it has one.
    size_t j = i, last_newline = n;
    while (j < n) {
      const Char w = At(text, j);
      if (w.cls != kSpace) break;
      if (is_newline(j)) last_newline = j;
      j += w.len;
    }
    if (last_newline != n) {
      emit(last_newline + 1);
      continue;
    }
    // \s+(?!\S) | \s+
    emit(WhiteSpaceEnd(text, i));
  }
}

}  // namespace

std::optional<SplitPattern> RecognizeSplitRegex(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  if (regex == kLlama3Regex) return SplitPattern::kLlama3;
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  return std::nullopt;
}

namespace {

template <class Piece>
void Split(SplitPattern pattern, std::string_view text, Piece& piece) {
  switch (pattern) {
    case SplitPattern::kGpt2:
      SplitGpt2(text, piece);
      return;
    case SplitPattern::kLlama3:
      SplitLlama3(text, 3, piece);
      return;
    case SplitPattern::kQwen2:
      SplitLlama3(text, 1, piece);
      return;
  }
}

}  // namespace

void SplitByPattern(SplitPattern pattern, std::string_view text, const std::function<void(std::string_view)>& piece) {
  Split(pattern, text, piece);
}

void SplitByPattern(SplitPattern pattern, std::string_view text, std::vector<std::string_view>* pieces) {
  auto append = [pieces](std::string_view p) { pieces->push_back(p); };
  Split(pattern, text, append);
}

}  // namespace zinf::data
