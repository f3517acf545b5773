#include "data/tokenizer.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "common/json_text.h"
#include "data/hf_tokenizer.h"
#include "data/unicode_classes.h"

namespace zinf::data {

std::vector<int32_t> Tokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> out;
  EncodeStream(text, size_t{1} << 16,
               [&](std::span<const int32_t> ids) { out.insert(out.end(), ids.begin(), ids.end()); });
  return out;
}

std::vector<size_t> Tokenizer::SharedPrefixLengths(std::string_view text, std::span<const int32_t> ids,
                                                   std::span<const size_t> cuts) const {
  std::vector<size_t> out;
  out.reserve(cuts.size());
  for (size_t cut : cuts) {
    const std::vector<int32_t> prefix = Encode(text.substr(0, std::min(cut, text.size())));
    const size_t n = std::min(prefix.size(), ids.size());
    size_t i = 0;
    while (i < n && prefix[i] == ids[i]) ++i;
    out.push_back(i);
  }
  return out;
}

// ---- ByteTokenizer ---------------------------------------------------------------

void ByteTokenizer::EncodeStream(std::string_view text, size_t chunk_tokens,
                                 const std::function<void(std::span<const int32_t>)>& sink) const {
  chunk_tokens = std::max<size_t>(chunk_tokens, 1);
  std::vector<int32_t> buf(std::min(chunk_tokens, text.size()));
  for (size_t pos = 0; pos < text.size(); pos += chunk_tokens) {
    const size_t n = std::min(chunk_tokens, text.size() - pos);
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<uint8_t>(text[pos + i]);
    sink(std::span<const int32_t>(buf.data(), n));
  }
}

Result<std::string> ByteTokenizer::Decode(std::span<const int32_t> tokens) const {
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 255) {
      return OutOfRange("byte tokenizer: token " + std::to_string(i) + " has id " + std::to_string(tokens[i]) +
                        ", outside [0, 256)");
    }
    out[i] = static_cast<char>(tokens[i]);
  }
  return out;
}

// ---- GPT-2 byte alphabet -------------------------------------------------------

namespace {

// bytes_to_unicode(): '!'..'~', '¡'..'¬', '®'..'ÿ' map to themselves; the
// remaining bytes, in increasing order, to U+0100, U+0101, ...
std::array<int32_t, 256> MakeByteToCodePoint() {
  std::array<int32_t, 256> cp{};
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  int next = 256;
  for (int b = 0; b < 256; ++b) cp[b] = printable(b) ? b : next++;
  return cp;
}
const std::array<int32_t, 256>& ByteToCodePoint() {
  static const std::array<int32_t, 256> table = MakeByteToCodePoint();
  return table;
}

enum class CharClass { kLetter, kNumber, kSpace, kOther };

struct ClassifiedChar {
  CharClass cls;
  int length;
};

ClassifiedChar Classify(std::string_view text, size_t pos) {
  const Utf8Char c = DecodeUtf8(text, pos);
  if (c.code_point < 0) return {CharClass::kOther, 1};
  if (IsWhiteSpace(c.code_point)) return {CharClass::kSpace, c.length};
  if (IsLetter(c.code_point)) return {CharClass::kLetter, c.length};
  if (IsNumber(c.code_point)) return {CharClass::kNumber, c.length};
  return {CharClass::kOther, c.length};
}

// End of the run of `cls` characters starting at pos.
size_t RunEnd(std::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    const ClassifiedChar c = Classify(text, pos);
    if (c.cls != cls) break;
    pos += c.length;
  }
  return pos;
}

