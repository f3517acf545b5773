// Chat data: JSONL lines to messages (and every rejected shape), each
// template's rendering, the trained-token mask, the packer, the dataset and
// its loader; then the real Llama 3, Qwen3 and Llama 2 tokenizer.json files
// (zinf::test::TokenizerDir()), with the Llama 3 and Qwen3 conversations' ids
// checked against the files' own chat templates as transformers applies them
// (AutoTokenizer.from_pretrained + apply_chat_template, run with
// scripts/setup's Python by hf_tokenizer_oracle.py). Skips without the files
// or the Python modules, saying which.
#include "data/chat_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/hf_tokenizer.h"
#include "dataset/data_test_util.h"

namespace zinf::data {
namespace {

using Json = nlohmann::json;
using test::FreshDir;
using test::ReadFile;
using test::WriteFile;

std::vector<ChatMessage> Conversation() {
  return {{"system", "Be brief."},
          {"user", " Hi there "},
          {"assistant", "Hello! \xF0\x9F\x91\x8B\n"},
          {"user", "2+2?"},
          {"assistant", "4"}};
}

std::unique_ptr<HfTokenizer> ByteTokenizerWithMarkers() {
  auto t = HfTokenizer::FromJson(test::ByteTokenizerJsonWithMarkers());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::string Joined(const std::vector<ChatPiece>& pieces) {
  std::string s;
  for (const ChatPiece& p : pieces) s += p.text;
  return s;
}
std::vector<std::string> TrainedPieces(const std::vector<ChatPiece>& pieces) {
  std::vector<std::string> out;
  for (const ChatPiece& p : pieces) {
    if (p.trained) out.push_back(p.text);
  }
  return out;
}
// The decoded runs of trained tokens.
std::vector<std::string> TrainedRuns(const Tokenizer& tok, const TokenizedChat& c) {
  std::vector<std::string> out;
  for (size_t i = 0; i < c.ids.size();) {
    if (!c.trained[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < c.ids.size() && c.trained[j]) ++j;
    auto d = tok.Decode(std::span<const int32_t>(c.ids).subspan(i, j - i));
    out.push_back(d.ok() ? *d : "<undecodable>");
    i = j;
  }
  return out;
}

TEST(ChatDataTest, ParsesMessagesAndPromptResponseLines) {
  auto m = ParseChatLine(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})",
                         "f:1");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[1].role, "assistant");
  EXPECT_EQ((*m)[1].content, "b");

  auto p = ParseChatLine(R"({"system": "s", "prompt": "q", "response": "r"})", "f:2");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->size(), 3u);
  EXPECT_EQ((*p)[0].role, "system");
  EXPECT_EQ((*p)[1].content, "q");
  EXPECT_EQ((*p)[2].role, "assistant");

  auto c = ParseChatLine(R"({"prompt": "q", "completion": "r"})", "f:3");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->back().content, "r");
}

TEST(ChatDataTest, RejectedLinesNameTheLineAndTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "data.jsonl:7: not a JSON object"},
      {"[1, 2]", "data.jsonl:7: not a JSON object"},
      {R"({"text": "x"})", "expected \"messages\", or \"prompt\" and \"response\""},
      {R"({"prompt": "x"})", "a \"prompt\" needs a \"response\""},
      {R"({"prompt": 3, "response": "r"})", "prompt: expected a string"},
      {R"({"messages": []})", "messages: expected a non-empty array"},
      {R"({"messages": [{"role": "user"}]})", "messages[0]: expected {\"role\", \"content\"}"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})",
       "messages[0].role: 'tool' is not system, user or assistant"},
      {R"({"messages": [{"role": "user", "content": 1}]})", "messages[0].content: expected a string"},
      {R"({"messages": [{"role": "user", "content": "x"}]})", "no assistant message"},
  };
  for (const auto& [line, want] : cases) {
    auto r = ParseChatLine(line, "data.jsonl:7");
    ASSERT_FALSE(r.ok()) << line;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("data.jsonl:7: "), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(want), std::string::npos) << line << " -> " << r.status().message();
  }
}

TEST(ChatDataTest, Llama3RendersHeadersAndTrimmedContent) {
  auto r = RenderChat(ChatTemplate::kLlama3, Conversation());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Joined(*r),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello! \xF0\x9F\x91\x8B<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>");
  EXPECT_EQ(TrainedPieces(*r), (std::vector<std::string>{"Hello! \xF0\x9F\x91\x8B<|eot_id|>", "4<|eot_id|>"}));
}

