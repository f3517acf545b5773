// HfTokenizer: a Hugging Face tokenizer.json (the `tokenizers` library's
// format) behind zinf's Tokenizer interface. Encoding follows the library's
// pipeline, for one text without a pair and without the post-processor:
//   1. added tokens (added_tokens) are split out of the raw text, leftmost
//      longest match first; lstrip/rstrip drop the whitespace beside a match,
//      single_word matches only between non-word characters. Each becomes its
//      id, special or not. (A token with "normalized": true is matched in the
//      raw text too, where the library matches it after normalization; the
//      same whenever the normalizer leaves its text unchanged.)
//   2. each stretch of text between them goes through the normalizer (NFC,
//      Prepend, Replace with a string pattern, or a Sequence of them) and the
//      pre-tokenizer (Split with a known regex, see hf_pretokenize.h;
//      ByteLevel with or without its own regex; Metaspace; or a Sequence);
//   3. each pre-token goes through the BPE model (hf_bpe.h).
// The post-processor (a BOS token, say) is never applied: Encode gives the
// ids of the text, and a caller adds framing tokens itself.
// Decoding maps ids to their token texts and runs the decoder (ByteLevel,
// Metaspace, Replace, ByteFallback, Fuse, Strip, or a Sequence); without a
// decoder the texts are joined by spaces, as in the library. Where the
// library writes U+FFFD for <0xNN> tokens that are not valid UTF-8, Decode
// writes the bytes themselves, so that any byte string round-trips through a
// byte-fallback model.
// A file zinf cannot honour (another model type, an unknown normalizer,
// pre-tokenizer, decoder or split regex, a BPE option zinf lacks) is an
// InvalidArgument naming the JSON key, e.g.
//   tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: unsupported split regex '...'
//
// Thread-safety: Encode and Decode are const and may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "data/tokenizer.h"
#include "zinf/status.h"

namespace zinf::data {

class HfTokenizer final : public Tokenizer {
 public:
  // Reads a tokenizer.json file. Errors name the path and the key.
  static Result<std::unique_ptr<HfTokenizer>> Load(const std::string& path);
  // The same from the file's contents; errors start with `origin`.
  static Result<std::unique_ptr<HfTokenizer>> FromJson(std::string_view json,
                                                       const std::string& origin = "tokenizer.json");
  ~HfTokenizer() override;

  std::string Name() const override { return "hf-bpe"; }
  // One past the largest id of the vocabulary and the added tokens.
  int64_t VocabSize() const override;
  // A hash of the file's bytes.
  uint64_t Fingerprint() const override;
  void EncodeStream(std::string_view text, size_t chunk_tokens,
                    const std::function<void(std::span<const int32_t>)>& sink) const override;
  // kOutOfRange naming the first id that is neither in the vocabulary nor an
  // added token.
  Result<std::string> Decode(std::span<const int32_t> tokens) const override;
  // Linear in the text: a prefix's ids up to the last added token before the
  // cut are the whole text's, so only the stretch after that token is
  // encoded again. (Where a single_word added token ending at the cut could
  // split the prefix differently, that cut is encoded whole.)
  std::vector<size_t> SharedPrefixLengths(std::string_view text, std::span<const int32_t> ids,
                                          std::span<const size_t> cuts) const override;

  // The id of a token by its text (vocabulary or added token, as spelled in
  // the file), or -1.
  int32_t TokenToId(std::string_view token) const;
  int32_t TokenId(std::string_view token) const override { return TokenToId(token); }
  // Whether `id` is an added token marked "special" (BOS, EOS, chat markers).
  bool IsSpecial(int32_t id) const;

 private:
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::data