// GPT-2's pattern as a scanner; see tokenizer.h. Calls piece(begin, end).
template <class F>
void ScanPieces(std::string_view text, F&& piece) {
  static constexpr std::string_view kContractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (text[i] == '\'') {
      bool matched = false;
      for (std::string_view c : kContractions) {
        if (text.substr(i).starts_with(c)) {
          piece(i, i + c.size());
          i += c.size();
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    const ClassifiedChar c = Classify(text, i);
    if (c.cls != CharClass::kSpace) {  // \p{L}+ | \p{N}+ | [^\s\p{L}\p{N}]+
      const size_t end = RunEnd(text, i, c.cls);
      piece(i, end);
      i = end;
      continue;
    }
    if (text[i] == ' ' && i + 1 < n) {  // " ?X+" with the optional space present
      const ClassifiedChar next = Classify(text, i + 1);
      if (next.cls != CharClass::kSpace) {
        const size_t end = RunEnd(text, i + 1, next.cls);
        piece(i, end);
        i = end;
        continue;
      }
    }
    // \s+(?!\S) | \s+ : a whitespace run followed by a non-space keeps its last
    // character for the next piece (where " word" may claim it).
    size_t j = i, last = i;
    while (j < n) {
      const ClassifiedChar w = Classify(text, j);
      if (w.cls != CharClass::kSpace) break;
      last = j;
      j += w.length;
    }
    const size_t end = (j < n && last > i) ? last : j;
    piece(i, end);
    i = end;
  }
}

}  // namespace

std::string Gpt2BpeTokenizer::ByteToUnicode(uint8_t byte) {
  std::string s;
  EncodeUtf8(ByteToCodePoint()[byte], &s);
  return s;
}

std::vector<std::string_view> Gpt2BpeTokenizer::PreTokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  ScanPieces(text, [&](size_t b, size_t e) { pieces.push_back(text.substr(b, e - b)); });
  return pieces;
}

// ---- Gpt2BpeTokenizer --------------------------------------------------------------

struct Gpt2BpeTokenizer::Impl {
  // What each id decodes to, by id: a map, since a file may give sparse ids
  // (2147483646) and nothing may be sized by the largest.
  std::unordered_map<int32_t, std::string> id_bytes;
  int64_t id_limit = 0;  // one past the largest id
  std::array<int32_t, 256> byte_token{};
  struct Merge {
    int32_t rank, merged;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left << 32 | right) -> merge
  uint64_t fingerprint = 0;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // GPT-2's bpe(): repeatedly take the lowest-ranked adjacent pair and merge
  // every non-overlapping occurrence of it, left to right. Done here with a
  // heap over a linked list, O(n log n) instead of O(n^2), so a long piece
  // (a run of punctuation, a base64 blob) stays cheap. All occurrences of one
  // rank are merged before pairs the merges create are considered, as in
  // GPT-2's loop.
  void Bpe(std::string_view piece, std::vector<int32_t>* out) const {
    const int n = static_cast<int>(piece.size());
    std::vector<int32_t> id(n), prev(n), next(n);
    for (int i = 0; i < n; ++i) {
      id[i] = byte_token[static_cast<uint8_t>(piece[i])];
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    using Entry = std::pair<int32_t, int32_t>;  // (rank, position of the left symbol)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    auto push = [&](int pos) {
      if (pos < 0 || next[pos] < 0) return;
      auto it = merges.find(Key(id[pos], id[next[pos]]));
      if (it != merges.end()) heap.push({it->second.rank, pos});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    std::vector<bool> alive(n, true);
    std::vector<int> created;
    while (!heap.empty()) {
      const int32_t rank = heap.top().first;
      created.clear();
      while (!heap.empty() && heap.top().first == rank) {
        const int pos = heap.top().second;
        heap.pop();
        if (!alive[pos] || next[pos] < 0) continue;
        auto it = merges.find(Key(id[pos], id[next[pos]]));
        if (it == merges.end() || it->second.rank != rank) continue;  // stale entry
        const int right = next[pos];
        id[pos] = it->second.merged;
        alive[right] = false;
        next[pos] = next[right];
        if (next[pos] >= 0) prev[next[pos]] = pos;
        created.push_back(pos);
      }
      for (int pos : created) {
        if (!alive[pos]) continue;
        push(prev[pos]);
        push(pos);
      }
    }
    for (int i = 0; i >= 0 && i < n; i = next[i]) out->push_back(id[i]);
  }

  void EncodePiece(std::string_view piece, std::vector<int32_t>* out) const {
    if (piece.size() == 1) {
      out->push_back(byte_token[static_cast<uint8_t>(piece[0])]);
      return;
    }
    constexpr size_t kMaxCachedPieceBytes = 64;
    constexpr size_t kMaxCacheEntries = size_t{1} << 20;
    const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mu);
      auto it = cache.find(std::string(piece));
      if (it != cache.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t first = out->size();
    Bpe(piece, out);
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mu);
      if (cache.size() >= kMaxCacheEntries) cache.clear();
      cache.emplace(std::string(piece), std::vector<int32_t>(out->begin() + first, out->end()));
    }
  }
};

