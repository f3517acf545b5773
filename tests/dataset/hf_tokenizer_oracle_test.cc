// HfTokenizer against the library its format comes from, on real files: the
// tokenizer.json of Llama 3, Qwen3 and Llama 2 (Mistral's vocabulary) in
// zinf::test::TokenizerDir(), encoded and decoded by zinf and by Hugging
// Face's `tokenizers` (Tokenizer.from_file) through hf_tokenizer_oracle.py,
// run with scripts/setup's Python. Per text, ids agree token for token (no
// post-processor: no BOS), the decoded texts byte for byte (special tokens
// kept; the library's decode has no clean-up of spaces), and the decoded text
// encodes again to the library's ids. Every id of the vocabulary, decoded
// alone, agrees too, except where zinf's promise differs from the library's
// (hf_tokenizer.h): for a token that is not valid UTF-8 on its own the
// library writes U+FFFD and zinf the bytes; there the library's text must be
// zinf's with each ill-formed sequence replaced by U+FFFD. Without the files
// or the Python modules the tests skip, saying which.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/hf_tokenizer.h"
#include "dataset/data_test_util.h"

namespace zinf::data {
namespace {

using test::FreshDir;
using test::ReadFile;
using test::WriteFile;

// The texts both sides encode: each language and feature alone (so a
// difference points at its cause), then all of them in one text.
std::vector<std::string> Texts() {
  std::vector<std::string> t = {
      "Hello world! The quick brown fox jumps over the lazy dog.",
      "don't I'LL we've They'RE it's O'Neil's rock'n'roll 'quoted' ''",
      "中文测试：你好，世界！机器学习模型的训练需要大量的数据。",
      "日本語のテキストです。カタカナとひらがな、そして漢字。ｶﾀｶﾅ",
      "مرحبا بالعالم، هذا نص عربي للاختبار.",
      "Привет, мир! Это проверка токенизатора на русском языке.",
      "नमस्ते दुनिया, यह हिंदी में एक परीक्षण है।",
      "한국어 텍스트도 있습니다. café naïve Zürich Ελληνικά",
      "emoji 👍 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 👩🏿‍💻 🇯🇵 ❤️ ✨🎉",
      "def f(x):\n\tif x > 0:\n\t\treturn x * 2\n    else:\n        return None\n\n\nclass A:  # comment\n    pass\n",
      "int main() {\r\n  printf(\"%d\\n\", 42);\r\n  return 0;\r\n}\r\n",
      "a  b   c    d\n\n\n  e\t\t f \n \n  trailing   ",
      "   leading spaces and\u00a0no-break\u3000ideographic space",
      "1234567 3.14159 1,000,000 2024-01-31 0x1F 12:30 ١٢٣ ½ ²",
      "<|begin_of_text|>Hi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhello",
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n<think>x</think><|im_end|>",
      "<s>[INST] question [/INST] answer</s> <unk> text<s>",
      "e\u0301 A\u030a \u1100\u1161\u11a8 \u212b Dec\u0327omposed",
      "literal \u2581meta\u2581space, <0x41> byte text, \u01c5ungla, I'm\u00a0here, tab\tend",
      "  <|eot_id|>  spaced <|end_of_text|>\n<|im_end|>\n\n",
      "https://example.com/path?q=1&r=2#frag user@example.org $HOME/.cache ~/x C:\\Windows",
      "((((((((((((((((((((((((((((((((((((((((((((((((((( ====== ------ ...... !!!!!!",
      " ",
      "\n",
      "x",
      // Added since the JavaScript reference: long runs (the regexes' and
      // the merge loop's worst case), digits in long groups, markers
      // back to back and cut short, zero-width and invisible code points,
      // scripts and planes not above, control bytes.
      std::string(300, ' ') + "x" + std::string(257, 'a') + "\n" + std::string(70, '\t'),
      "12345678901234567890 9876543210.0123456789e-10 007 x1y22z333",
      "<|eot_id|><|eot_id|><|im_end|><|im_start|><s></s><|eot_id <|im_start| <s </s <|begin_of_text",
      "\ufeffBOM zero\u200bwidth joiner\u200dnon\u200cjoiner soft\u00adhyphen \u2060word\u2028line\u2029para",
      "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚 𠀀𠀁𪚥 𓀀𓁐 ꙮ ᚠᛇᚻ ⠓⠑⠇⠇⠕",
      "ภาษาไทย עברית בדיקה தமிழ் ქართული Հայերեն አማርኛ ខ្មែរ ລາວ",
      "ctrl\x01\x02\x1f\x7f del\rcr only\r\r\n\vvt\fff",
      "Mixed日本語and English123數字ABCdef ÀÉÎõü ǅǈ ﬁﬂ Ⅻ ①②",
      "{\"key\": [1, 2.5e3, null, true], \"s\": \"a\\u00e9\\\"\"}  <div class=\"x\">&amp;&lt;</div>",
      "<think>\n\n</think>\n\n<tool_call>{\"name\": \"f\"}</tool_call>[INST][/INST]<<SYS>>\n<</SYS>>",
  };
  std::string all;
  for (const std::string& s : t) all += s + "\n";
  t.push_back(all);
  return t;
}

// `bytes` as the library's String::from_utf8_lossy writes it: each maximal
// subpart of an ill-formed sequence (Unicode 15, 3.9, "U+FFFD Substitution
// of Maximal Subparts") becomes one U+FFFD.
std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    int need = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    if (b >= 0xC2 && b <= 0xDF)
      need = 1;
    else if (b >= 0xE0 && b <= 0xEF)
      need = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4)
      need = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    size_t j = i + 1;
    int got = 0;
    while (need > 0 && got < need && j < bytes.size()) {
      const auto c = static_cast<uint8_t>(bytes[j]);
      if (got == 0 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
      ++j;
      ++got;
    }
    if (need > 0 && got == need) {
      out.append(bytes.substr(i, j - i));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i = j;
  }
  return out;
}

bool ValidUtf8(std::string_view bytes) { return Utf8Lossy(bytes) == bytes; }

TEST(HfTokenizerOracleLossyTest, ReplacesMaximalSubparts) {
  EXPECT_EQ(Utf8Lossy("a\xE4\xBD"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");                                                                // a cut 3-byte sequence: one
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x91"), "\xEF\xBF\xBD");                          // a cut 4-byte sequence: one
  EXPECT_EQ(Utf8Lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // lone continuations: one each
  EXPECT_EQ(Utf8Lossy("\xE0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: no subpart
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(Utf8Lossy("é👍"), "é👍");
  EXPECT_FALSE(ValidUtf8("\xC3"));
  EXPECT_TRUE(ValidUtf8("é"));
}

class HfTokenizerOracleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerOracleTest, EncodeAndDecodeAgreeWithTheTokenizersLibrary) {
  const std::string json_path = zinf::test::TokenizerDir() + "/" + GetParam() + "/tokenizer.json";
  if (!std::filesystem::exists(json_path)) GTEST_SKIP() << json_path << " does not exist ($ZINF_TOKENIZER_DIR)";
  if (!zinf::test::PythonHas("tokenizers")) GTEST_SKIP() << zinf::test::PythonMissing("tokenizers");
  const std::string dir = FreshDir();
  const std::vector<std::string> texts = Texts();
  WriteFile(dir + "/in.json", nlohmann::json(texts).dump());
  const std::string cmd = "'" + zinf::test::Python() + "' '" + zinf::test::SourceDir() +
                          "/tests/dataset/hf_tokenizer_oracle.py' encode '" + json_path + "' '" + dir + "/in.json' '" +
                          dir + "/out.json' 2>&1";
  const auto run = zinf::test::RunCommand(cmd);
  ASSERT_EQ(run.exit_code, 0) << cmd << "\n" << run.output;
  const nlohmann::json expected = nlohmann::json::parse(ReadFile(dir + "/out.json"));
  ASSERT_EQ(expected["texts"].size(), texts.size());

  auto tok = HfTokenizer::Load(json_path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  size_t num_ids = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    SCOPED_TRACE("text " + std::to_string(i) + ": " + nlohmann::json(texts[i]).dump());
    const nlohmann::json& e = expected["texts"][i];
    const std::vector<int32_t> got = (*tok)->Encode(texts[i]);
    EXPECT_EQ(got, e["ids"].get<std::vector<int32_t>>());
    num_ids += got.size();
    auto decoded = (*tok)->Decode(got);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, e["decoded"].get<std::string>());
    EXPECT_EQ((*tok)->Encode(*decoded), e["reencoded"].get<std::vector<int32_t>>());
  }

  // Every id alone.
  const nlohmann::json& tokens = expected["tokens"];
  EXPECT_EQ((*tok)->VocabSize(), static_cast<int64_t>(tokens.size()));
  int64_t same = 0, replaced = 0, absent = 0;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::vector<int32_t> one = {static_cast<int32_t>(id)};
    auto d = (*tok)->Decode(one);
    if (tokens[id].is_null()) {
      EXPECT_FALSE(d.ok()) << "id " << id << " has no token in the library; zinf decodes it";
      ++absent;
      continue;
    }
    ASSERT_TRUE(d.ok()) << "id " << id << ": " << d.status().ToString();
    const std::string want = tokens[id].get<std::string>();
    if (ValidUtf8(*d)) {
      EXPECT_EQ(*d, want) << "id " << id;
      ++same;
    } else {
      EXPECT_EQ(Utf8Lossy(*d), want) << "id " << id << " (not UTF-8 alone)";
      ++replaced;
    }
  }
  std::printf(
      "  %s: %zu texts, %zu ids agree; %lld of %zu ids decode alone to the library's text, %lld to its "
      "U+FFFD (not UTF-8 alone), %lld have no token\n",
      GetParam().c_str(), texts.size(), num_ids, static_cast<long long>(same), tokens.size(),
      static_cast<long long>(replaced), static_cast<long long>(absent));
}

INSTANTIATE_TEST_SUITE_P(RealFiles, HfTokenizerOracleTest, ::testing::Values("llama3", "qwen3", "llama2"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace zinf::data
