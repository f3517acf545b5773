#include "data/hf_tokenizer.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "common/json_text.h"
#include "data/hf_bpe.h"
#include "data/hf_pretokenize.h"
#include "data/unicode_classes.h"

namespace zinf::data {
namespace {

using Json = nlohmann::json;

enum class NormKind { kNfc, kPrepend, kReplace };
struct NormStep {
  NormKind kind = NormKind::kNfc;
  std::string text;     // Prepend: what to prepend; Replace: the pattern
  std::string content;  // Replace: the replacement
};

// Metaspace's prepend_scheme: prefix the replacement to every pre-token, to
// the one at the start of the text only, or never.
enum class PrependScheme { kAlways, kFirst, kNever };

enum class PreKind { kSplit, kByteLevel, kMetaspace };
struct PreStep {
  PreKind kind = PreKind::kSplit;
  SplitPattern pattern = SplitPattern::kGpt2;  // kSplit
  bool add_prefix_space = false;               // kByteLevel
  bool use_regex = false;                      // kByteLevel
  std::string replacement;                     // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = false;  // kMetaspace
};

enum class DecKind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
struct DecStep {
  DecKind kind = DecKind::kFuse;
  std::string text;     // Metaspace: the replacement; Replace: the pattern; Strip: the content
  std::string content;  // Replace: the replacement
  PrependScheme prepend = PrependScheme::kAlways;
  int64_t start = 0, stop = 0;  // Strip
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

Status Bad(const std::string& where, const std::string& what) { return InvalidArgument(where + ": " + what); }

// Limits on what a file may ask of the pipeline, each far above any real
// tokenizer (Llama 2's: 2 normalizer steps, 4 decoder steps, strings of one
// character). Without them a file of a few bytes could make encoding
// exponential (a Replace that doubles the text, repeated) or recurse a
// thousand pre-tokenizers deep.
constexpr size_t kMaxSteps = 32;            // per normalizer, pre-tokenizer, decoder
constexpr size_t kMaxPipelineString = 256;  // bytes of a Prepend, Replace or Metaspace string
constexpr double kMaxGrowth = 256;          // how many times longer the steps may make a text

Status CheckStepCount(size_t steps, const std::string& where) {
  if (steps <= kMaxSteps) return Status::Ok();
  return Bad(where, std::to_string(steps) + " steps; zinf takes at most " + std::to_string(kMaxSteps));
}
Status CheckPipelineString(const std::string& s, const std::string& where) {
  if (s.size() <= kMaxPipelineString) return Status::Ok();
  return Bad(where, "a string of " + std::to_string(s.size()) + " bytes; zinf takes at most " +
                        std::to_string(kMaxPipelineString));
}

std::string Key(const std::string& where, const std::string& key) { return where.empty() ? key : where + "." + key; }
std::string Index(const std::string& where, size_t i) { return where + "[" + std::to_string(i) + "]"; }

// Typed getters: a missing key or null gives the default.
Result<bool> GetBool(const Json& j, const std::string& key, const std::string& where, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) return Bad(Key(where, key), "expected true or false, got " + JsonSnippet(*it));
  return it->get<bool>();
}
Result<std::string> GetString(const Json& j, const std::string& key, const std::string& where,
                              std::optional<std::string> dflt = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (dflt) return *dflt;
    return Bad(Key(where, key), "missing (expected a string)");
  }
  if (!it->is_string()) return Bad(Key(where, key), "expected a string, got " + JsonSnippet(*it));
  return it->get<std::string>();
}
Result<int64_t> GetInt(const Json& j, const std::string& key, const std::string& where, int64_t dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number_integer()) return Bad(Key(where, key), "expected an integer, got " + JsonSnippet(*it));
  return it->get<int64_t>();
}
Result<const Json*> GetArray(const Json& j, const std::string& key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return Bad(Key(where, key), "expected an array");
  return &*it;
}
Result<std::string> GetType(const Json& j, const std::string& where) {
  if (!j.is_object()) return Bad(where, "expected an object, got " + JsonSnippet(j, 80));
  return GetString(j, "type", where);
}

// The String form of a Replace pattern; the Regex form is not supported.
Result<std::string> GetStringPattern(const Json& j, const std::string& where) {
  const std::string key = Key(where, "pattern");
  auto it = j.find("pattern");
  if (it == j.end() || !it->is_object()) return Bad(key, "expected {\"String\": ...}");
  if (it->contains("Regex")) {
    return Bad(Key(key, "Regex"), "regex patterns are not supported here (only {\"String\": ...})");
  }
  ZINF_ASSIGN_OR_RETURN(std::string s, GetString(*it, "String", key));
  if (s.empty()) return Bad(Key(key, "String"), "the pattern is empty");
  return s;
}