Gpt2BpeTokenizer::Gpt2BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2BpeTokenizer::~Gpt2BpeTokenizer() = default;

int64_t Gpt2BpeTokenizer::VocabSize() const { return impl_->id_limit; }
uint64_t Gpt2BpeTokenizer::Fingerprint() const { return impl_->fingerprint; }

namespace {

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("read " + path + " failed");
  return ss.str();
}

}  // namespace

Result<std::unique_ptr<Gpt2BpeTokenizer>> Gpt2BpeTokenizer::Load(const std::string& dir) {
  ZINF_ASSIGN_OR_RETURN(std::string encoder, ReadWholeFile(dir + "/encoder.json"));
  ZINF_ASSIGN_OR_RETURN(std::string bpe, ReadWholeFile(dir + "/vocab.bpe"));
  return FromStrings(encoder, bpe, dir);
}

Result<std::unique_ptr<Gpt2BpeTokenizer>> Gpt2BpeTokenizer::FromStrings(std::string_view encoder_json,
                                                                        std::string_view vocab_bpe,
                                                                        const std::string& origin) {
  const std::string enc_name = origin + "/encoder.json";
  const std::string bpe_name = origin + "/vocab.bpe";
  auto parsed = ParseJsonText(encoder_json, enc_name);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json j = std::move(parsed->value);
  if (!j.is_object()) return InvalidArgument(enc_name + ": expected a JSON object of token string -> id");

  // unicode_to_byte: the inverse of bytes_to_unicode.
  std::unordered_map<int32_t, uint8_t> cp_to_byte;
  for (int b = 0; b < 256; ++b) cp_to_byte[ByteToCodePoint()[b]] = static_cast<uint8_t>(b);

  auto impl = std::make_unique<Impl>();
  std::unordered_map<std::string, int32_t> str_to_id;
  str_to_id.reserve(j.size());
  int64_t max_id = -1;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_number_integer()) {
      return InvalidArgument(enc_name + ": token '" + it.key() + "' maps to " + JsonSnippet(it.value()) +
                             ", expected an integer id");
    }
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= (int64_t{1} << 31) - 1) {
      return InvalidArgument(enc_name + ": token '" + it.key() + "' has id " + std::to_string(id) +
                             ", outside [0, 2^31 - 1)");
    }
    if (it.key().empty()) return InvalidArgument(enc_name + ": the empty string is not a token");
    str_to_id.emplace(it.key(), static_cast<int32_t>(id));
    max_id = std::max(max_id, id);
  }
  if (max_id < 0) return InvalidArgument(enc_name + ": the vocabulary is empty");
  impl->id_limit = max_id + 1;
  impl->id_bytes.reserve(str_to_id.size());
  for (const auto& [str, id] : str_to_id) {
    if (impl->id_bytes.count(id)) {
      return InvalidArgument(enc_name + ": id " + std::to_string(id) + " is given to two tokens");
    }
    // Tokens spelled in the byte alphabet decode to their bytes; any other
    // (a special token with characters outside it) decodes to its UTF-8 text.
    std::string bytes;
    bool in_alphabet = true;
    for (size_t pos = 0; pos < str.size();) {
      const Utf8Char c = DecodeUtf8(str, pos);
      auto b = cp_to_byte.find(c.code_point);
      if (c.code_point < 0 || b == cp_to_byte.end()) {
        in_alphabet = false;
        break;
      }
      bytes.push_back(static_cast<char>(b->second));
      pos += c.length;
    }
    impl->id_bytes[id] = in_alphabet ? std::move(bytes) : str;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = str_to_id.find(ByteToUnicode(static_cast<uint8_t>(b)));
    if (it == str_to_id.end()) {
      return InvalidArgument(enc_name + ": byte " + std::to_string(b) + " ('" + ByteToUnicode(static_cast<uint8_t>(b)) +
                             "' in GPT-2's byte alphabet) has no token; all 256 are needed to encode any text");
    }
    impl->byte_token[b] = it->second;
  }

  // vocab.bpe: an optional "#version" line, then one merge "left right" per line.
  int32_t rank = 0;
  size_t line_no = 0;
  for (size_t pos = 0; pos < vocab_bpe.size();) {
    size_t eol = vocab_bpe.find('\n', pos);
    if (eol == std::string_view::npos) eol = vocab_bpe.size();
    std::string_view line = vocab_bpe.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#"))) continue;
    const std::string where = bpe_name + " line " + std::to_string(line_no);
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      return InvalidArgument(where + ": expected two tokens separated by one space, got '" + std::string(line) + "'");
    }
    const std::string left(line.substr(0, space)), right(line.substr(space + 1));
    auto l = str_to_id.find(left), r = str_to_id.find(right), m = str_to_id.find(left + right);
    if (l == str_to_id.end() || r == str_to_id.end()) {
      return InvalidArgument(where + ": merge '" + std::string(line) + "': '" + (l == str_to_id.end() ? left : right) +
                             "' is not in encoder.json");
    }
    if (m == str_to_id.end()) {
      return InvalidArgument(where + ": merge '" + std::string(line) + "' produces '" + left + right +
                             "', which is not in encoder.json");
    }
    if (!impl->merges.emplace(Impl::Key(l->second, r->second), Impl::Merge{rank, m->second}).second) {
      return InvalidArgument(where + ": merge '" + std::string(line) + "' is repeated");
    }
    ++rank;
  }

  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, encoder_json.data(), encoder_json.size());
  XXH3_64bits_update(st, "\0", 1);
  XXH3_64bits_update(st, vocab_bpe.data(), vocab_bpe.size());
  impl->fingerprint = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return std::unique_ptr<Gpt2BpeTokenizer>(new Gpt2BpeTokenizer(std::move(impl)));
}

