// Tokenizers: text bytes <-> int32 token ids. Three kinds:
//  - ByteTokenizer: one token per byte, vocabulary 256 (the default).
//  - Gpt2BpeTokenizer: GPT-2's byte-level BPE (Radford et al. 2019; the
//    encoder.py of openai/gpt-2), loaded from the two files GPT-2 ships:
//    encoder.json (token string -> id) and vocab.bpe (the merges, in rank
//    order, after a "#version" line).
//  - HfTokenizer (hf_tokenizer.h): a Hugging Face tokenizer.json (Llama 2
//    and 3, Mistral, Qwen2/3, GPT-2 and others with a BPE model).
// The first two work on bytes, not code points: Decode(Encode(s)) == s for
// every byte string, valid UTF-8 or not. They never emit special tokens such
// as <|endoftext|>; their text is encoded like any other text. HfTokenizer
// does split out its file's added tokens, as the tokenizers library does.
//
// GPT-2 pre-tokenization. Text is first split by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// and BPE runs inside each piece. The split here is a hand-written scanner
// equivalent to that pattern; \s is Unicode White_Space; \p{L} and \p{N} are
// the general categories L* and N*, from the full tables of
// unicode_classes.h. A byte that is not part of valid UTF-8 is a one-byte
// character of the "neither" class.
//
// Thread-safety: Encode and Decode are const and may run concurrently (the
// BPE's piece cache is guarded by a mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "byte", "gpt2-bpe" or "hf-bpe".
  virtual std::string Name() const = 0;
  // Ids are in [0, VocabSize()).
  virtual int64_t VocabSize() const = 0;
  // Identifies the vocabulary (a hash of everything that decides the ids):
  // token caches made with another fingerprint are not reused.
  virtual uint64_t Fingerprint() const = 0;

  // Encodes `text` as one text, handing the ids to `sink` in order, in pieces
  // of at most about `chunk_tokens` (so a file of any size needs no token
  // vector of its size).
  virtual void EncodeStream(std::string_view text, size_t chunk_tokens,
                            const std::function<void(std::span<const int32_t>)>& sink) const = 0;
  // kOutOfRange naming the first id that is not in the vocabulary.
  virtual Result<std::string> Decode(std::span<const int32_t> tokens) const = 0;
  // The id of a token by its text as the vocabulary spells it (chat
  // templates' markers such as <|im_start|>), or -1; -1 for every text in
  // the byte and GPT-2 tokenizers, which have no such markers.
  virtual int32_t TokenId(std::string_view token) const {
    (void)token;
    return -1;
  }

  std::vector<int32_t> Encode(std::string_view text) const;

  // For each cut (offsets into `text`, ascending), how many leading ids
  // Encode(text.substr(0, cut)) shares with `ids`, which is Encode(text): where
  // a chat template's piece boundaries fall among the tokens (chat_data.h).
  // This base version encodes every prefix, so its time grows with cuts x
  // length; a tokenizer that splits text at tokens it knows overrides it with
  // the same answers in time linear in the text.
  virtual std::vector<size_t> SharedPrefixLengths(std::string_view text, std::span<const int32_t> ids,
                                                  std::span<const size_t> cuts) const;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::string Name() const override { return "byte"; }
  int64_t VocabSize() const override { return 256; }
  uint64_t Fingerprint() const override { return 0x62797465'00000100ull; }  // "byte", 256
  void EncodeStream(std::string_view text, size_t chunk_tokens,
                    const std::function<void(std::span<const int32_t>)>& sink) const override;
  Result<std::string> Decode(std::span<const int32_t> tokens) const override;
};

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  // Reads dir/encoder.json and dir/vocab.bpe. Errors name the file and, for
  // vocab.bpe, the line: unreadable files, malformed JSON, an id that is
  // negative or repeated, a byte of GPT-2's byte alphabet without a token
  // (the round trip needs all 256), a merge whose parts or result are not in
  // encoder.json, a repeated merge.
  static Result<std::unique_ptr<Gpt2BpeTokenizer>> Load(const std::string& dir);
  // The same from the two files' contents (tests, embedded vocabularies).
  static Result<std::unique_ptr<Gpt2BpeTokenizer>> FromStrings(std::string_view encoder_json,
                                                               std::string_view vocab_bpe,
                                                               const std::string& origin = "<memory>");
  ~Gpt2BpeTokenizer() override;

  std::string Name() const override { return "gpt2-bpe"; }
  int64_t VocabSize() const override;
  uint64_t Fingerprint() const override;
  void EncodeStream(std::string_view text, size_t chunk_tokens,
                    const std::function<void(std::span<const int32_t>)>& sink) const override;
  Result<std::string> Decode(std::span<const int32_t> tokens) const override;

  // GPT-2's byte <-> character map (bytes_to_unicode in encoder.py): the
  // printable bytes map to themselves, the other 68 to U+0100 onwards.
  // Returned as UTF-8.
  static std::string ByteToUnicode(uint8_t byte);
  // The pre-tokenization pieces of `text` (see the file comment).
  static std::vector<std::string_view> PreTokenize(std::string_view text);

 private:
  struct Impl;
  explicit Gpt2BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The --tokenizer flag: "" or "byte" gives ByteTokenizer; a directory
// holding encoder.json and vocab.bpe gives Gpt2BpeTokenizer; a tokenizer.json
// file, or a directory holding one (and no encoder.json), gives HfTokenizer.
Result<std::unique_ptr<Tokenizer>> MakeTokenizer(const std::string& spec);

}  // namespace zinf::data