Result<PrependScheme> GetPrependScheme(const Json& j, const std::string& where) {
  auto it = j.find("prepend_scheme");
  if (it != j.end() && !it->is_null()) {
    const std::string s = it->is_string() ? it->get<std::string>() : JsonSnippet(*it);
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    return Bad(Key(where, "prepend_scheme"), "unknown scheme '" + s + "' (expected always, first or never)");
  }
  // Older files say add_prefix_space instead.
  ZINF_ASSIGN_OR_RETURN(bool add, GetBool(j, "add_prefix_space", where, true));
  return add ? PrependScheme::kAlways : PrependScheme::kNever;
}

Status ParseNormalizer(const Json& j, const std::string& where, std::vector<NormStep>* steps) {
  if (j.is_null()) return Status::Ok();
  ZINF_ASSIGN_OR_RETURN(std::string type, GetType(j, where));
  if (type == "Sequence") {
    ZINF_ASSIGN_OR_RETURN(const Json* list, GetArray(j, "normalizers", where));
    ZINF_RETURN_IF_ERROR(CheckStepCount(steps->size() + list->size(), Key(where, "normalizers")));
    for (size_t i = 0; i < list->size(); ++i) {
      ZINF_RETURN_IF_ERROR(ParseNormalizer((*list)[i], Index(Key(where, "normalizers"), i), steps));
    }
  } else if (type == "NFC") {
    steps->emplace_back().kind = NormKind::kNfc;
  } else if (type == "Prepend") {
    ZINF_ASSIGN_OR_RETURN(std::string prepend, GetString(j, "prepend", where));
    ZINF_RETURN_IF_ERROR(CheckPipelineString(prepend, Key(where, "prepend")));
    NormStep& step = steps->emplace_back();
    step.kind = NormKind::kPrepend;
    step.text = std::move(prepend);
  } else if (type == "Replace") {
    ZINF_ASSIGN_OR_RETURN(std::string pattern, GetStringPattern(j, where));
    ZINF_ASSIGN_OR_RETURN(std::string content, GetString(j, "content", where));
    ZINF_RETURN_IF_ERROR(CheckPipelineString(pattern, Key(where, "pattern")));
    ZINF_RETURN_IF_ERROR(CheckPipelineString(content, Key(where, "content")));
    NormStep& step = steps->emplace_back();
    step.kind = NormKind::kReplace;
    step.text = std::move(pattern);
    step.content = std::move(content);
  } else {
    return Bad(Key(where, "type"), "unknown normalizer '" + type + "' (zinf knows NFC, Prepend, Replace, Sequence)");
  }
  return CheckStepCount(steps->size(), where);
}

Status ParsePreTokenizer(const Json& j, const std::string& where, std::vector<PreStep>* steps) {
  if (j.is_null()) return Status::Ok();
  ZINF_ASSIGN_OR_RETURN(std::string type, GetType(j, where));
  if (type == "Sequence") {
    ZINF_ASSIGN_OR_RETURN(const Json* list, GetArray(j, "pretokenizers", where));
    ZINF_RETURN_IF_ERROR(CheckStepCount(steps->size() + list->size(), Key(where, "pretokenizers")));
    for (size_t i = 0; i < list->size(); ++i) {
      ZINF_RETURN_IF_ERROR(ParsePreTokenizer((*list)[i], Index(Key(where, "pretokenizers"), i), steps));
    }
  } else if (type == "Split") {
    PreStep s;
    s.kind = PreKind::kSplit;
    const std::string key = Key(where, "pattern");
    auto it = j.find("pattern");
    if (it == j.end() || !it->is_object() || !it->contains("Regex")) {
      return Bad(key, "expected {\"Regex\": ...} (string patterns are not supported)");
    }
    ZINF_ASSIGN_OR_RETURN(std::string regex, GetString(*it, "Regex", key));
    auto pattern = RecognizeSplitRegex(regex);
    if (!pattern) {
      return Bad(Key(key, "Regex"),
                 "unsupported split regex '" + regex + "' (zinf knows the GPT-2, Llama 3 and Qwen2 patterns)");
    }
    s.pattern = *pattern;
    ZINF_ASSIGN_OR_RETURN(std::string behavior, GetString(j, "behavior", where, std::string("Isolated")));
    if (behavior != "Isolated") return Bad(Key(where, "behavior"), "unsupported '" + behavior + "' (only Isolated)");
    ZINF_ASSIGN_OR_RETURN(bool invert, GetBool(j, "invert", where, false));
    if (invert) return Bad(Key(where, "invert"), "true is not supported");
    steps->push_back(std::move(s));
  } else if (type == "ByteLevel") {
    PreStep s;
    s.kind = PreKind::kByteLevel;
    ZINF_ASSIGN_OR_RETURN(s.add_prefix_space, GetBool(j, "add_prefix_space", where, true));
    ZINF_ASSIGN_OR_RETURN(s.use_regex, GetBool(j, "use_regex", where, true));
    steps->push_back(std::move(s));
  } else if (type == "Metaspace") {
    PreStep s;
    s.kind = PreKind::kMetaspace;
    ZINF_ASSIGN_OR_RETURN(s.replacement, GetString(j, "replacement", where, std::string("\u2581")));
    if (s.replacement.empty()) return Bad(Key(where, "replacement"), "is empty");
    ZINF_RETURN_IF_ERROR(CheckPipelineString(s.replacement, Key(where, "replacement")));
    ZINF_ASSIGN_OR_RETURN(s.prepend, GetPrependScheme(j, where));
    ZINF_ASSIGN_OR_RETURN(s.split, GetBool(j, "split", where, true));
    steps->push_back(std::move(s));
  } else {
    return Bad(Key(where, "type"),
               "unknown pre-tokenizer '" + type + "' (zinf knows ByteLevel, Metaspace, Split, Sequence)");
  }
  return CheckStepCount(steps->size(), where);
}