TEST(ChatDataTest, ChatMlKeepsContentAndTrainsUpToImEnd) {
  auto r = RenderChat(ChatTemplate::kChatMl, Conversation());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Joined(*r),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi there <|im_end|>\n"
            "<|im_start|>assistant\nHello! \xF0\x9F\x91\x8B\n<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n");
  EXPECT_EQ(TrainedPieces(*r), (std::vector<std::string>{"Hello! \xF0\x9F\x91\x8B\n<|im_end|>", "4<|im_end|>"}));
}

TEST(ChatDataTest, Qwen3AddsTheThinkingBlockAfterTheLastQueryOnly) {
  const std::vector<ChatMessage> m = {{"user", "Hi"},
                                      {"assistant", "<think>\nponder\n</think>\n\nHello"},
                                      {"user", "Again"},
                                      {"assistant", "<think>\n\nsome thought\n\n</think>\n\nSure"},
                                      {"assistant", "More"}};
  auto r = RenderChat(ChatTemplate::kQwen3, m);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // The first answer loses its reasoning; the second keeps it (it has some);
  // the last gets the block, empty.
  EXPECT_EQ(Joined(*r),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
            "<|im_start|>user\nAgain<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nsome thought\n</think>\n\nSure<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nMore<|im_end|>\n");
  EXPECT_EQ(TrainedPieces(*r).size(), 3u);
}

TEST(ChatDataTest, MistralPutsTheSystemBeforeTheFirstQuestionAndNeedsAlternation) {
  auto r = RenderChat(ChatTemplate::kMistral, Conversation());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Joined(*r),
            "<s>[INST] Be brief.\n\n Hi there [/INST] Hello! \xF0\x9F\x91\x8B\n</s>[INST] 2+2?[/INST] 4</s>");
  EXPECT_EQ(TrainedPieces(*r), (std::vector<std::string>{" Hello! \xF0\x9F\x91\x8B\n</s>", " 4</s>"}));

  const std::vector<ChatMessage> bad = {{"user", "a"}, {"user", "b"}, {"assistant", "c"}};
  auto b = RenderChat(ChatTemplate::kMistral, bad);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("messages[1]"), std::string::npos) << b.status().message();
}

TEST(ChatDataTest, TemplatesByNameByMarkersAndTheirChecks) {
  for (const char* name : {"llama3", "chatml", "qwen3", "mistral"}) {
    auto t = ParseChatTemplate(name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ(ChatTemplateName(*t), name);
  }
  EXPECT_FALSE(ParseChatTemplate("alpaca").ok());
  const auto tok = ByteTokenizerWithMarkers();
  ASSERT_TRUE(tok);
  auto d = DetectChatTemplate(*tok);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, ChatTemplate::kLlama3);
  EXPECT_TRUE(CheckChatTemplate(ChatTemplate::kMistral, *tok).ok());

  const ByteTokenizer bytes;
  EXPECT_FALSE(DetectChatTemplate(bytes).ok());
  const Status s = CheckChatTemplate(ChatTemplate::kChatMl, bytes);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("needs the token <|im_start|>"), std::string::npos) << s.message();
}

TEST(ChatDataTest, TheMaskCoversExactlyTheTrainedText) {
  const auto tok = ByteTokenizerWithMarkers();
  ASSERT_TRUE(tok);
  for (ChatTemplate t : {ChatTemplate::kLlama3, ChatTemplate::kChatMl, ChatTemplate::kQwen3, ChatTemplate::kMistral}) {
    SCOPED_TRACE(std::string(ChatTemplateName(t)));
    auto r = RenderChat(t, Conversation());
    ASSERT_TRUE(r.ok());
    const TokenizedChat c = TokenizeChat(*tok, *r);
    ASSERT_EQ(c.ids.size(), c.trained.size());
    EXPECT_EQ(c.ids, tok->Encode(Joined(*r)));
    EXPECT_EQ(TrainedRuns(*tok, c), TrainedPieces(*r));
  }
}

TokenizedChat Example(int first_id, int n, int trained_from) {
  TokenizedChat e;
  for (int i = 0; i < n; ++i) {
    e.ids.push_back(first_id + i);
    e.trained.push_back(i >= trained_from ? 1 : 0);
  }
  return e;
}