void Gpt2BpeTokenizer::EncodeStream(std::string_view text, size_t chunk_tokens,
                                    const std::function<void(std::span<const int32_t>)>& sink) const {
  chunk_tokens = std::max<size_t>(chunk_tokens, 1);
  std::vector<int32_t> buf;
  buf.reserve(chunk_tokens + 64);
  ScanPieces(text, [&](size_t b, size_t e) {
    impl_->EncodePiece(text.substr(b, e - b), &buf);
    if (buf.size() >= chunk_tokens) {
      sink(buf);
      buf.clear();
    }
  });
  if (!buf.empty()) sink(buf);
}

Result<std::string> Gpt2BpeTokenizer::Decode(std::span<const int32_t> tokens) const {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i];
    auto it = impl_->id_bytes.find(id);
    if (it == impl_->id_bytes.end()) {
      return OutOfRange("gpt2-bpe tokenizer: token " + std::to_string(i) + " has id " + std::to_string(id) +
                        ", which is not in the vocabulary (size " + std::to_string(VocabSize()) + ")");
    }
    out += it->second;
  }
  return out;
}

Result<std::unique_ptr<Tokenizer>> MakeTokenizer(const std::string& spec) {
  if (spec.empty() || spec == "byte") return std::unique_ptr<Tokenizer>(std::make_unique<ByteTokenizer>());
  std::error_code ec;
  // A path naming a .json file is a tokenizer.json even when missing, so the
  // error names it rather than a GPT-2 directory.
  const bool is_file = std::filesystem::is_regular_file(spec, ec) ||
                       (spec.ends_with(".json") && !std::filesystem::is_directory(spec, ec));
  const bool dir_has_json = !is_file && !std::filesystem::exists(spec + "/encoder.json", ec) &&
                            std::filesystem::is_regular_file(spec + "/tokenizer.json", ec);
  if (is_file || dir_has_json) {
    auto hf = HfTokenizer::Load(is_file ? spec : spec + "/tokenizer.json");
    if (!hf.ok()) return std::move(hf).status().WithContext("--tokenizer " + spec);
    return std::unique_ptr<Tokenizer>(std::move(hf).value());
  }
  auto bpe = Gpt2BpeTokenizer::Load(spec);
  if (!bpe.ok()) return std::move(bpe).status().WithContext("--tokenizer " + spec);
  return std::unique_ptr<Tokenizer>(std::move(bpe).value());
}

}  // namespace zinf::data