Status ParseDecoder(const Json& j, const std::string& where, std::vector<DecStep>* steps) {
  if (j.is_null()) return Status::Ok();
  ZINF_ASSIGN_OR_RETURN(std::string type, GetType(j, where));
  if (type == "Sequence") {
    ZINF_ASSIGN_OR_RETURN(const Json* list, GetArray(j, "decoders", where));
    ZINF_RETURN_IF_ERROR(CheckStepCount(steps->size() + list->size(), Key(where, "decoders")));
    for (size_t i = 0; i < list->size(); ++i) {
      ZINF_RETURN_IF_ERROR(ParseDecoder((*list)[i], Index(Key(where, "decoders"), i), steps));
    }
  } else if (type == "ByteLevel") {
    steps->emplace_back().kind = DecKind::kByteLevel;
  } else if (type == "Metaspace") {
    DecStep s;
    s.kind = DecKind::kMetaspace;
    ZINF_ASSIGN_OR_RETURN(s.text, GetString(j, "replacement", where, std::string("\u2581")));
    if (s.text.empty()) return Bad(Key(where, "replacement"), "is empty");
    ZINF_RETURN_IF_ERROR(CheckPipelineString(s.text, Key(where, "replacement")));
    ZINF_ASSIGN_OR_RETURN(s.prepend, GetPrependScheme(j, where));
    steps->push_back(std::move(s));
  } else if (type == "Replace") {
    DecStep s;
    s.kind = DecKind::kReplace;
    ZINF_ASSIGN_OR_RETURN(s.text, GetStringPattern(j, where));
    ZINF_ASSIGN_OR_RETURN(s.content, GetString(j, "content", where));
    ZINF_RETURN_IF_ERROR(CheckPipelineString(s.text, Key(where, "pattern")));
    ZINF_RETURN_IF_ERROR(CheckPipelineString(s.content, Key(where, "content")));
    steps->push_back(std::move(s));
  } else if (type == "ByteFallback") {
    steps->emplace_back().kind = DecKind::kByteFallback;
  } else if (type == "Fuse") {
    steps->emplace_back().kind = DecKind::kFuse;
  } else if (type == "Strip") {
    DecStep s;
    s.kind = DecKind::kStrip;
    ZINF_ASSIGN_OR_RETURN(s.text, GetString(j, "content", where));
    if (s.text.empty()) return Bad(Key(where, "content"), "is empty");
    ZINF_RETURN_IF_ERROR(CheckPipelineString(s.text, Key(where, "content")));
    ZINF_ASSIGN_OR_RETURN(s.start, GetInt(j, "start", where, 0));
    ZINF_ASSIGN_OR_RETURN(s.stop, GetInt(j, "stop", where, 0));
    if (s.start < 0 || s.stop < 0) return Bad(where, "start and stop must be >= 0");
    steps->push_back(std::move(s));
  } else {
    return Bad(Key(where, "type"), "unknown decoder '" + type +
                                       "' (zinf knows ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, "
                                       "Sequence)");
  }
  return CheckStepCount(steps->size(), where);
}