TEST(ChatDataTest, PackerKeepsExamplesWholeAndPadsTheRest) {
  RowPacker p(/*seq_len=*/7, /*pad_id=*/99);  // rows of 8 tokens
  p.Add(Example(10, 3, 1));                   // 10 11* 12*
  p.Add(Example(20, 4, 2));                   // fits: 20 21 22* 23*; row has 7
  p.Add(Example(30, 3, 2));                   // does not fit: next row
  p.Finish();
  ASSERT_EQ(p.rows(), 2);
  EXPECT_EQ(p.inputs(), (std::vector<int32_t>{10, 11, 12, 20, 21, 22, 23, 30, 31, 32, 99, 99, 99, 99}));
  // Target t is token t + 1 when that token is trained; 20 and 30 (an
  // example's first token) and the padding never are.
  EXPECT_EQ(p.targets(), (std::vector<int32_t>{11, 12, -1, -1, 22, 23, -1, -1, 32, -1, -1, -1, -1, -1}));
  EXPECT_EQ(p.packed_tokens(), 10);
  EXPECT_EQ(p.truncated(), 0);
}

TEST(ChatDataTest, PackerCutsLongExamplesAndDropsThoseLeftWithoutTargets) {
  RowPacker p(/*seq_len=*/3, /*pad_id=*/0);  // rows of 4 tokens
  p.Add(Example(10, 6, 2));                  // cut to 10 11 12* 13*
  p.Add(Example(20, 6, 5));                  // cut to 20..23: nothing trained left: dropped
  p.Add(Example(30, 2, 1));
  p.Finish();
  EXPECT_EQ(p.truncated(), 2);
  EXPECT_EQ(p.dropped(), 1);
  ASSERT_EQ(p.rows(), 2);
  EXPECT_EQ(p.inputs(), (std::vector<int32_t>{10, 11, 12, 30, 31, 0}));
  EXPECT_EQ(p.targets(), (std::vector<int32_t>{-1, 12, 13, 31, -1, -1}));
}

TEST(ChatDataTest, PackerDropsAnExampleWithNoTokens) {
  RowPacker p(/*seq_len=*/3, /*pad_id=*/0);  // rows of 4 tokens
  p.Add(Example(0, 0, 0));                   // empty, on an empty row
  p.Add(Example(10, 2, 1));
  p.Add(Example(0, 0, 0));  // empty, after some tokens: the row is left as it was
  p.Finish();
  EXPECT_EQ(p.dropped(), 2);
  EXPECT_EQ(p.truncated(), 0);
  ASSERT_EQ(p.rows(), 1);
  EXPECT_EQ(p.inputs(), (std::vector<int32_t>{10, 11, 0}));
  EXPECT_EQ(p.targets(), (std::vector<int32_t>{11, -1, -1}));
}

TEST(ChatDataTest, DatasetPacksSplitsAndFeedsTheLoader) {
  const std::string dir = FreshDir();
  const auto tok = ByteTokenizerWithMarkers();
  ASSERT_TRUE(tok);
  std::string jsonl;
  for (int i = 0; i < 40; ++i) {
    jsonl += Json{{"prompt", "question " + std::to_string(i)}, {"response", "answer " + std::to_string(i * i)}}.dump() +
             "\n";
    if (i % 10 == 0) jsonl += "\n";  // blank lines are skipped
  }
  WriteFile(dir + "/d.jsonl", jsonl);
  uint64_t last_done = 0, last_total = 1;
  auto ds = ChatDataset::Open(dir + "/d.jsonl", *tok, ChatTemplate::kChatMl, 64,
                              [&](uint64_t done, uint64_t total) { last_done = done, last_total = total; });
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(last_done, last_total);
  const ChatDataStats& st = (*ds)->stats();
  EXPECT_EQ(st.examples, 40);
  EXPECT_GT(st.rows, 10);
  EXPECT_EQ(st.truncated, 0);

  auto split = (*ds)->Split(0.1);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->valid.size(), static_cast<size_t>(std::max<int64_t>(1, st.rows / 10) * 64));
  EXPECT_EQ(split->train.size() + split->valid.size(), static_cast<size_t>(st.rows * 64));
  EXPECT_EQ(split->train_targets.size(), split->train.size());

  auto loader = BatchLoader::Create(split->train, {2, 64, 5, true}, split->train_targets);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  EXPECT_EQ(loader->NumWindows(), static_cast<int64_t>(split->train.size() / 64));
  std::vector<int32_t> in(128), tg(128);
  int64_t trained = 0;
  for (int b = 0; b < 20; ++b) {
    loader->Next(in.data(), tg.data());
    for (int r = 0; r < 2; ++r) {
      for (int t = 0; t + 1 < 64; ++t) {
        const int32_t target = tg[r * 64 + t];
        if (target >= 0) {
          EXPECT_EQ(target, in[r * 64 + t + 1]);
          ++trained;
        }
      }
    }
  }
  EXPECT_GT(trained, 0);
  // The trained targets are the answers and their <|im_end|>, nothing else.
  std::vector<int32_t> kept;
  for (int32_t t : split->train_targets) {
    if (t >= 0) kept.push_back(t);
  }
  auto decoded = tok->Decode(kept);
  ASSERT_TRUE(decoded.ok());
  std::string rest = *decoded;
  int ends = 0;
  for (size_t at; (at = rest.find("<|im_end|>")) != std::string::npos; ++ends) rest.erase(at, 10);
  EXPECT_GT(ends, 30);
  EXPECT_EQ(rest.find_first_not_of("answer 0123456789"), std::string::npos) << rest;
}

