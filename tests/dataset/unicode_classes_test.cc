// The Unicode tables and NFC of src/data/unicode_classes.h, checked against
// values from Python's unicodedata (the tables' source) written out here.
#include "data/unicode_classes.h"

#include <gtest/gtest.h>

#include <string>

namespace zinf::data {
namespace {

TEST(UnicodeClassesTest, LettersAndNumbersCoverEveryScript) {
  // Scripts the old hand-made table left out.
  EXPECT_TRUE(IsLetter(0x1200));   // Ethiopic HA
  EXPECT_TRUE(IsLetter(0x0B85));   // Tamil A
  EXPECT_TRUE(IsLetter(0x1820));   // Mongolian A
  EXPECT_TRUE(IsLetter(0x20000));  // CJK extension B
  EXPECT_TRUE(IsNumber(0x0BE6));   // Tamil digit zero
  EXPECT_TRUE(IsNumber(0x1D7CE));  // mathematical bold digit zero
  EXPECT_TRUE(IsNumber(0x00BD));   // vulgar fraction one half (No)
  // Not letters: combining marks, emoji, the skin-tone modifiers, ZWJ.
  EXPECT_FALSE(IsLetter(0x0301));
  EXPECT_FALSE(IsLetter(0x0947));  // Devanagari vowel sign E (Mc)
  EXPECT_FALSE(IsLetter(0x1F600));
  EXPECT_EQ(CodePointClass(0x1F3FD), 0);
  EXPECT_EQ(CodePointClass(0x200D), 0);
  EXPECT_EQ(CodePointClass(-1), 0);
  EXPECT_EQ(CodePointClass('a'), kClassLetter);
  EXPECT_EQ(CodePointClass('7'), kClassNumber);
  EXPECT_EQ(CodePointClass('\t'), kClassSpace);
  EXPECT_STRNE(UnicodeVersion(), "");
}

TEST(UnicodeClassesTest, WhiteSpaceIsTheUnicodeProperty) {
  for (int32_t cp : {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029, 0x202F,
                     0x205F, 0x3000}) {
    EXPECT_TRUE(IsWhiteSpace(cp)) << std::hex << cp;
  }
  for (int32_t cp : {0x1C, 0x200B, 0x200D, 0xFEFF, 0x180E, 0x61}) EXPECT_FALSE(IsWhiteSpace(cp)) << std::hex << cp;
}

TEST(UnicodeClassesTest, EncodeUtf8InvertsDecode) {
  for (int32_t cp : {0x24, 0xA2, 0x939, 0x20AC, 0xD55C, 0x10348, 0x10FFFF}) {
    std::string s;
    EncodeUtf8(cp, &s);
    const Utf8Char c = DecodeUtf8(s, 0);
    EXPECT_EQ(c.code_point, cp);
    EXPECT_EQ(c.length, static_cast<int>(s.size()));
  }
}

TEST(NfcTest, ComposesReordersAndKeepsExclusions) {
  struct Case {
    std::string in, want;
  };
  const Case cases[] = {
      {"e\xcc\x81", "\xc3\xa9"},                                 // e + acute -> é
      {"A\xcc\x8a\xcc\xa3", "\xe1\xba\xa0\xcc\x8a"},             // ring and dot below reordered: Ạ + ring
      {"a\xcc\xa3\xcc\x82", "\xe1\xba\xad"},                     // a + dot below + circumflex -> ậ
      {"\xe1\xb8\x8b\xcc\xa3", "\xe1\xb8\x8d\xcc\x87"},          // ḋ + dot below -> ḍ + dot above
      {"q\xcc\x87\xcc\xa3", "q\xcc\xa3\xcc\x87"},                // no composite: only reordered
      {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81"},  // Hangul jamo L V T -> 각
      {"\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81"},              // syllable LV + T
      {"\xe2\x84\xab", "\xc3\x85"},                              // Angstrom sign -> Å (singleton)
      {"\xe0\xa5\x98", "\xe0\xa4\x95\xe0\xa4\xbc"},              // U+0958 is excluded from composition
      {"e\xcc\x81\xcc\x81", "\xc3\xa9\xcc\x81"},                 // the second acute is blocked
      {"plain ASCII", "plain ASCII"},
      {"a\xff\xcc\x81", "a\xff\xcc\x81"},  // an invalid byte blocks composition
  };
  for (const Case& c : cases) {
    EXPECT_EQ(NfcNormalize(c.in), c.want) << c.in;
    EXPECT_EQ(NfcNormalize(c.want), c.want) << "NFC is idempotent: " << c.want;
  }
}

TEST(NfcTest, QuickCheckPassesOnlyTextNfcLeavesAlone) {
  EXPECT_TRUE(IsNfcQuickSafe("The quick brown fox, 1234!"));
  EXPECT_TRUE(IsNfcQuickSafe("\xe4\xb8\xad\xe6\x96\x87 \xd0\x9f\xd1\x80\xd0\xb8"));  // 中文 При
  EXPECT_FALSE(IsNfcQuickSafe("e\xcc\x81"));                                         // a combining mark
  EXPECT_FALSE(IsNfcQuickSafe("\xe2\x84\xab"));                                      // a singleton decomposition
  EXPECT_FALSE(IsNfcQuickSafe("\xe1\x85\xa1"));  // a jamo vowel composes with what precedes it
}

}  // namespace
}  // namespace zinf::data