// How many times longer the steps can make a text: each Replace by its
// content over its pattern, each Metaspace by its replacement (every space
// may become one); Prepend adds a bounded string and counts as one more time.
double Growth(size_t pattern_bytes, size_t content_bytes) {
  return std::max(1.0, static_cast<double>(content_bytes) / static_cast<double>(std::max<size_t>(pattern_bytes, 1)));
}
Status CheckGrowth(const std::vector<NormStep>& norm, const std::vector<PreStep>& pre,
                   const std::vector<DecStep>& dec) {
  double encode = 1, decode = 1;
  for (const NormStep& n : norm) {
    if (n.kind == NormKind::kReplace) encode *= Growth(n.text.size(), n.content.size());
    if (n.kind == NormKind::kPrepend) encode += 1;
  }
  for (const PreStep& p : pre) {
    if (p.kind == PreKind::kMetaspace) encode *= Growth(1, p.replacement.size()) + 1;
  }
  for (const DecStep& d : dec) {
    if (d.kind == DecKind::kReplace) decode *= Growth(d.text.size(), d.content.size());
  }
  if (encode > kMaxGrowth) {
    return Bad("normalizer", "its Replace, Prepend and Metaspace steps can make a text " + std::to_string(encode) +
                                 " times longer; zinf takes at most " + std::to_string(kMaxGrowth));
  }
  if (decode > kMaxGrowth) {
    return Bad("decoder", "its Replace steps can make a text " + std::to_string(decode) +
                              " times longer; zinf takes at most " + std::to_string(kMaxGrowth));
  }
  return Status::Ok();
}

Result<BpeConfig> ParseModel(const Json& j, bool byte_level) {
  const std::string where = "model";
  if (!j.is_object()) return Bad(where, "missing or not an object");
  ZINF_ASSIGN_OR_RETURN(std::string type, GetString(j, "type", where, std::string("BPE")));
  if (type != "BPE") return Bad(Key(where, "type"), "unknown model '" + type + "' (zinf reads BPE models)");
  auto dropout = j.find("dropout");
  if (dropout != j.end() && !dropout->is_null() && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return Bad(Key(where, "dropout"), JsonSnippet(*dropout) + " is not supported (only null)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    ZINF_ASSIGN_OR_RETURN(std::string v, GetString(j, key, where, std::string()));
    if (!v.empty()) return Bad(Key(where, key), "'" + v + "' is not supported (only null or \"\")");
  }
  BpeConfig config;
  config.byte_level = byte_level;
  ZINF_ASSIGN_OR_RETURN(config.byte_fallback, GetBool(j, "byte_fallback", where, false));
  ZINF_ASSIGN_OR_RETURN(config.ignore_merges, GetBool(j, "ignore_merges", where, false));
  ZINF_ASSIGN_OR_RETURN(config.fuse_unk, GetBool(j, "fuse_unk", where, false));
  auto unk = j.find("unk_token");
  if (unk != j.end() && !unk->is_null()) {
    if (!unk->is_string()) return Bad(Key(where, "unk_token"), "expected a string or null");
    config.unk_token = unk->get<std::string>();
  }
  auto vocab = j.find("vocab");
  if (vocab == j.end() || !vocab->is_object()) return Bad(Key(where, "vocab"), "expected an object of token -> id");
  config.vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer()) {
      return Bad(Key(where, "vocab"),
                 "token '" + it.key() + "' maps to " + JsonSnippet(it.value()) + ", expected an id");
    }
    config.vocab.emplace_back(it.key(), it.value().get<int64_t>());
  }
  ZINF_ASSIGN_OR_RETURN(const Json* merges, GetArray(j, "merges", where));
  config.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    // "left right" (older files) or ["left", "right"].
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size() || s.find(' ', space + 1) != s.npos) {
        return Bad(Index(Key(where, "merges"), i), "expected two tokens separated by one space, got '" + s + "'");
      }
      config.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      config.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return Bad(Index(Key(where, "merges"), i),
                 "expected \"left right\" or [\"left\", \"right\"], got " + JsonSnippet(m));
    }
  }
  return config;
}

Result<std::vector<AddedToken>> ParseAddedTokens(const Json& root) {
  std::vector<AddedToken> out;
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return out;
  if (!it->is_array()) return Bad("added_tokens", "expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    const std::string where = Index("added_tokens", i);
    if (!t.is_object()) return Bad(where, "expected an object");
    AddedToken a;
    ZINF_ASSIGN_OR_RETURN(a.content, GetString(t, "content", where));
    if (a.content.empty()) return Bad(Key(where, "content"), "is empty");
    ZINF_ASSIGN_OR_RETURN(int64_t id, GetInt(t, "id", where, -1));
    if (id < 0 || id >= (int64_t{1} << 31) - 1) return Bad(Key(where, "id"), "missing or outside [0, 2^31 - 1)");
    a.id = static_cast<int32_t>(id);
    ZINF_ASSIGN_OR_RETURN(a.special, GetBool(t, "special", where, false));
    ZINF_ASSIGN_OR_RETURN(a.lstrip, GetBool(t, "lstrip", where, false));
    ZINF_ASSIGN_OR_RETURN(a.rstrip, GetBool(t, "rstrip", where, false));
    ZINF_ASSIGN_OR_RETURN(a.single_word, GetBool(t, "single_word", where, false));
    ZINF_ASSIGN_OR_RETURN(a.normalized, GetBool(t, "normalized", where, false));
    out.push_back(std::move(a));
  }
  return out;
}

