// The few Unicode facts GPT-2's pre-tokenizer needs: strict UTF-8 decoding
// and the classes \s (White_Space), \p{L} (letters) and \p{N} (numbers).
// White_Space is exact; letters and numbers come from a compact range table
// (see tokenizer.h for what it covers). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

namespace zinf::data {

struct Utf8Char {
  int32_t code_point = -1;  // -1: the byte at the position is not valid UTF-8
  int length = 1;           // bytes consumed: 1 for an invalid byte
};

// Decodes the character starting at text[pos] (pos < text.size()). Overlong
// forms, surrogates, code points above U+10FFFF and truncated sequences are
// invalid: one byte is consumed and code_point is -1.
Utf8Char DecodeUtf8(std::string_view text, size_t pos);

bool IsWhiteSpace(int32_t code_point);
bool IsLetter(int32_t code_point);
bool IsNumber(int32_t code_point);

}  // namespace zinf::data
