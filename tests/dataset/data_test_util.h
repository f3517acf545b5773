// Helpers for the data tests: a fresh scratch directory per test, whole-file
// I/O, and a generated GPT-2-style BPE vocabulary (encoder.json + vocab.bpe)
// learned from a sample text, so no test downloads anything.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "test_util.h"

namespace zinf::data::test {

// <scratch>/data_test/<suite>.<test>, emptied.
inline std::string FreshDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = zinf::test::TestDir() + "/data_test/" + info->test_suite_name() + "." + info->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The GPT-2 alphabet spelling of a byte string.
inline std::string Spell(std::string_view bytes) {
  std::string s;
  for (char c : bytes) s += Gpt2BpeTokenizer::ByteToUnicode(static_cast<uint8_t>(c));
  return s;
}

// A tokenizer.json with one token per byte (ids 0..255, no merges) and the
// chat templates' markers as special added tokens from 256 (264 ids in all).
inline std::string ByteTokenizerJsonWithMarkers() {
  using Json = nlohmann::json;
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[Spell(std::string(1, static_cast<char>(b)))] = b;
  Json added = Json::array();
  int id = 256;
  for (const char* m : {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>",
                        "<|im_end|>", "<s>", "</s>"}) {
    added.push_back({{"id", id++}, {"content", m}, {"special", true}, {"normalized", false}});
  }
  const Json j = {{"added_tokens", added},
                  {"normalizer", nullptr},
                  {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
                  {"decoder", {{"type", "ByteLevel"}}},
                  {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array()}}}};
  return j.dump();
}

struct Vocabulary {
  std::string encoder_json;
  std::string vocab_bpe;
  std::vector<std::pair<std::string, std::string>> merges;  // spelled, in rank order
};

// Learns `num_merges` merges from `text` the way BPE training does (most
// frequent adjacent pair inside GPT-2's pre-tokenization pieces; ties to the
// smallest pair), then writes the 256 byte tokens, the merge results and
// "<|endoftext|>" as encoder.json and the merges as vocab.bpe. Ids are
// shuffled away from their natural order by a fixed stride, so no test can
// pass by assuming ids equal bytes.
inline Vocabulary GenerateVocabulary(std::string_view text, int num_merges) {
  std::vector<std::vector<std::string>> words;
  for (std::string_view piece : Gpt2BpeTokenizer::PreTokenize(text)) {
    std::vector<std::string> w;
    for (char c : piece) w.push_back(Spell(std::string_view(&c, 1)));
    words.push_back(std::move(w));
  }
  Vocabulary v;
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(Gpt2BpeTokenizer::ByteToUnicode(static_cast<uint8_t>(b)));
  for (int m = 0; m < num_merges; ++m) {
    std::map<std::pair<std::string, std::string>, int> counts;
    for (const auto& w : words) {
      for (size_t i = 0; i + 1 < w.size(); ++i) ++counts[{w[i], w[i + 1]}];
    }
    if (counts.empty()) break;
    auto best = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    const auto [a, b] = best->first;
    v.merges.push_back({a, b});
    tokens.push_back(a + b);
    for (auto& w : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
          merged.push_back(a + b);
          ++i;
        } else {
          merged.push_back(w[i]);
        }
      }
      w = std::move(merged);
    }
  }
  tokens.push_back("<|endoftext|>");
  nlohmann::json enc = nlohmann::json::object();
  const size_t n = tokens.size();
  for (size_t i = 0; i < n; ++i) enc[tokens[i]] = (i * 7919) % n;  // 7919 is prime; n is not a multiple of it
  v.encoder_json = enc.dump();
  v.vocab_bpe = "#version: 0.2\n";
  for (const auto& [a, b] : v.merges) v.vocab_bpe += a + " " + b + "\n";
  return v;
}

inline std::string WriteVocabulary(const Vocabulary& v, const std::string& dir) {
  WriteFile(dir + "/encoder.json", v.encoder_json);
  WriteFile(dir + "/vocab.bpe", v.vocab_bpe);
  return dir;
}

inline std::string SampleText() {
  return "The quick brown fox jumps over the lazy dog. The dog doesn't mind; it's 42 degrees!\n"
         "Theirs is the other fox's den, and they'll say they've seen 1234 foxes.\n\n"
         "  Indented   text\twith\ttabs, café crème, naïve Zoë — über straße; Ελληνικά, русский язык, "
         "日本語のテキスト, 한국어 텍스트. The end?!  \n";
}

}  // namespace zinf::data::test