void ReplaceAll(std::string_view text, std::string_view from, std::string_view to, std::string* out) {
  out->clear();
  for (size_t pos = 0;;) {
    const size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) {
      out->append(text.substr(pos));
      return;
    }
    out->append(text.substr(pos, hit - pos));
    out->append(to);
    pos = hit + from.size();
  }
}

bool IsWordChar(int32_t cp) { return cp == '_' || (CodePointClass(cp) & (kClassLetter | kClassNumber)) != 0; }

// Byte length of the whitespace at the start / end of `s`.
size_t LeadingSpace(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const Utf8Char c = DecodeUtf8(s, pos);
    if (!IsWhiteSpace(c.code_point)) break;
    pos += c.length;
  }
  return pos;
}
size_t TrailingSpace(std::string_view s) {
  size_t pos = 0, end_of_text = 0;
  while (pos < s.size()) {
    const Utf8Char c = DecodeUtf8(s, pos);
    pos += c.length;
    if (!IsWhiteSpace(c.code_point)) end_of_text = pos;
  }
  return s.size() - end_of_text;
}

// The last code point before `pos` (-1 if none or invalid).
int32_t CodePointBefore(std::string_view s, size_t pos) {
  size_t start = pos;
  while (start > 0 && pos - start < 4) {
    --start;
    if ((static_cast<uint8_t>(s[start]) & 0xC0) != 0x80) break;
  }
  if (start == pos) return -1;
  const Utf8Char c = DecodeUtf8(s, start);
  return start + c.length == pos ? c.code_point : -1;
}

}  // namespace

struct HfTokenizer::Impl {
  std::unique_ptr<BpeModel> model;
  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre_tokenizers;
  std::vector<DecStep> decoders;
  bool has_decoder = false;
  bool byte_level_only_decoder = false;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::array<std::vector<size_t>, 256> added_by_first_byte;  // longest first
  int64_t vocab_size = 0;
  uint64_t fingerprint = 0;
  std::array<int16_t, 0x144> alphabet_byte{};  // byte-level alphabet code point -> byte, or -1

  struct Segment {
    size_t begin, end;
    int64_t added;  // index into `added`, or -1 for text
  };

  // Step 1: the added tokens' matches and the text between them, scanning
  // from `from` (the text before it is context for single_word only).
  void SplitAdded(std::string_view text, std::vector<Segment>* segments, size_t from = 0) const {
    std::vector<Segment> matches;
    for (size_t i = from; i < text.size();) {
      const auto& candidates = added_by_first_byte[static_cast<uint8_t>(text[i])];
      bool found = false;
      for (size_t k : candidates) {
        const AddedToken& a = added[k];
        if (text.compare(i, a.content.size(), a.content) != 0) continue;
        const size_t end = i + a.content.size();
        if (a.single_word && ((i > 0 && IsWordChar(CodePointBefore(text, i))) ||
                              (end < text.size() && IsWordChar(DecodeUtf8(text, end).code_point)))) {
          continue;
        }
        matches.push_back({i, end, static_cast<int64_t>(k)});
        i = end;
        found = true;
        break;
      }
      if (!found) ++i;
    }
    size_t pos = from;
    for (size_t m = 0; m <= matches.size(); ++m) {
      size_t begin = pos, end = m < matches.size() ? matches[m].begin : text.size();
      if (m > 0 && added[matches[m - 1].added].rstrip) begin += LeadingSpace(text.substr(begin, end - begin));
      if (m < matches.size() && added[matches[m].added].lstrip) end -= TrailingSpace(text.substr(begin, end - begin));
      if (end > begin) segments->push_back({begin, end, -1});
      if (m < matches.size()) {
        segments->push_back(matches[m]);
        pos = matches[m].end;
      }
    }
  }

  // Steps 2 and 3 for one stretch of text, appending to *out and calling
  // flush() after each word; `at_start` when the stretch begins the text.
  void EncodeText(std::string_view text, bool at_start, std::vector<int32_t>* out,
                  const std::function<void()>& flush) const {
    std::string normalized, scratch;
    std::string_view s = text;
    for (const NormStep& n : normalizers) {
      switch (n.kind) {
        case NormKind::kNfc:
          if (IsNfcQuickSafe(s)) continue;
          scratch = NfcNormalize(s);
          break;
        case NormKind::kPrepend:
          if (s.empty()) continue;
          scratch = n.text;
          scratch.append(s);
          break;
        case NormKind::kReplace:
          if (s.find(n.text) == std::string_view::npos) continue;
          ReplaceAll(s, n.text, n.content, &scratch);
          break;
      }
      normalized.swap(scratch);
      s = normalized;
    }
    if (s.empty()) return;
    const std::function<void(std::string_view)> word = [&](std::string_view w) {
      model->EncodeWord(w, out);
      flush();
    };
    PreTokenize(0, s, at_start, word);
  }

