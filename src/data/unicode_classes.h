// The Unicode facts the tokenizers need: strict UTF-8 decoding, the regex
// classes \s (White_Space), \p{L} (letters) and \p{N} (numbers), and NFC
// normalization. The classes and NFC data are full tables generated from the
// Unicode Character Database by tools/gen_unicode_tables.py (into
// unicode_tables.inc; UnicodeVersion() says which version). Pure functions;
// thread-safe (the lookup table behind CodePointClass is built once, on first
// use, under the C++ static-initialization guarantee).
#pragma once

#include <cstdint>
#include <string>
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
// Appends the UTF-8 form of code point `cp` (0 <= cp <= 0x10FFFF).
void EncodeUtf8(int32_t cp, std::string* out);

bool IsWhiteSpace(int32_t code_point);
bool IsLetter(int32_t code_point);
bool IsNumber(int32_t code_point);

// The three classes as bits, in one lookup (O(1) below U+10000). A code point
// is in at most one of them; -1 (an invalid byte) is in none.
inline constexpr uint8_t kClassLetter = 1, kClassNumber = 2, kClassSpace = 4;
uint8_t CodePointClass(int32_t code_point);

// The Unicode version of the tables, e.g. "14.0.0".
const char* UnicodeVersion();

// True when NFC cannot change `text`: no character in it has a non-zero
// combining class, a canonical decomposition, or can be the second half of a
// composition. A cheap scan; text that passes needs no NfcNormalize.
bool IsNfcQuickSafe(std::string_view text);
// Unicode Normalization Form C (UAX #15: canonical decomposition, canonical
// ordering, canonical composition). Bytes that are not valid UTF-8 are kept
// as they are and block composition across them.
std::string NfcNormalize(std::string_view text);

}  // namespace zinf::data
