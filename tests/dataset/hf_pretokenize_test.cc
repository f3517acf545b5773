// The split scanners of src/data/hf_pretokenize.h. The expected pieces are
// what the regexes give in a regex engine (JavaScript's, with the Llama 3
// pattern's (?i:...) written out), recorded here.
#include "data/hf_pretokenize.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace zinf::data {
namespace {

std::vector<std::string> Pieces(SplitPattern p, std::string_view text) {
  std::vector<std::string_view> views;
  SplitByPattern(p, text, &views);
  return {views.begin(), views.end()};
}

using V = std::vector<std::string>;

TEST(HfPreTokenizeTest, RecognizesTheKnownRegexesOnly) {
  EXPECT_EQ(RecognizeSplitRegex(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"),
            SplitPattern::kGpt2);
  EXPECT_EQ(
      RecognizeSplitRegex(
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
      SplitPattern::kLlama3);
  EXPECT_EQ(
      RecognizeSplitRegex(
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
      SplitPattern::kQwen2);
  EXPECT_FALSE(RecognizeSplitRegex(R"(\p{N}{1,3})").has_value());
  EXPECT_FALSE(RecognizeSplitRegex("").has_value());
}

TEST(HfPreTokenizeTest, Contractions) {
  const std::string t = "don't I'LL we'Ve";
  EXPECT_EQ(Pieces(SplitPattern::kGpt2, t), (V{"don", "'t", " I", "'", "LL", " we", "'", "Ve"}));
  EXPECT_EQ(Pieces(SplitPattern::kLlama3, t), (V{"don", "'t", " I", "'LL", " we", "'Ve"}));
  EXPECT_EQ(Pieces(SplitPattern::kQwen2, t), (V{"don", "'t", " I", "'LL", " we", "'Ve"}));
}

TEST(HfPreTokenizeTest, SpacesAndNewlines) {
  EXPECT_EQ(Pieces(SplitPattern::kGpt2, "a  b\n\n  c"), (V{"a", " ", " b", "\n\n ", " c"}));
  EXPECT_EQ(Pieces(SplitPattern::kLlama3, "a  b\n\n  c"), (V{"a", " ", " b", "\n\n", " ", " c"}));
  const std::string t = "  (hi)!! \n\n\t\"q\"\n";
  EXPECT_EQ(Pieces(SplitPattern::kGpt2, t), (V{" ", " (", "hi", ")!!", " \n\n", "\t", "\"", "q", "\"", "\n"}));
  EXPECT_EQ(Pieces(SplitPattern::kLlama3, t), (V{" ", " (", "hi", ")!!", " \n\n", "\t", "\"q", "\"\n"}));
  const std::string crlf = "\tfoo .bar\r\n\r\n  ";
  EXPECT_EQ(Pieces(SplitPattern::kGpt2, crlf), (V{"\t", "foo", " .", "bar", "\r\n\r\n  "}));
  EXPECT_EQ(Pieces(SplitPattern::kLlama3, crlf), (V{"\tfoo", " .", "bar", "\r\n\r\n", "  "}));
}

TEST(HfPreTokenizeTest, Numbers) {
  const std::string t = "x 1234567 ab12";
  EXPECT_EQ(Pieces(SplitPattern::kGpt2, t), (V{"x", " 1234567", " ab", "12"}));
  EXPECT_EQ(Pieces(SplitPattern::kLlama3, t), (V{"x", " ", "123", "456", "7", " ab", "12"}));
  EXPECT_EQ(Pieces(SplitPattern::kQwen2, t), (V{"x", " ", "1", "2", "3", "4", "5", "6", "7", " ab", "1", "2"}));
}

TEST(HfPreTokenizeTest, NonLatinScriptsAndEmoji) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2}) {
    EXPECT_EQ(Pieces(p, "Привет мир"), (V{"Привет", " мир"}));
    EXPECT_EQ(Pieces(p, "👍🏽x 中文"), (V{"👍🏽", "x", " 中文"}));
  }
}

TEST(HfPreTokenizeTest, PiecesCoverInvalidUtf8) {
  const std::string t = "a\xff\xfe b\x80";
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2}) {
    std::string joined;
    for (const std::string& s : Pieces(p, t)) joined += s;
    EXPECT_EQ(joined, t);
  }
}

}  // namespace
}  // namespace zinf::data