TEST(ChatDataTest, DatasetErrorsNameTheFileAndLine) {
  const std::string dir = FreshDir();
  const auto tok = ByteTokenizerWithMarkers();
  ASSERT_TRUE(tok);
  WriteFile(dir + "/bad.jsonl", "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": \"a\"}\n");
  auto bad = ChatDataset::Open(dir + "/bad.jsonl", *tok, ChatTemplate::kLlama3, 32);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.jsonl:2: a \"prompt\" needs a \"response\""), std::string::npos)
      << bad.status().message();
  WriteFile(dir + "/empty.jsonl", "\n\n");
  auto empty = ChatDataset::Open(dir + "/empty.jsonl", *tok, ChatTemplate::kLlama3, 32);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no examples"), std::string::npos) << empty.status().message();
  auto missing = ChatDataset::Open(dir + "/none.jsonl", *tok, ChatTemplate::kLlama3, 32);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.jsonl"), std::string::npos) << missing.status().message();
  const ByteTokenizer bytes;
  auto no_markers = ChatDataset::Open(dir + "/bad.jsonl", bytes, ChatTemplate::kLlama3, 32);
  ASSERT_FALSE(no_markers.ok());
  EXPECT_NE(no_markers.status().message().find("<|begin_of_text|>"), std::string::npos);
}

// Conversations for the boundary tests: every template's shape, contents with
// spaces at the edges, newlines, markers and text that merges across a cut.
std::vector<std::vector<ChatMessage>> BoundaryConversations() {
  std::vector<std::vector<ChatMessage>> out = {Conversation()};
  uint64_t x = 7;
  auto next = [&] { return x = x * 6364136223846793005ull + 1442695040888963407ull, x >> 33; };
  const char* words[] = {" as", "has", "\n\n", "  ", "hi", "<|im_end|>", "</s>", "\xF0\x9F\x91\x8B", "a", " "};
  for (int c = 0; c < 40; ++c) {
    std::vector<ChatMessage> conv;
    if (next() % 2) conv.push_back({"system", "sys"});
    const int turns = 1 + static_cast<int>(next() % 5);
    for (int t = 0; t < turns; ++t) {
      for (const char* role : {"user", "assistant"}) {
        std::string content;
        for (uint64_t w = next() % 6; w > 0; --w) content += words[next() % std::size(words)];
        conv.push_back({role, content});
      }
    }
    out.push_back(std::move(conv));
  }
  return out;
}

// HfTokenizer's linear boundaries are the ones encoding each prefix gives.
void ExpectFastBoundariesExact(const HfTokenizer& tok) {
  for (const auto& conv : BoundaryConversations()) {
    for (ChatTemplate t :
         {ChatTemplate::kLlama3, ChatTemplate::kChatMl, ChatTemplate::kQwen3, ChatTemplate::kMistral}) {
      auto pieces = RenderChat(t, conv);
      if (!pieces.ok()) continue;
      std::string whole;
      std::vector<size_t> cuts;
      for (const ChatPiece& p : *pieces) cuts.push_back((whole += p.text).size());
      const std::vector<int32_t> ids = tok.Encode(whole);
      EXPECT_EQ(tok.SharedPrefixLengths(whole, ids, cuts), tok.Tokenizer::SharedPrefixLengths(whole, ids, cuts))
          << ChatTemplateName(t) << ": " << whole;
    }
  }
}

