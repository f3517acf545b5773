// Tokenizers: exact round trips (including a fuzz run over random bytes),
// GPT-2's pre-tokenization and byte alphabet, the heap BPE against a
// transcription of GPT-2's encoder.py bpe(), and vocabulary load errors.
#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "data_test_util.h"

namespace zinf::data {
namespace {

using test::FreshDir;
using test::GenerateVocabulary;
using test::SampleText;
using test::Spell;
using test::WriteVocabulary;

std::string RandomBytes(std::mt19937_64& rng, size_t max_len) {
  std::string s(rng() % (max_len + 1), '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

// Random text mixing ASCII words, spaces, multi-byte UTF-8 and stray bytes:
// closer to what the pre-tokenizer branches on than uniform bytes.
std::string RandomText(std::mt19937_64& rng, size_t pieces) {
  static const std::vector<std::string> kParts = {
      "the",  " the", "fox",          " ",   "  ", "\n", "\n\n", "\t",  "'s", "'t", "'re",  "'ll",          "'",
      "42",   " 7",   "!?",           ".",   "é",  "ü",  "日本", " 語", "한", "—",  "\xA0", "\xE3\x80\x80", "\xFF",
      "\xC3", "\x80", "\xED\xA0\x80", "Zoë", "²"};
  std::string s;
  for (size_t i = 0; i < pieces; ++i) s += kParts[rng() % kParts.size()];
  return s;
}

TEST(ByteTokenizerTest, RoundTripsRandomBytes) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.VocabSize(), 256);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 500; ++i) {
    const std::string s = RandomBytes(rng, 300);
    const std::vector<int32_t> ids = tok.Encode(s);
    ASSERT_EQ(ids.size(), s.size());
    for (size_t k = 0; k < s.size(); ++k) ASSERT_EQ(ids[k], static_cast<uint8_t>(s[k]));
    auto back = tok.Decode(ids);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, s);
  }
}

TEST(ByteTokenizerTest, DecodeRejectsIdsOutsideTheVocabulary) {
  ByteTokenizer tok;
  std::vector<int32_t> ids = {104, 105, 256};
  auto r = tok.Decode(ids);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("token 2 has id 256"), std::string::npos) << r.status().ToString();
  ids = {-1};
  EXPECT_FALSE(tok.Decode(ids).ok());
}

TEST(ByteTokenizerTest, StreamingInSmallChunksGivesTheSameIds) {
  ByteTokenizer tok;
  const std::string text = SampleText();
  std::vector<int32_t> streamed;
  size_t calls = 0;
  tok.EncodeStream(text, 7, [&](std::span<const int32_t> ids) {
    EXPECT_LE(ids.size(), 7u);
    streamed.insert(streamed.end(), ids.begin(), ids.end());
    ++calls;
  });
  EXPECT_EQ(streamed, tok.Encode(text));
  EXPECT_GT(calls, 10u);
}

