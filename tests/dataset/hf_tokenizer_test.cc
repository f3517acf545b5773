// HfTokenizer on small hand-written tokenizer.json files: one feature per
// test (byte-level BPE and merge order, ignore_merges, byte fallback with the
// Llama 2 normalizers and decoders, unknown tokens, added tokens and their
// flags, NFC, Metaspace), every rejected key, and MakeTokenizer's routing.
// hf_tokenizer_js_test.cc checks the real files.
#include "data/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dataset/data_test_util.h"

namespace zinf::data {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;
using test::FreshDir;
using test::Spell;
using test::WriteFile;

const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A byte-level tokenizer in the Llama 3 layout: byte b is id b; `extra`
// tokens (raw bytes) follow from 256; merges are pairs of raw byte strings.
Json ByteLevelJson(const std::vector<std::string>& extra,
                   const std::vector<std::pair<std::string, std::string>>& merges) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[Spell(std::string(1, static_cast<char>(b)))] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[Spell(extra[i])] = 256 + static_cast<int>(i);
  Json m = Json::array();
  for (const auto& [l, r] : merges) m.push_back(Json::array({Spell(l), Spell(r)}));
  return Json{
      {"version", "1.0"},
      {"added_tokens", Json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         Json::array(
             {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}, {"ignore_merges", false}}},
  };
}