TEST(ChatDataTest, LinearBoundariesEqualEncodingEachPrefix) {
  ExpectFastBoundariesExact(*ByteTokenizerWithMarkers());
  // Markers that strip the space beside them, or match only as whole words.
  for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
    Json j = Json::parse(test::ByteTokenizerJsonWithMarkers());
    for (auto& a : j["added_tokens"]) a[flag] = true;
    j["added_tokens"].push_back({{"id", 300}, {"content", "as"}, {"single_word", true}});
    j["added_tokens"].push_back({{"id", 301}, {"content", "d>"}, {"single_word", true}});
    auto tok = HfTokenizer::FromJson(j.dump());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    SCOPED_TRACE(flag);
    ExpectFastBoundariesExact(**tok);
  }
}

// A tokenizer that counts the bytes it is asked to encode: TokenizeChat
// encodes the conversation once, not once per turn (which made a line of
// thousands of turns quadratic).
class CountingTokenizer final : public Tokenizer {
 public:
  explicit CountingTokenizer(const Tokenizer& inner) : inner_(inner) {}
  std::string Name() const override { return inner_.Name(); }
  int64_t VocabSize() const override { return inner_.VocabSize(); }
  uint64_t Fingerprint() const override { return inner_.Fingerprint(); }
  void EncodeStream(std::string_view text, size_t chunk_tokens,
                    const std::function<void(std::span<const int32_t>)>& sink) const override {
    bytes += text.size();
    inner_.EncodeStream(text, chunk_tokens, sink);
  }
  Result<std::string> Decode(std::span<const int32_t> tokens) const override { return inner_.Decode(tokens); }
  int32_t TokenId(std::string_view token) const override { return inner_.TokenId(token); }
  std::vector<size_t> SharedPrefixLengths(std::string_view text, std::span<const int32_t> ids,
                                          std::span<const size_t> cuts) const override {
    return inner_.SharedPrefixLengths(text, ids, cuts);
  }
  mutable size_t bytes = 0;

 private:
  const Tokenizer& inner_;
};

TEST(ChatDataTest, ThousandsOfTurnsAreEncodedOnce) {
  const auto tok = ByteTokenizerWithMarkers();
  std::vector<ChatMessage> conv;
  for (int i = 0; i < 4000; ++i) conv.push_back({i % 2 ? "assistant" : "user", "turn " + std::to_string(i)});
  for (ChatTemplate t : {ChatTemplate::kLlama3, ChatTemplate::kChatMl, ChatTemplate::kQwen3, ChatTemplate::kMistral}) {
    auto pieces = RenderChat(t, conv);
    ASSERT_TRUE(pieces.ok());
    CountingTokenizer counting(*tok);
    const TokenizedChat c = TokenizeChat(counting, *pieces);
    EXPECT_EQ(counting.bytes, Joined(*pieces).size()) << ChatTemplateName(t);
    EXPECT_EQ(TrainedPieces(*pieces).size(), 2000u);
    EXPECT_EQ(std::count(c.trained.begin(), c.trained.end(), 1) > 0, true);
  }
}

// ---- The real tokenizer.json files ----------------------------------------------

class ChatDataRealTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Path() const { return zinf::test::TokenizerDir() + "/" + GetParam() + "/tokenizer.json"; }
  std::unique_ptr<HfTokenizer> Load() {
    if (!std::filesystem::exists(Path())) return nullptr;
    auto t = HfTokenizer::Load(Path());
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(t).value() : nullptr;
  }
};

TEST_P(ChatDataRealTest, TheMaskFollowsTheAssistantTurns) {
  const auto tok = Load();
  if (!tok) GTEST_SKIP() << Path() << " does not exist ($ZINF_TOKENIZER_DIR)";
  auto t = DetectChatTemplate(*tok);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const ChatTemplate want = GetParam() == "llama3"  ? ChatTemplate::kLlama3
                            : GetParam() == "qwen3" ? ChatTemplate::kQwen3
                                                    : ChatTemplate::kMistral;
  EXPECT_EQ(*t, want);
  auto r = RenderChat(*t, Conversation());
  ASSERT_TRUE(r.ok());
  const TokenizedChat c = TokenizeChat(*tok, *r);
  EXPECT_EQ(c.ids, tok->Encode(Joined(*r)));
  const std::vector<std::string> runs = TrainedRuns(*tok, c);
  const std::vector<std::string> pieces = TrainedPieces(*r);
  ASSERT_EQ(runs.size(), pieces.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    // Byte-level vocabularies decode a run to its text exactly; Llama 2's
    // decoder drops the run's leading space.
    if (want == ChatTemplate::kMistral)
      EXPECT_EQ(" " + runs[i], pieces[i]);
    else
      EXPECT_EQ(runs[i], pieces[i]);
  }
}