  // Pre-tokenizer step `step` on one piece, depth first: each piece it
  // makes goes through the later steps and into `word` before the next is
  // made, so nothing grows with the text. `at_start`: the piece begins the
  // whole text (Metaspace's "first").
  void PreTokenize(size_t step, std::string_view piece, bool at_start,
                   const std::function<void(std::string_view)>& word) const {
    if (step == pre_tokenizers.size()) {
      word(piece);
      return;
    }
    const PreStep& p = pre_tokenizers[step];
    bool first = true;
    const std::function<void(std::string_view)> next = [&](std::string_view sub) {
      PreTokenize(step + 1, sub, at_start && first, word);
      first = false;
    };
    switch (p.kind) {
      case PreKind::kSplit:
        SplitByPattern(p.pattern, piece, next);
        return;
      case PreKind::kByteLevel: {
        std::string prefixed;
        if (p.add_prefix_space && !piece.starts_with(' ')) {
          prefixed = " " + std::string(piece);
          piece = prefixed;
        }
        if (p.use_regex) {
          SplitByPattern(SplitPattern::kGpt2, piece, next);
        } else {
          next(piece);
        }
        return;
      }
      case PreKind::kMetaspace: {
        std::string m;
        ReplaceAll(piece, " ", p.replacement, &m);
        const bool prepend = p.prepend == PrependScheme::kAlways || (p.prepend == PrependScheme::kFirst && at_start);
        if (prepend && !std::string_view(m).starts_with(p.replacement)) m.insert(0, p.replacement);
        const std::string_view v = m;
        if (!p.split) {
          next(v);
          return;
        }
        // Split before each replacement, which starts the next pre-token.
        size_t begin = 0;
        for (size_t hit = v.find(p.replacement, 1); hit != std::string_view::npos;
             hit = v.find(p.replacement, hit + 1)) {
          if (hit > begin) next(v.substr(begin, hit - begin));
          begin = hit;
        }
        if (begin < v.size()) next(v.substr(begin));
        return;
      }
    }
  }

  void AppendAlphabetBytes(std::string_view token, std::string* out) const {
    for (size_t pos = 0; pos < token.size();) {
      const Utf8Char c = DecodeUtf8(token, pos);
      if (c.code_point >= 0 && c.code_point < static_cast<int32_t>(alphabet_byte.size()) &&
          alphabet_byte[c.code_point] >= 0) {
        out->push_back(static_cast<char>(alphabet_byte[c.code_point]));
      } else {
        out->append(token.substr(pos, c.length));
      }
      pos += c.length;
    }
  }

  // The decoder chain over token texts, as the library runs it.
  std::string RunDecoders(std::vector<std::string> tokens, std::vector<bool> is_added) const {
    if (!has_decoder) {
      std::string out;
      for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return out;
    }
    for (const DecStep& d : decoders) {
      std::vector<std::string> next;
      switch (d.kind) {
        case DecKind::kByteLevel:
          for (size_t i = 0; i < tokens.size(); ++i) {
            std::string s;
            if (is_added[i]) {
              s = tokens[i];
            } else {
              AppendAlphabetBytes(tokens[i], &s);
            }
            next.push_back(std::move(s));
          }
          break;
        case DecKind::kMetaspace:
          for (size_t i = 0; i < tokens.size(); ++i) {
            std::string s;
            ReplaceAll(tokens[i], d.text, " ", &s);
            if (i == 0 && d.prepend != PrependScheme::kNever && s.starts_with(' ')) s.erase(0, 1);
            next.push_back(std::move(s));
          }
          break;
        case DecKind::kReplace:
          for (const std::string& t : tokens) {
            std::string s;
            ReplaceAll(t, d.text, d.content, &s);
            next.push_back(std::move(s));
          }
          break;
        case DecKind::kByteFallback: {
          std::string bytes;
          bool pending = false;
          for (const std::string& t : tokens) {
            auto hex = [](char c) {
              return c >= '0' && c <= '9'   ? c - '0'
                     : c >= 'a' && c <= 'f' ? c - 'a' + 10
                     : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                            : -1;
            };
            if (t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && hex(t[3]) >= 0 && hex(t[4]) >= 0) {
              bytes.push_back(static_cast<char>(hex(t[3]) * 16 + hex(t[4])));
              pending = true;
              continue;
            }
            if (pending) next.push_back(std::move(bytes)), bytes.clear(), pending = false;
            next.push_back(t);
          }
          if (pending) next.push_back(std::move(bytes));
          break;
        }
        case DecKind::kFuse: {
          std::string all;
          for (const std::string& t : tokens) all += t;
          next.push_back(std::move(all));
          break;
        }
        case DecKind::kStrip:
          for (const std::string& t : tokens) {
            std::string_view v = t;
            for (int64_t k = 0; k < d.start && v.starts_with(d.text); ++k) v.remove_prefix(d.text.size());
            for (int64_t k = 0; k < d.stop && v.ends_with(d.text); ++k) v.remove_suffix(d.text.size());
            next.emplace_back(v);
          }
          break;
      }
      // Only ByteLevel looks at which tokens were added ones; after a step
      // that merges or splits tokens the flags no longer line up.
      if (next.size() != is_added.size()) is_added.assign(next.size(), false);
      tokens.swap(next);
    }
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }
};

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::~HfTokenizer() = default;

