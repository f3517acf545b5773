// Chat JSONL (chat_data.cc) through each chat template: any text is a
// dataset of packed rows or an InvalidArgument naming the file (and line);
// rows are whole, targets are ids of the tokenizer or -1. The tokenizer is
// fixed: byte-level BPE with a few merges and every template's markers.
#include <nlohmann/json.hpp>

#include <memory>

#include "data/chat_data.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"

namespace {

std::unique_ptr<zinf::data::HfTokenizer> MakeTokenizer() {
  using Json = nlohmann::json;
  Json vocab = Json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[zinf::data::Gpt2BpeTokenizer::ByteToUnicode(static_cast<uint8_t>(b))] = id++;
  const std::string G = zinf::data::Gpt2BpeTokenizer::ByteToUnicode(' ');  // "Ġ"
  Json merges = Json::array();
  for (auto [l, r] : {std::pair<std::string, std::string>{G, "a"},
                      {"a", "s"},
                      {G + "a", "s"},
                      {"h", "i"},
                      {"\xc4\x8a", "\xc4\x8a"}}) {
    if (!vocab.contains(l + r)) vocab[l + r] = id++;
    merges.push_back(Json::array({l, r}));
  }
  Json added = Json::array();
  for (const char* m : {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>",
                        "<|im_end|>", "<s>", "</s>", "[INST]", "[/INST]", "<think>", "</think>"}) {
    added.push_back({{"id", id++}, {"content", m}, {"special", true}, {"normalized", false}});
  }
  const Json j = {{"added_tokens", added},
                  {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                  {"decoder", {{"type", "ByteLevel"}}},
                  {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  auto t = zinf::data::HfTokenizer::FromJson(j.dump(), "chat-tokenizer.json");
  ZINF_FUZZ_CHECK(t.ok(), t.status().message());
  return std::move(t).value();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zinf::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zinf;
  static const std::unique_ptr<data::HfTokenizer> tokenizer = MakeTokenizer();
  const std::string_view text = fuzz::AsText(data, size);
  // The tokenizer's linear boundaries against encoding every prefix, on the
  // first line (small inputs: the reference is quadratic).
  if (size <= 2048) {
    auto messages = data::ParseChatLine(text.substr(0, text.find('\n')), "fuzz.jsonl:1");
    for (data::ChatTemplate t :
         {data::ChatTemplate::kLlama3, data::ChatTemplate::kQwen3, data::ChatTemplate::kMistral}) {
      if (!messages.ok()) break;
      auto pieces = data::RenderChat(t, *messages);
      if (!pieces.ok()) continue;
      std::string whole;
      std::vector<size_t> cuts;
      for (const data::ChatPiece& p : *pieces) cuts.push_back((whole += p.text).size());
      const std::vector<int32_t> ids = tokenizer->Encode(whole);
      ZINF_FUZZ_CHECK(tokenizer->SharedPrefixLengths(whole, ids, cuts) ==
                          tokenizer->Tokenizer::SharedPrefixLengths(whole, ids, cuts),
                      "linear chat boundaries differ from the prefix encodings");
    }
  }
  for (data::ChatTemplate t : {data::ChatTemplate::kLlama3, data::ChatTemplate::kChatMl, data::ChatTemplate::kQwen3,
                               data::ChatTemplate::kMistral}) {
    constexpr int64_t kSeqLen = 48;
    auto ds = data::ChatDataset::FromText(text, "fuzz.jsonl", *tokenizer, t, kSeqLen);
    if (!ds.ok()) {
      fuzz::CheckRejection(ds.status(), "fuzz.jsonl");
      continue;
    }
    const data::ChatDataStats& st = (*ds)->stats();
    ZINF_FUZZ_CHECK(st.examples >= 1 && st.rows >= 0 && st.dropped <= st.truncated, "stats");
    auto split = (*ds)->Split(0.25);
    if (!split.ok()) {
      ZINF_FUZZ_CHECK(st.rows < 2, split.status().message());
      continue;
    }
    ZINF_FUZZ_CHECK(static_cast<int64_t>(split->train.size() + split->valid.size()) == st.rows * kSeqLen,
                    "rows are not whole");
    for (auto targets : {split->train_targets, split->valid_targets}) {
      for (int32_t target : targets) ZINF_FUZZ_CHECK(target >= -1 && target < tokenizer->VocabSize(), "target id");
    }
  }
  return 0;
}