// A Llama 2 / Mistral layout: <unk> <s> </s>, the 256 <0xNN> tokens, then
// `extra`; Prepend + Replace normalizer, no pre-tokenizer, and the
// Replace/ByteFallback/Fuse/Strip decoder.
Json Llama2Json(const std::vector<std::string>& extra, const std::vector<std::string>& merges) {
  Json vocab = Json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 259 + static_cast<int>(i);
  auto added = [](int id, const char* s) {
    return Json{{"id", id},        {"content", s},        {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  return Json{
      {"added_tokens", Json::array({added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", Json::array({{{"type", "Prepend"}, {"prepend", "\u2581"}},
                                     {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
      {"pre_tokenizer", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", Json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}},
                                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", merges},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true}}},
  };
}

std::unique_ptr<HfTokenizer> Make(const Json& j) {
  auto t = HfTokenizer::FromJson(j.dump());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::string RoundTrip(const HfTokenizer& t, std::string_view text) {
  auto d = t.Decode(t.Encode(text));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : "";
}

TEST(HfTokenizerTest, ByteLevelMergesLowestRankFirst) {
  // "bc" outranks "ab": "abc" -> a + bc.
  auto t = Make(ByteLevelJson({"bc", "ab"}, {{"b", "c"}, {"a", "b"}}));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("abc"), (Ids{'a', 256}));
  EXPECT_EQ(t->Encode(" ab"), (Ids{' ', 257}));  // the Llama 3 split keeps the space on the word
  // The other order of merges gives the other split.
  auto u = Make(ByteLevelJson({"bc", "ab"}, {{"a", "b"}, {"b", "c"}}));
  ASSERT_TRUE(u);
  EXPECT_EQ(u->Encode("abc"), (Ids{257, 'c'}));
  EXPECT_EQ(t->Name(), "hf-bpe");
  EXPECT_EQ(t->VocabSize(), 258);
  for (std::string_view s : {"abc ab\n\n  x", "\xff\xfe broken \xc3 utf-8", "", "\xe4\xb8\xad\xe6\x96\x87 1234567"}) {
    EXPECT_EQ(RoundTrip(*t, s), s);
  }
}

TEST(HfTokenizerTest, RepeatedPairsMergeLeftmostFirst) {
  auto t = Make(ByteLevelJson({"aa", "aaaa"}, {{"a", "a"}, {"aa", "aa"}}));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(t->Encode("aaaaa"), (Ids{257, 'a'}));
}

TEST(HfTokenizerTest, IgnoreMergesTakesAWholeWordFromTheVocabulary) {
  Json j = ByteLevelJson({"xy", "xyz"}, {{"x", "y"}});  // no merge makes "xyz"
  auto plain = Make(j);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->Encode("xyz"), (Ids{256, 'z'}));
  j["model"]["ignore_merges"] = true;
  auto ignoring = Make(j);
  ASSERT_TRUE(ignoring);
  EXPECT_EQ(ignoring->Encode("xyz"), (Ids{257}));
  EXPECT_EQ(ignoring->Encode("xyzz"), (Ids{256, 'z', 'z'}));
}

TEST(HfTokenizerTest, ByteFallbackWithPrependAndReplaceNormalizers) {
  // ids: ▁ 259, a 260, b 261, ▁a 262, ab 263, ▁ab 264
  auto t = Make(Llama2Json({"\u2581", "a", "b", "\u2581a", "ab", "\u2581ab"}, {"\u2581 a", "a b", "\u2581a b"}));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("ab ab"), (Ids{264, 264}));
  EXPECT_EQ(t->Encode("b"), (Ids{259, 261}));
  // é is not in the vocabulary: its UTF-8 bytes C3 A9 as <0xC3> <0xA9>.
  EXPECT_EQ(t->Encode("a\xc3\xa9"), (Ids{262, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(RoundTrip(*t, "a\xc3\xa9 ab"), "a\xc3\xa9 ab");
  // Bytes that are not UTF-8 come back as themselves (the library writes U+FFFD).
  EXPECT_EQ(t->Encode("\xff"), (Ids{259, 3 + 0xFF}));
  EXPECT_EQ(RoundTrip(*t, "a\xff"), "a\xff");
  // Added tokens are split out first; each stretch is normalized on its own,
  // so the text after <s> gets its own ▁.
  EXPECT_EQ(t->Encode("a<s>b"), (Ids{262, 1, 259, 261}));
  EXPECT_EQ(*t->Decode(Ids{262, 1, 259, 261}), "a<s> b");
  EXPECT_TRUE(t->IsSpecial(1));
  EXPECT_FALSE(t->IsSpecial(262));
  EXPECT_EQ(t->TokenToId("<s>"), 1);
  EXPECT_EQ(t->TokenToId("\u2581ab"), 264);
  EXPECT_EQ(t->TokenToId("nope"), -1);
}

TEST(HfTokenizerTest, UnknownCharactersWithoutByteFallback) {
  Json j = Llama2Json({"\u2581", "a"}, {});
  j["model"]["byte_fallback"] = false;
  auto fused = Make(j);
  ASSERT_TRUE(fused);
  EXPECT_EQ(fused->Encode("a\xc3\xa9\xc3\xa9"), (Ids{259, 260, 0}));
  j["model"]["fuse_unk"] = false;
  auto unfused = Make(j);
  ASSERT_TRUE(unfused);
  EXPECT_EQ(unfused->Encode("a\xc3\xa9\xc3\xa9"), (Ids{259, 260, 0, 0}));
  j["model"]["unk_token"] = nullptr;
  auto dropping = Make(j);  // the library drops what it cannot encode
  ASSERT_TRUE(dropping);
  EXPECT_EQ(dropping->Encode("a\xc3\xa9"), (Ids{259, 260}));
}

TEST(HfTokenizerTest, AddedTokensLongestMatchAndFlags) {
  Json j = ByteLevelJson({}, {});
  auto added = [](int id, const char* s, bool special) {
    return Json{{"id", id},        {"content", s},         {"special", special}, {"lstrip", false},
                {"rstrip", false}, {"single_word", false}, {"normalized", false}};
  };
  j["added_tokens"] = Json::array({added(300, "<|x|>", true), added(301, "<|x|>y", true), added(302, "[L]", false),
                                   added(303, "[R]", false), added(304, "tok", false)});
  j["added_tokens"][2]["lstrip"] = true;
  j["added_tokens"][3]["rstrip"] = true;
  j["added_tokens"][4]["single_word"] = true;
  auto t = Make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->VocabSize(), 305);
  EXPECT_EQ(t->Encode("a<|x|>yb<|x|>"), (Ids{'a', 301, 'b', 300}));
  EXPECT_EQ(t->Encode("a  [L]b"), (Ids{'a', 302, 'b'}));
  EXPECT_EQ(t->Encode("a[R] \t b"), (Ids{'a', 303, 'b'}));
  EXPECT_EQ(t->Encode("[R]  [L]"), (Ids{303, 302}));
  EXPECT_EQ(t->Encode("a tok"), (Ids{'a', ' ', 304}));
  EXPECT_EQ(t->Encode("atok"), (Ids{'a', 't', 'o', 'k'}));
  EXPECT_EQ(t->Encode("tok_"), (Ids{'t', 'o', 'k', '_'}));
  EXPECT_TRUE(t->IsSpecial(300));
  EXPECT_FALSE(t->IsSpecial(302));
  EXPECT_EQ(*t->Decode(Ids{'a', 301, 'b'}), "a<|x|>yb");
}

TEST(HfTokenizerTest, NfcNormalizerComposesBeforeSplitting) {
  Json j = ByteLevelJson({"\xc3\xa9"}, {{"\xc3", "\xa9"}});
  j["normalizer"] = {{"type", "NFC"}};
  auto t = Make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("e\xcc\x81"), (Ids{256}));
  EXPECT_EQ(t->Encode("\xc3\xa9"), (Ids{256}));
  EXPECT_EQ(RoundTrip(*t, "e\xcc\x81"), "\xc3\xa9");
}

TEST(HfTokenizerTest, ByteLevelPreTokenizerWithItsOwnRegexAndPrefixSpace) {
  Json j = ByteLevelJson({" a"}, {{" ", "a"}});
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  auto t = Make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("a a"), (Ids{256, 256}));
  EXPECT_EQ(t->Encode(" a"), (Ids{256}));
}

TEST(HfTokenizerTest, MetaspacePreTokenizerAndDecoder) {
  Json j = Llama2Json({"\u2581", "a", "b", "\u2581a", "ab", "\u2581ab"}, {"\u2581 a", "a b", "\u2581a b"});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", true}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}};
  j["model"]["byte_fallback"] = false;
  auto t = Make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->Encode("ab ab"), (Ids{264, 264}));
  EXPECT_EQ(t->Encode("ab  b"), (Ids{264, 259, 259, 261}));
  EXPECT_EQ(t->Encode("<s>ab"), (Ids{1, 263}));  // "first": only the text's start gets ▁
  EXPECT_EQ(RoundTrip(*t, "ab ab"), "ab ab");
}

TEST(HfTokenizerTest, NoDecoderJoinsTokensWithSpaces) {
  Json j = ByteLevelJson({"ab"}, {{"a", "b"}});
  j["decoder"] = nullptr;
  auto t = Make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(*t->Decode(Ids{256, 'c'}), "ab c");
}

TEST(HfTokenizerTest, DecodeRejectsIdsOutsideTheVocabulary) {
  auto t = Make(ByteLevelJson({}, {}));
  ASSERT_TRUE(t);
  for (int32_t bad : {-1, 256, 1 << 30}) {
    auto d = t->Decode(Ids{'a', bad});
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::kOutOfRange);
    EXPECT_NE(d.status().message().find("token 1 has id " + std::to_string(bad)), std::string::npos);
  }
}

TEST(HfTokenizerTest, StreamingChunksAndThreadsGiveTheSameIds) {
  auto t = Make(ByteLevelJson({"ab", "abab", " ab"}, {{"a", "b"}, {"ab", "ab"}, {" ", "ab"}}));
  ASSERT_TRUE(t);
  std::string text;
  for (int i = 0; i < 300; ++i) text += "abab ab x" + std::to_string(i) + (i % 7 ? " " : "\n");
  const Ids whole = t->Encode(text);
  Ids streamed;
  t->EncodeStream(text, 5, [&](std::span<const int32_t> ids) {
    EXPECT_LE(ids.size(), 5u + 16u);
    streamed.insert(streamed.end(), ids.begin(), ids.end());
  });
  EXPECT_EQ(streamed, whole);
  std::vector<Ids> per_thread(4);
  std::vector<std::thread> threads;
  for (auto& out : per_thread) threads.emplace_back([&] { out = t->Encode(text); });
  for (auto& th : threads) th.join();
  for (const Ids& ids : per_thread) EXPECT_EQ(ids, whole);
}

// Each file zinf cannot honour is one InvalidArgument naming the key.
TEST(HfTokenizerTest, RejectedFilesNameTheKey) {
  struct Case {
    const char* name;
    std::function<void(Json&)> edit;
    std::string want;
  };
  const Case cases[] = {
      {"model type", [](Json& j) { j["model"]["type"] = "WordPiece"; }, "model.type: unknown model 'WordPiece'"},
      {"normalizer",
       [](Json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer.type: unknown normalizer 'Lowercase'"},
      {"nested normalizer",
       [](Json& j) {
         j["normalizer"] = {{"type", "Sequence"}, {"normalizers", Json::array({{{"type", "NFKC"}}})}};
       },
       "normalizer.normalizers[0].type: unknown normalizer 'NFKC'"},
      {"replace regex",
       [](Json& j) {
         j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", " "}};
       },
       "normalizer.pattern.Regex"},
      {"pre-tokenizer",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer.type: unknown pre-tokenizer 'Whitespace'"},
      {"regex", [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}{1,5}"; },
       "pre_tokenizer.pretokenizers[0].pattern.Regex: unsupported split regex '\\p{N}{1,5}'"},
      {"behavior", [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "pre_tokenizer.pretokenizers[0].behavior: unsupported 'Removed'"},
      {"invert", [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       "pre_tokenizer.pretokenizers[0].invert"},
      {"decoder",
       [](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder.type: unknown decoder 'WordPiece'"},
      {"decoder type missing", [](Json& j) { j["decoder"] = Json::object(); }, "decoder.type: missing"},
      {"dropout", [](Json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
      {"subword prefix", [](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix: '##'"},
      {"suffix", [](Json& j) { j["model"]["end_of_word_suffix"] = "</w>"; }, "model.end_of_word_suffix"},
      {"merge part",
       [](Json& j) {
         j["model"]["merges"].push_back(Json::array({"zz", "a"}));
       },
       "model.merges[1]: 'zz a': 'zz' is not in the vocabulary"},
      {"merge result",
       [](Json& j) {
         j["model"]["merges"].push_back(Json::array({"b", "c"}));
       },
       "model.merges[1]: 'b c' produces 'bc', which is not in the vocabulary"},
      {"merge form", [](Json& j) { j["model"]["merges"].push_back("a b c"); }, "model.merges[1]: expected two tokens"},
      {"byte missing", [](Json& j) { j["model"]["vocab"].erase(Spell("\n")); }, "model.vocab: byte 0x0A"},
      {"repeated id", [](Json& j) { j["model"]["vocab"]["dup"] = 5; }, "model.vocab: id 5 is given to both"},
      {"negative id", [](Json& j) { j["model"]["vocab"]["neg"] = -2; }, "model.vocab: token 'neg' has id -2"},
      {"unk", [](Json& j) { j["model"]["unk_token"] = "<unk>"; }, "model.unk_token: '<unk>' is not in the vocabulary"},
      {"no model", [](Json& j) { j.erase("model"); }, "model: missing"},
      {"added token",
       [](Json& j) {
         j["added_tokens"] = Json::array({{{"content", "x"}}});
       },
       "added_tokens[0].id"},
      {"added content",
       [](Json& j) {
         j["added_tokens"] = Json::array({{{"id", 9}, {"content", ""}}});
       },
       "added_tokens[0].content: is empty"},
      {"bool", [](Json& j) { j["model"]["byte_fallback"] = "yes"; }, "model.byte_fallback: expected true or false"},
      {"strip",
       [](Json& j) {
         j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", -1}};
       },
       "decoder: start and stop"},
      {"prepend scheme",
       [](Json& j) {
         j["decoder"] = {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}};
       },
       "decoder.prepend_scheme: unknown scheme 'sometimes'"},
  };
  for (const Case& c : cases) {
    Json j = ByteLevelJson({"ab"}, {{"a", "b"}});
    c.edit(j);
    auto t = HfTokenizer::FromJson(j.dump(), "tok.json");
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(t.status().message().find("tok.json: " + c.want), std::string::npos)
        << c.name << ": " << t.status().message();
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos) << c.name;
  }
  auto not_json = HfTokenizer::FromJson("{\"model\": ", "tok.json");
  ASSERT_FALSE(not_json.ok());
  EXPECT_NE(not_json.status().message().find("tok.json:1:11: malformed JSON"), std::string::npos)
      << not_json.status().message();
}

// Files that crashed the reader or made it explode (the issue "Inputs that
// never crash"), each now one InvalidArgument naming the key.
TEST(HfTokenizerInputTest, ASparseIdAllocatesNothingBySize) {
  // The 61-byte reproducer: id 2147483646 asked for a 64 GiB table.
  const std::string tiny = R"({"model":{"type":"BPE","vocab":{"a":2147483646},"merges":[]}})";
  ASSERT_EQ(tiny.size(), 61u);
  auto t = HfTokenizer::FromJson(tiny, "tok.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->VocabSize(), 2147483647);
  EXPECT_EQ((*t)->Encode("aa"), (std::vector<int32_t>{2147483646, 2147483646}));
  EXPECT_EQ((*t)->Decode(std::vector<int32_t>{2147483646}).value(), "a");
  EXPECT_EQ((*t)->Decode(std::vector<int32_t>{7}).status().code(), StatusCode::kOutOfRange);
}

TEST(HfTokenizerInputTest, HostilePipelinesAreRejected) {
  auto error_of = [](const Json& j) {
    auto t = HfTokenizer::FromJson(j.dump(), "tok.json");
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : t.status().message();
  };
  // A thousand nested Sequences: JSON too deep.
  Json nested = {{"type", "NFC"}};
  for (int i = 0; i < 1000; ++i) nested = {{"type", "Sequence"}, {"normalizers", Json::array({nested})}};
  Json j = ByteLevelJson({"ab"}, {{"a", "b"}});
  j["normalizer"] = nested;
  EXPECT_NE(error_of(j).find("nests deeper than 64 levels"), std::string::npos);
  // A thousand Metaspace pre-tokenizers, flat: PreTokenize recursed per step.
  Json many = Json::array();
  for (int i = 0; i < 1000; ++i) many.push_back({{"type", "Metaspace"}, {"replacement", "_"}});
  j = ByteLevelJson({"ab"}, {{"a", "b"}});
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", many}};
  EXPECT_NE(error_of(j).find("tok.json: pre_tokenizer.pretokenizers: 1000 steps; zinf takes at most 32"),
            std::string::npos)
      << error_of(j);
  // Twenty Replace steps that each double the text: a million-fold.
  Json doubling = Json::array();
  for (int i = 0; i < 20; ++i) {
    doubling.push_back({{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", "aa"}});
  }
  j = ByteLevelJson({"ab"}, {{"a", "b"}});
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", doubling}};
  EXPECT_NE(error_of(j).find("tok.json: normalizer: its Replace, Prepend and Metaspace steps can make a text 1048576"),
            std::string::npos)
      << error_of(j);
  j["normalizer"] = nullptr;
  j["decoder"] = {{"type", "Sequence"}, {"decoders", doubling}};
  EXPECT_NE(error_of(j).find("tok.json: decoder: its Replace steps"), std::string::npos) << error_of(j);
  j["decoder"] = {{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", std::string(1000, 'x')}};
  EXPECT_NE(error_of(j).find("tok.json: decoder.content: a string of 1000 bytes"), std::string::npos) << error_of(j);
}

TEST(HfTokenizerTest, MakeTokenizerTakesAFileOrADirectory) {
  const std::string dir = FreshDir();
  WriteFile(dir + "/tokenizer.json", ByteLevelJson({"ab"}, {{"a", "b"}}).dump());
  for (const std::string& spec : {dir + "/tokenizer.json", dir}) {
    auto t = MakeTokenizer(spec);
    ASSERT_TRUE(t.ok()) << spec << ": " << t.status().ToString();
    EXPECT_EQ((*t)->Name(), "hf-bpe");
    EXPECT_EQ((*t)->Encode("ab"), (Ids{256}));
  }
  WriteFile(dir + "/bad.json", "{\"model\": {\"type\": \"Unigram\"}}");
  auto bad = MakeTokenizer(dir + "/bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--tokenizer " + dir + "/bad.json: " + dir + "/bad.json: model.type"),
            std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace zinf::data