int64_t HfTokenizer::VocabSize() const { return impl_->vocab_size; }
uint64_t HfTokenizer::Fingerprint() const { return impl_->fingerprint; }

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("read " + path + " failed");
  return FromJson(ss.str(), path);
}

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(std::string_view json, const std::string& origin) {
  auto parsed = ParseJsonText(json, origin);
  if (!parsed.ok()) return parsed.status();
  const Json root = std::move(parsed->value);
  if (!root.is_object()) return InvalidArgument(origin + ": expected a JSON object");
  auto impl = std::make_unique<Impl>();
  auto parse = [&]() -> Status {
    static const Json kNull;
    auto member = [&](const char* key) -> const Json& {
      auto it = root.find(key);
      return it == root.end() ? kNull : *it;
    };
    ZINF_RETURN_IF_ERROR(ParseNormalizer(member("normalizer"), "normalizer", &impl->normalizers));
    ZINF_RETURN_IF_ERROR(ParsePreTokenizer(member("pre_tokenizer"), "pre_tokenizer", &impl->pre_tokenizers));
    ZINF_RETURN_IF_ERROR(ParseDecoder(member("decoder"), "decoder", &impl->decoders));
    ZINF_RETURN_IF_ERROR(CheckGrowth(impl->normalizers, impl->pre_tokenizers, impl->decoders));
    impl->has_decoder = !member("decoder").is_null();
    impl->byte_level_only_decoder = impl->decoders.size() == 1 && impl->decoders[0].kind == DecKind::kByteLevel;
    const bool byte_level = std::any_of(impl->pre_tokenizers.begin(), impl->pre_tokenizers.end(),
                                        [](const PreStep& p) { return p.kind == PreKind::kByteLevel; });
    ZINF_ASSIGN_OR_RETURN(BpeConfig config, ParseModel(member("model"), byte_level));
    auto model = BpeModel::Create(std::move(config));
    if (!model.ok()) return InvalidArgument("model." + model.status().message());
    impl->model = std::move(model).value();
    ZINF_ASSIGN_OR_RETURN(impl->added, ParseAddedTokens(root));
    return Status::Ok();
  };
  if (Status s = parse(); !s.ok()) return s.WithContext(origin);

  impl->vocab_size = impl->model->IdLimit();
  for (size_t k = 0; k < impl->added.size(); ++k) {
    const AddedToken& a = impl->added[k];
    impl->added_by_id[a.id] = k;
    impl->added_by_first_byte[static_cast<uint8_t>(a.content[0])].push_back(k);
    impl->vocab_size = std::max<int64_t>(impl->vocab_size, int64_t{a.id} + 1);
  }
  for (auto& list : impl->added_by_first_byte) {
    std::stable_sort(list.begin(), list.end(),
                     [&](size_t a, size_t b) { return impl->added[a].content.size() > impl->added[b].content.size(); });
  }
  impl->alphabet_byte.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const int32_t cp = DecodeUtf8(Gpt2BpeTokenizer::ByteToUnicode(static_cast<uint8_t>(b)), 0).code_point;
    impl->alphabet_byte[cp] = static_cast<int16_t>(b);
  }
  impl->fingerprint = XXH3_64bits(json.data(), json.size());
  return std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(impl)));
}

void HfTokenizer::EncodeStream(std::string_view text, size_t chunk_tokens,
                               const std::function<void(std::span<const int32_t>)>& sink) const {
  chunk_tokens = std::max<size_t>(chunk_tokens, 1);
  std::vector<Impl::Segment> segments;
  impl_->SplitAdded(text, &segments);
  std::vector<int32_t> buf;
  buf.reserve(chunk_tokens + 64);
  const std::function<void()> flush = [&] {
    if (buf.size() >= chunk_tokens) {
      sink(buf);
      buf.clear();
    }
  };
  for (const Impl::Segment& seg : segments) {
    if (seg.added >= 0) {
      buf.push_back(impl_->added[seg.added].id);
      flush();
    } else {
      impl_->EncodeText(text.substr(seg.begin, seg.end - seg.begin), seg.begin == 0, &buf, flush);
    }
  }
  if (!buf.empty()) sink(buf);
}

