// ParseJsonText and JsonSnippet: every input gets an answer, deep or huge
// input included, and the answer names the source, position and key.
#include "common/json_text.h"

#include <gtest/gtest.h>

#include <string>

namespace zinf {
namespace {

std::string ErrorOf(const std::string& text) {
  auto r = ParseJsonText(text, "f.json");
  EXPECT_FALSE(r.ok()) << text.substr(0, 80);
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(JsonTextTest, ParsesADocument) {
  auto r = ParseJsonText(R"( {"a": [1, 2.5, "x", null, true], "b": {"c": -3, "d": 18446744073709551615}} )", "f.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->value["a"][1].get<double>(), 2.5);
  EXPECT_EQ(r->value["b"]["c"].get<int64_t>(), -3);
  EXPECT_TRUE(r->value["b"]["d"].is_number_unsigned());
  EXPECT_TRUE(r->duplicate_keys.empty());
}

// The reproducer of the DeepSpeed config that aborted zinf config check:
// nlohmann throws out_of_range 406 for it even with exceptions off.
TEST(JsonTextTest, NumberBeyondDoubleIsAnErrorNamingTheKey) {
  const std::string msg = ErrorOf(R"({"train_micro_batch_size_per_gpu": 4e308})");
  EXPECT_EQ(msg.rfind("f.json:1:", 0), 0u) << msg;
  EXPECT_NE(msg.find("number overflow parsing '4e308'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(at train_micro_batch_size_per_gpu)"), std::string::npos) << msg;
  EXPECT_NE(ErrorOf(R"({"a": [{"b": [1, -1e400]}]})").find("(at a[0].b[1])"), std::string::npos);
}

// 200,000 nested arrays crashed zinf config check (exit 139): rejected
// before a DOM exists, naming where the limit was passed.
TEST(JsonTextTest, DeepNestingIsRejectedWithItsPosition) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_EQ(ErrorOf(deep), "f.json:1:65: JSON nests deeper than 64 levels");
  const std::string objects = [] {
    std::string s;
    for (int i = 0; i < 100000; ++i) s += "{\"a\":";
    return s + "1" + std::string(100000, '}');
  }();
  EXPECT_NE(ErrorOf(objects).find("nests deeper than 64 levels"), std::string::npos);
  // 64 levels are fine; brackets inside strings do not count.
  auto ok = ParseJsonText(std::string(64, '[') + "\"[[[{{{\\\"\"" + std::string(64, ']'), "f.json");
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
}

TEST(JsonTextTest, SyntaxErrorsSayLineAndColumn) {
  EXPECT_EQ(ErrorOf("{\"a\": tru}").rfind("f.json:1:10: malformed JSON: syntax error while parsing value", 0), 0u);
  EXPECT_EQ(ErrorOf("{\n  \"a\": 1,\n}").rfind("f.json:3:1: malformed JSON", 0), 0u) << ErrorOf("{\n  \"a\": 1,\n}");
  EXPECT_EQ(ErrorOf("").rfind("f.json:1:1: malformed JSON", 0), 0u) << ErrorOf("");
  EXPECT_NE(ErrorOf("{\"a\": \"\xff\"}").find("malformed JSON"), std::string::npos);
  EXPECT_NE(ErrorOf("{} {}").find("malformed JSON"), std::string::npos);
}

TEST(JsonTextTest, DuplicateKeysAreListedWithTheirPath) {
  auto r = ParseJsonText(R"({"z": {"stage": 1, "stage": 2}, "l": [{"k": 1, "k": 2}]})", "f.json");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->duplicate_keys.size(), 2u);
  EXPECT_EQ(r->duplicate_keys[0].path, "z.stage");
  EXPECT_EQ(r->duplicate_keys[0].key, "stage");
  EXPECT_EQ(r->duplicate_keys[1].path, "l[0].k");
  EXPECT_EQ(r->value["z"]["stage"].get<int>(), 2);  // the later value is kept
}

// The check was quadratic (a path string per key): 200,000 repeats of one
// key are one pass, and the list stays short.
TEST(JsonTextTest, ManyDuplicatesStayBounded) {
  std::string text = "{\"a\": {";
  for (int i = 0; i < 200000; ++i) text += std::string(i ? "," : "") + "\"k\":1";
  text += "}}";
  auto r = ParseJsonText(text, "f.json");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->duplicate_keys.size(), kMaxDuplicateKeysListed);
}

TEST(JsonTextTest, SnippetIsBoundedAndValidUtf8) {
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) big.push_back(i);
  EXPECT_EQ(JsonSnippet(big, 20), "[0,1,2,3,4,5,6,7,...");
  EXPECT_EQ(JsonSnippet(nlohmann::json{{"a", 1}}), "{\"a\":1}");
  EXPECT_EQ(JsonSnippet(nlohmann::json("x")), "\"x\"");
  // A cut never splits a character; invalid UTF-8 is replaced, not thrown.
  const std::string snippet = JsonSnippet(nlohmann::json(std::string(30, 'a') + "\xe2\x96\x81\xe2\x96\x81"), 34);
  EXPECT_EQ(snippet, "\"" + std::string(30, 'a') + "...");
  EXPECT_EQ(JsonSnippet(nlohmann::json(std::string("\xff"))), "\"\xef\xbf\xbd\"");
  // Deep values built in code are cut, not walked.
  nlohmann::json deep = 1;
  for (int i = 0; i < 10000; ++i) deep = nlohmann::json::array({std::move(deep)});
  EXPECT_EQ(JsonSnippet(deep, 10), "[[[[[[[...");
}

}  // namespace
}  // namespace zinf