// bytes_to_unicode() of GPT-2's encoder.py: a bijection onto 256 code
// points; printable bytes keep their code point; space is 'Ġ' (U+0120),
// newline 'Ċ' (U+010A), byte 0 is U+0100 and byte 173 (soft hyphen) is the
// last remapped, U+0143.
TEST(Gpt2BpeTokenizerTest, ByteAlphabetIsGpt2s) {
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) seen.insert(Gpt2BpeTokenizer::ByteToUnicode(static_cast<uint8_t>(b)));
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(Gpt2BpeTokenizer::ByteToUnicode('A'), "A");
  EXPECT_EQ(Gpt2BpeTokenizer::ByteToUnicode('~'), "~");
  EXPECT_EQ(Gpt2BpeTokenizer::ByteToUnicode(0xE9), "\xC3\xA9");  // é stays é
  EXPECT_EQ(Gpt2BpeTokenizer::ByteToUnicode(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(Gpt2BpeTokenizer::ByteToUnicode('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(Gpt2BpeTokenizer::ByteToUnicode(0), "\xC4\x80");     // U+0100
  EXPECT_EQ(Gpt2BpeTokenizer::ByteToUnicode(0xAD), "\xC5\x83");  // U+0143
}

// Expected pieces worked out by hand from GPT-2's pattern.
TEST(Gpt2BpeTokenizerTest, PreTokenizationFollowsGpt2sPattern) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("don't stop"), (V{"don", "'t", " stop"}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("they'll've"), (V{"they", "'ll", "'ve"}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("a \nb"), (V{"a", " ", "\n", "b"}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("x   "), (V{"x", "   "}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("123abc 42!? ..."), (V{"123", "abc", " 42", "!?", " ..."}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("?'s 'x"), (V{"?'", "s", " '", "x"}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("café wörld"), (V{"café", " wörld"}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("日本語 テスト"), (V{"日本語", " テスト"}));
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize("x\xA0\xA0y"),
            (V{"x", "\xA0\xA0", "y"}));  // invalid bytes: "other" characters
  EXPECT_EQ(Gpt2BpeTokenizer::PreTokenize(""), V{});
}

// GPT-2's encoder.py bpe(), transcribed on strings: the slow twin of the heap
// implementation.
std::vector<std::string> ReferenceBpe(const std::string& spelled_piece,
                                      const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> word;
  for (size_t i = 0; i < spelled_piece.size();) {
    const size_t len = (static_cast<uint8_t>(spelled_piece[i]) < 0x80) ? 1 : 2;  // the alphabet is U+0021..U+0143
    word.push_back(spelled_piece.substr(i, len));
    i += len;
  }
  while (word.size() > 1) {
    int best = -1;
    std::pair<std::string, std::string> bigram;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = ranks.find({word[i], word[i + 1]});
      if (it != ranks.end() && (best < 0 || it->second < best)) best = it->second, bigram = it->first;
    }
    if (best < 0) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == bigram.first && word[i + 1] == bigram.second) {
        merged.push_back(bigram.first + bigram.second);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = std::move(merged);
  }
  return word;
}

class GeneratedVocabularyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vocab_ = GenerateVocabulary(SampleText() + SampleText() + "aaaaaaaaaaaaaaaa!!!!!!!!", 120);
    dir_ = WriteVocabulary(vocab_, FreshDir());
    auto tok = Gpt2BpeTokenizer::Load(dir_);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::move(tok).value();
    for (size_t r = 0; r < vocab_.merges.size(); ++r) ranks_[vocab_.merges[r]] = static_cast<int>(r);
    encoder_ = nlohmann::json::parse(vocab_.encoder_json);
  }
  test::Vocabulary vocab_;
  std::string dir_;
  std::unique_ptr<Gpt2BpeTokenizer> tok_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
  nlohmann::json encoder_;
};

TEST_F(GeneratedVocabularyTest, LoadsTheVocabulary) {
  EXPECT_EQ(tok_->Name(), "gpt2-bpe");
  EXPECT_EQ(tok_->VocabSize(), 256 + static_cast<int64_t>(vocab_.merges.size()) + 1);
  EXPECT_NE(tok_->Fingerprint(), ByteTokenizer().Fingerprint());
  auto made = MakeTokenizer(dir_);
  ASSERT_TRUE(made.ok());
  EXPECT_EQ((*made)->Fingerprint(), tok_->Fingerprint());
  EXPECT_EQ((*MakeTokenizer(""))->Name(), "byte");
}

TEST_F(GeneratedVocabularyTest, MatchesGpt2sBpeAndCompresses) {
  std::mt19937_64 rng(7);
  std::vector<std::string> texts = {SampleText(), "aaaaaaaaaaaaaaaaaaaaaaaaa", "!!!!!!!!!!!!!!!!!!!!!!", "the the the"};
  for (int i = 0; i < 100; ++i) texts.push_back(RandomText(rng, 40));
  for (const std::string& text : texts) {
    std::vector<int32_t> expected;
    for (std::string_view piece : Gpt2BpeTokenizer::PreTokenize(text)) {
      for (const std::string& sym : ReferenceBpe(Spell(piece), ranks_))
        expected.push_back(encoder_.at(sym).get<int32_t>());
    }
    ASSERT_EQ(tok_->Encode(text), expected) << "text: " << text;
  }
  EXPECT_LT(tok_->Encode(SampleText()).size(), SampleText().size() * 2 / 3);
}

TEST_F(GeneratedVocabularyTest, RoundTripsTextAndRandomBytes) {
  std::mt19937_64 rng(11);
  std::vector<std::string> texts = {"", SampleText(), "<|endoftext|>", std::string(5000, 'a'), std::string(3000, ' ')};
  for (int i = 0; i < 300; ++i) texts.push_back(RandomText(rng, 60));
  for (int i = 0; i < 1000; ++i) texts.push_back(RandomBytes(rng, 200));  // the fuzz run
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tok_->Encode(text);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok_->VocabSize());
    auto back = tok_->Decode(ids);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ASSERT_EQ(*back, text);
  }
}

TEST_F(GeneratedVocabularyTest, StreamingInSmallChunksGivesTheSameIds) {
  std::vector<int32_t> streamed;
  tok_->EncodeStream(SampleText(), 3,
                     [&](std::span<const int32_t> ids) { streamed.insert(streamed.end(), ids.begin(), ids.end()); });
  EXPECT_EQ(streamed, tok_->Encode(SampleText()));
}

TEST_F(GeneratedVocabularyTest, SpecialTokenDecodesToItsText) {
  const int32_t eot = encoder_.at("<|endoftext|>").get<int32_t>();
  std::vector<int32_t> ids = {eot};
  EXPECT_EQ(*tok_->Decode(ids), "<|endoftext|>");
  ids = {static_cast<int32_t>(tok_->VocabSize())};
  auto r = tok_->Decode(ids);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not in the vocabulary"), std::string::npos);
}

void ExpectLoadError(std::string_view encoder_json, std::string_view vocab_bpe, const std::string& needle) {
  auto r = Gpt2BpeTokenizer::FromStrings(encoder_json, vocab_bpe, "vocab");
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
}

TEST(Gpt2BpeTokenizerTest, RejectsBrokenVocabularies) {
  nlohmann::json enc = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) enc[Gpt2BpeTokenizer::ByteToUnicode(static_cast<uint8_t>(b))] = b;
  enc["th"] = 256;
  const std::string good = enc.dump();
  ASSERT_TRUE(Gpt2BpeTokenizer::FromStrings(good, "#version: 0.2\nt h\n").ok());

  ExpectLoadError("{not json", "", "vocab/encoder.json:1:3: malformed JSON");
  // Inputs that crashed: a value nested 100,000 deep (its message was a
  // recursive dump), a number beyond double.
  ExpectLoadError("{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}", "",
                  "vocab/encoder.json:1:70: JSON nests deeper than 64 levels");
  ExpectLoadError("{\"a\": 1e999}", "", "number overflow parsing '1e999' (at a)");
  ExpectLoadError("[1, 2]", "", "expected a JSON object");
  nlohmann::json bad = enc;
  bad["th"] = "x";
  ExpectLoadError(bad.dump(), "", "token 'th' maps to \"x\"");
  bad = enc;
  bad["th"] = -3;
  ExpectLoadError(bad.dump(), "", "has id -3");
  bad = enc;
  bad["th"] = 5;
  ExpectLoadError(bad.dump(), "", "id 5 is given to two tokens");
  // A sparse id loads without a table of its size (this asked for 64 GiB).
  bad = enc;
  bad["th"] = 2147483646;
  auto sparse = Gpt2BpeTokenizer::FromStrings(bad.dump(), "t h\n", "vocab");
  ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
  EXPECT_EQ((*sparse)->VocabSize(), 2147483647);
  EXPECT_EQ((*sparse)->Encode("th"), std::vector<int32_t>{2147483646});
  EXPECT_EQ((*sparse)->Decode(std::vector<int32_t>{2147483646}).value(), "th");
  EXPECT_EQ((*sparse)->Decode(std::vector<int32_t>{300}).status().code(), StatusCode::kOutOfRange);
  bad = enc;
  bad.erase("A");
  ExpectLoadError(bad.dump(), "", "byte 65 ('A' in GPT-2's byte alphabet) has no token");
  ExpectLoadError(good, "#version: 0.2\nt h\nh e\n", "vocab/vocab.bpe line 3: merge 'h e' produces 'he'");
  ExpectLoadError(good, "t h\nth q x\n", "vocab/vocab.bpe line 2: expected two tokens");
  ExpectLoadError(good, "t h\nt h\n", "line 2: merge 't h' is repeated");
  ExpectLoadError(good, "tx h\n", "'tx' is not in encoder.json");

  auto missing = Gpt2BpeTokenizer::Load(FreshDir() + "/nowhere");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nowhere/encoder.json"), std::string::npos);
  auto via_flag = MakeTokenizer(FreshDir() + "/nowhere");
  ASSERT_FALSE(via_flag.ok());
  EXPECT_NE(via_flag.status().message().find("--tokenizer"), std::string::npos);
}

}  // namespace
}  // namespace zinf::data