Result<std::string> HfTokenizer::Decode(std::span<const int32_t> tokens) const {
  const Impl& m = *impl_;
  auto added_index = [&](int32_t id) -> int64_t {
    auto it = m.added_by_id.find(id);
    return it == m.added_by_id.end() ? -1 : static_cast<int64_t>(it->second);
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!m.model->HasId(tokens[i]) && added_index(tokens[i]) < 0) {
      return OutOfRange("hf-bpe tokenizer: token " + std::to_string(i) + " has id " + std::to_string(tokens[i]) +
                        ", which is not in the vocabulary (size " + std::to_string(VocabSize()) + ")");
    }
  }
  if (m.byte_level_only_decoder) {
    std::string out;
    for (int32_t id : tokens) {
      const int64_t k = added_index(id);
      out += k >= 0 ? m.added[k].content : m.model->IdToBytes(id);
    }
    return out;
  }
  std::vector<std::string> texts;
  std::vector<bool> is_added;
  texts.reserve(tokens.size());
  for (int32_t id : tokens) {
    const int64_t k = added_index(id);
    texts.push_back(k >= 0 ? m.added[k].content : m.model->IdToToken(id));
    is_added.push_back(k >= 0);
  }
  return m.RunDecoders(std::move(texts), std::move(is_added));
}

std::vector<size_t> HfTokenizer::SharedPrefixLengths(std::string_view text, std::span<const int32_t> ids,
                                                     std::span<const size_t> cuts) const {
  const Impl& m = *impl_;
  const std::function<void()> no_flush = [] {};
  // The whole text's segments and the index of each one's first id.
  std::vector<Impl::Segment> segments;
  m.SplitAdded(text, &segments);
  std::vector<size_t> first_id(segments.size() + 1, 0);
  std::vector<int32_t> scratch;
  for (size_t k = 0; k < segments.size(); ++k) {
    size_t count = 1;
    if (segments[k].added < 0) {
      scratch.clear();
      m.EncodeText(text.substr(segments[k].begin, segments[k].end - segments[k].begin), segments[k].begin == 0,
                   &scratch, no_flush);
      count = scratch.size();
    }
    first_id[k + 1] = first_id[k] + count;
  }
  if (first_id.back() != ids.size()) return Tokenizer::SharedPrefixLengths(text, ids, cuts);  // not Encode(text)
  std::vector<const AddedToken*> single_word;
  for (const AddedToken& a : m.added) {
    if (a.single_word) single_word.push_back(&a);
  }

  std::vector<size_t> out;
  out.reserve(cuts.size());
  size_t last = segments.size();  // the last added token ending at or before the cut
  for (size_t k = 0, done = 0; done < cuts.size(); ++done) {
    const size_t cut = std::min(cuts[done], text.size());
    if (done > 0 && cuts[done] < cuts[done - 1]) return Tokenizer::SharedPrefixLengths(text, ids, cuts);
    for (; k < segments.size() && segments[k].end <= cut; ++k) {
      if (segments[k].added >= 0) last = k;
    }
    const std::string_view prefix = text.substr(0, cut);
    bool exact = last < segments.size();
    // A single_word candidate ending at the cut is refused in the whole text
    // when a word character follows it, but not in the prefix: the prefix
    // could then split before `last` differently.
    for (const AddedToken* a : single_word) {
      if (!exact) break;
      const size_t n = a->content.size();
      if (cut >= n && prefix.substr(cut - n) == a->content && cut - n < segments[last].begin) exact = false;
    }
    std::vector<Impl::Segment> rest;
    if (exact) {
      m.SplitAdded(prefix, &rest, segments[last].begin);
      exact = !rest.empty() && rest[0].begin == segments[last].begin && rest[0].added == segments[last].added;
    }
    if (!exact) {
      const std::array<size_t, 1> one{cut};
      out.push_back(Tokenizer::SharedPrefixLengths(text, ids, one)[0]);
      continue;
    }
    // The prefix's ids: the whole text's through `last`, then the rest's.
    scratch.clear();
    for (size_t r = 1; r < rest.size(); ++r) {
      if (rest[r].added >= 0) {
        scratch.push_back(m.added[rest[r].added].id);
      } else {
        m.EncodeText(prefix.substr(rest[r].begin, rest[r].end - rest[r].begin), rest[r].begin == 0, &scratch, no_flush);
      }
    }
    size_t shared = first_id[last] + 1;
    for (size_t i = 0; i < scratch.size() && shared < ids.size() && scratch[i] == ids[shared]; ++i) ++shared;
    out.push_back(shared);
  }
  return out;
}

int32_t HfTokenizer::TokenToId(std::string_view token) const {
  for (const AddedToken& a : impl_->added) {
    if (a.content == token) return a.id;
  }
  return impl_->model->TokenToId(token);
}

bool HfTokenizer::IsSpecial(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

}  // namespace zinf::data