TEST_P(ChatDataRealTest, LinearBoundariesEqualEncodingEachPrefix) {
  const auto tok = Load();
  if (!tok) GTEST_SKIP() << Path() << " does not exist ($ZINF_TOKENIZER_DIR)";
  ExpectFastBoundariesExact(*tok);
}

// zinf's rendering of a template against the one in the file's own
// tokenizer_config.json, as transformers applies it: the same ids.
class ChatDataTemplateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatDataTemplateTest, IdsMatchTransformersApplyChatTemplate) {
  const std::string model_dir = zinf::test::TokenizerDir() + "/" + GetParam();
  if (!std::filesystem::exists(model_dir + "/tokenizer_config.json")) {
    GTEST_SKIP() << model_dir << "/tokenizer_config.json does not exist ($ZINF_TOKENIZER_DIR)";
  }
  if (!zinf::test::PythonHas("transformers")) GTEST_SKIP() << zinf::test::PythonMissing("transformers");
  const bool llama3 = GetParam() == "llama3";
  const std::string dir = FreshDir();
  std::vector<std::vector<ChatMessage>> conversations = {
      Conversation(),
      {{"user", "Écris une fonction.\n```py\ndef f():\n    return 1\n```"}, {"assistant", "  Voilà 🎉  "}},
      {{"system", "\n  Spaces <|eot_id|>\t"},
       {"user", "\n\n"},
       {"assistant", "a\n\nb"},
       {"user", "日本語"},
       {"assistant", "x"}},
  };
  if (!llama3) {
    // Qwen3's reasoning blocks: dropped before the last question, kept
    // (and added, empty) after it.
    conversations.push_back({{"user", "Hi"},
                             {"assistant", "<think>\nponder\n</think>\n\nHello"},
                             {"user", "Again"},
                             {"assistant", "<think>\n\nsome thought\n\n</think>\n\nSure"},
                             {"assistant", "More"}});
  }
  Json in = Json::array();
  for (const auto& conv : conversations) {
    Json msgs = Json::array();
    for (const ChatMessage& m : conv) msgs.push_back({{"role", m.role}, {"content", m.content}});
    in.push_back(msgs);
  }
  WriteFile(dir + "/in.json", in.dump());
  const std::string cmd = "'" + zinf::test::Python() + "' '" + zinf::test::SourceDir() +
                          "/tests/dataset/hf_tokenizer_oracle.py' chat '" + model_dir + "' '" + dir + "/in.json' '" +
                          dir + "/out.json' 2>&1";
  const auto run = zinf::test::RunCommand(cmd);
  ASSERT_EQ(run.exit_code, 0) << cmd << "\n" << run.output;
  const Json expected = Json::parse(ReadFile(dir + "/out.json"));
  ASSERT_EQ(expected.size(), conversations.size());
  auto tok = HfTokenizer::Load(model_dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // Llama 3's template always ends with an assistant header (a generation
  // prompt, asked for or not); the training rendering stops after the last
  // turn.
  const std::vector<int32_t> header =
      llama3 ? (*tok)->Encode("<|start_header_id|>assistant<|end_header_id|>\n\n") : std::vector<int32_t>{};
  for (size_t i = 0; i < conversations.size(); ++i) {
    auto r = RenderChat(llama3 ? ChatTemplate::kLlama3 : ChatTemplate::kQwen3, conversations[i]);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::vector<int32_t> got = TokenizeChat(**tok, *r).ids;
    got.insert(got.end(), header.begin(), header.end());
    EXPECT_EQ(got, expected[i]["ids"].get<std::vector<int32_t>>()) << "conversation " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(RealFiles, ChatDataTemplateTest, ::testing::Values("llama3", "qwen3"),
                         [](const auto& param_info) { return param_info.param; });

INSTANTIATE_TEST_SUITE_P(RealFiles, ChatDataRealTest, ::testing::Values("llama3", "qwen3", "llama2"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace zinf::data
