// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE"}):
// a vocabulary, ranked merges, and what to do with a character the
// vocabulary lacks (byte fallback to <0xNN> tokens, or the unknown token).
// EncodeWord turns one pre-tokenized word into ids the way the tokenizers
// library does: start from one symbol per character (per byte in byte-level
// mode), then repeatedly merge the adjacent pair of lowest rank, leftmost
// first. With ignore_merges a word that is itself in the vocabulary is one
// token. Results for short words are cached.
//
// Byte-level mode (the model under a ByteLevel pre-tokenizer): token texts
// are spelled in GPT-2's byte alphabet (Gpt2BpeTokenizer::ByteToUnicode) and
// the model works on raw bytes directly, so no text is ever re-spelled.
//
// Thread-safety: after Create, every method is const and may run
// concurrently (the word cache is sharded under mutexes).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zinf/status.h"

namespace zinf::data {

struct BpeConfig {
  std::vector<std::pair<std::string, int64_t>> vocab;       // token text, as in the file -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  bool byte_level = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  bool fuse_unk = false;
  std::optional<std::string> unk_token;
};

class BpeModel {
 public:
  // Errors name the key under "model": "vocab: ..." or "merges[7]: ...":
  // an id that is negative, too large or repeated; a merge whose parts or
  // result are not in the vocabulary; an unk_token not in the vocabulary; in
  // byte-level mode a byte without a token.
  static Result<std::unique_ptr<BpeModel>> Create(BpeConfig config);
  ~BpeModel();

  // Appends the ids of `word` (raw bytes; in character mode, UTF-8 text,
  // where a byte that is not valid UTF-8 is a character of its own). A
  // character without a token becomes its <0xNN> byte tokens (byte_fallback),
  // else the unknown token (consecutive ones fused with fuse_unk), else
  // nothing, as in the tokenizers library.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  // One past the largest id in the vocabulary.
  int64_t IdLimit() const;
  bool HasId(int32_t id) const;
  // The token's text as spelled in the file ("" for an id not in it).
  const std::string& IdToToken(int32_t id) const;
  // In byte-level mode the bytes a token stands for (its text if it is not
  // spelled in the byte alphabet); otherwise its text.
  const std::string& IdToBytes(int32_t id) const;
  // The id of a token text as spelled in the file, or -1.
  int32_t TokenToId(std::string_view token) const;

 private:
  struct Impl;
  explicit BpeModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::data
