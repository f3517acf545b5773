#include "data/hf_bpe.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "data/tokenizer.h"
#include "data/unicode_classes.h"

namespace zinf::data {
namespace {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// (left id, right id) -> (rank, merged id), open addressing. Keys are never
// ~0 (ids are below 2^31), which marks an empty slot.
class MergeTable {
 public:
  struct Value {
    int32_t rank = -1, merged = -1;
  };
  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.resize(cap);
    mask_ = cap - 1;
  }
  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void Put(uint64_t key, Value v) {
    size_t i = Slot(key);
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
    keys_[i] = key;
    values_[i] = v;
  }
  const Value* Find(uint64_t key) const {
    for (size_t i = Slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t Slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0;
};

constexpr size_t kCacheShards = 64;
constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kMaxEntriesPerShard = size_t{1} << 15;

}  // namespace

struct BpeModel::Impl {
  // One entry per vocabulary token, found by id through a map: ids may be
  // sparse (a file can say 2147483646), so nothing is sized by the largest.
  struct Entry {
    std::string token;  // as spelled in the file
    std::string bytes;  // what the id stands for (byte-level: its bytes)
  };
  std::vector<Entry> entries;
  std::unordered_map<int32_t, int32_t> entry_of_id;
  int64_t id_limit = 0;   // one past the largest id
  TokenMap token_to_id;   // the file's spelling
  TokenMap symbol_to_id;  // what EncodeWord looks words and characters up by
  bool byte_level = false, byte_fallback = false, ignore_merges = false, fuse_unk = false;
  int32_t unk_id = -1;
  std::array<int32_t, 256> byte_token{};      // byte-level: the token of each byte
  std::array<int32_t, 256> fallback_token{};  // byte_fallback: <0xNN>, or -1
  MergeTable merges{0};

  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };
  mutable std::array<Shard, kCacheShards> cache;

  const Entry* Find(int32_t id) const {
    auto it = entry_of_id.find(id);
    return it == entry_of_id.end() ? nullptr : &entries[static_cast<size_t>(it->second)];
  }
  int32_t SymbolId(std::string_view s) const {
    auto it = symbol_to_id.find(s);
    return it == symbol_to_id.end() ? -1 : it->second;
  }

  // The merge loop: symbols in a linked list, candidate merges in a min-heap
  // of (rank, position of the left symbol); an entry is stale when either
  // symbol has changed since it was pushed.
  void Bpe(std::string_view word, std::vector<int32_t>* out) const {
    std::vector<int32_t> id, begin, len, prev, next;
    if (byte_level) {
      const int n = static_cast<int>(word.size());
      id.resize(n);
      begin.resize(n);
      len.assign(n, 1);
      for (int i = 0; i < n; ++i) id[i] = byte_token[static_cast<uint8_t>(word[i])], begin[i] = i;
    } else {
      for (size_t pos = 0; pos < word.size();) {
        const int l = DecodeUtf8(word, pos).length;
        id.push_back(SymbolId(word.substr(pos, l)));  // -1: not in the vocabulary
        begin.push_back(static_cast<int32_t>(pos));
        len.push_back(l);
        pos += l;
      }
    }
    const int n = static_cast<int>(id.size());
    prev.resize(n);
    next.resize(n);
    for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
    std::vector<uint64_t> heap;  // (rank << 32) | position
    auto push = [&](int pos) {
      if (pos < 0 || next[pos] < 0 || id[pos] < 0 || id[next[pos]] < 0) return;
      if (const MergeTable::Value* m = merges.Find(MergeTable::Key(id[pos], id[next[pos]]))) {
        heap.push_back((static_cast<uint64_t>(m->rank) << 32) | static_cast<uint32_t>(pos));
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
      }
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    std::vector<uint8_t> alive(n, 1);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const uint64_t top = heap.back();
      heap.pop_back();
      const int pos = static_cast<int>(top & 0xFFFFFFFFu);
      const int32_t rank = static_cast<int32_t>(top >> 32);
      if (!alive[pos] || next[pos] < 0 || id[pos] < 0 || id[next[pos]] < 0) continue;
      const MergeTable::Value* m = merges.Find(MergeTable::Key(id[pos], id[next[pos]]));
      if (m == nullptr || m->rank != rank) continue;  // stale
      const int right = next[pos];
      id[pos] = m->merged;
      len[pos] += len[right];
      alive[right] = 0;
      next[pos] = next[right];
      if (next[pos] >= 0) prev[next[pos]] = pos;
      push(prev[pos]);
      push(pos);
    }
    bool last_unk = false;
    for (int i = 0; i >= 0 && i < n; i = next[i]) {
      if (id[i] >= 0) {
        out->push_back(id[i]);
        last_unk = false;
        continue;
      }
      const std::string_view ch = word.substr(begin[i], len[i]);
      if (byte_fallback &&
          std::all_of(ch.begin(), ch.end(), [&](char b) { return fallback_token[static_cast<uint8_t>(b)] >= 0; })) {
        for (char b : ch) out->push_back(fallback_token[static_cast<uint8_t>(b)]);
        last_unk = false;
      } else if (unk_id >= 0) {
        if (!(fuse_unk && last_unk)) out->push_back(unk_id);
        last_unk = true;
      }
    }
  }
};

BpeModel::BpeModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeModel::~BpeModel() = default;

Result<std::unique_ptr<BpeModel>> BpeModel::Create(BpeConfig config) {
  auto impl = std::make_unique<Impl>();
  impl->byte_level = config.byte_level;
  impl->byte_fallback = config.byte_fallback;
  impl->ignore_merges = config.ignore_merges;
  impl->fuse_unk = config.fuse_unk;

  int64_t max_id = -1;
  for (const auto& [text, id] : config.vocab) {
    if (id < 0 || id >= (int64_t{1} << 31) - 1) {
      return InvalidArgument("vocab: token '" + text + "' has id " + std::to_string(id) + ", outside [0, 2^31 - 1)");
    }
    max_id = std::max(max_id, id);
  }
  if (max_id < 0) return InvalidArgument("vocab: the vocabulary is empty");
  impl->id_limit = max_id + 1;
  impl->entries.reserve(config.vocab.size());
  impl->entry_of_id.reserve(config.vocab.size());
  impl->token_to_id.reserve(config.vocab.size());

  // The byte alphabet's inverse, for byte-level spelling.
  std::unordered_map<int32_t, uint8_t> cp_to_byte;
  for (int b = 0; b < 256; ++b) {
    const std::string s = Gpt2BpeTokenizer::ByteToUnicode(static_cast<uint8_t>(b));
    cp_to_byte[DecodeUtf8(s, 0).code_point] = static_cast<uint8_t>(b);
  }
  for (auto& [text, id64] : config.vocab) {
    const auto id = static_cast<int32_t>(id64);
    const auto [slot, inserted] = impl->entry_of_id.emplace(id, static_cast<int32_t>(impl->entries.size()));
    if (!inserted) {
      return InvalidArgument("vocab: id " + std::to_string(id) + " is given to both '" +
                             impl->entries[static_cast<size_t>(slot->second)].token + "' and '" + text + "'");
    }
    impl->token_to_id.emplace(text, id);
    std::string bytes = text;
    bool in_alphabet = config.byte_level;
    if (config.byte_level) {
      std::string raw;
      for (size_t pos = 0; pos < text.size() && in_alphabet;) {
        const Utf8Char c = DecodeUtf8(text, pos);
        auto it = cp_to_byte.find(c.code_point);
        if (c.code_point < 0 || it == cp_to_byte.end()) {
          in_alphabet = false;
        } else {
          raw.push_back(static_cast<char>(it->second));
        }
        pos += c.length;
      }
      if (in_alphabet) bytes = std::move(raw);
    }
    // In byte-level mode a token spelled outside the alphabet can never come
    // out of the merges; it is kept for decoding only.
    if (!config.byte_level || in_alphabet) impl->symbol_to_id.emplace(bytes, id);
    impl->entries.push_back({std::move(text), std::move(bytes)});
  }

  if (config.byte_level) {
    for (int b = 0; b < 256; ++b) {
      const int32_t id = impl->SymbolId(std::string(1, static_cast<char>(b)));
      if (id < 0) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02X", b);
        return InvalidArgument(std::string("vocab: byte ") + hex + " ('" +
                               Gpt2BpeTokenizer::ByteToUnicode(static_cast<uint8_t>(b)) +
                               "' in the byte-level alphabet) has no token; byte-level BPE needs all 256");
      }
      impl->byte_token[b] = id;
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = impl->token_to_id.find(std::string_view(name));
    impl->fallback_token[b] = it == impl->token_to_id.end() ? -1 : it->second;
  }
  if (config.unk_token) {
    auto it = impl->token_to_id.find(*config.unk_token);
    if (it == impl->token_to_id.end()) {
      return InvalidArgument("unk_token: '" + *config.unk_token + "' is not in the vocabulary");
    }
    impl->unk_id = it->second;
  }

  impl->merges = MergeTable(config.merges.size());
  for (size_t rank = 0; rank < config.merges.size(); ++rank) {
    const auto& [left, right] = config.merges[rank];
    const std::string where = "merges[" + std::to_string(rank) + "]: '" + left + " " + right + "'";
    auto l = impl->token_to_id.find(left), r = impl->token_to_id.find(right);
    if (l == impl->token_to_id.end() || r == impl->token_to_id.end()) {
      return InvalidArgument(where + ": '" + (l == impl->token_to_id.end() ? left : right) +
                             "' is not in the vocabulary");
    }
    auto m = impl->token_to_id.find(left + right);
    if (m == impl->token_to_id.end()) {
      return InvalidArgument(where + " produces '" + left + right + "', which is not in the vocabulary");
    }
    // A repeated pair takes its last rank, as the tokenizers library's map does.
    impl->merges.Put(MergeTable::Key(l->second, r->second), {static_cast<int32_t>(rank), m->second});
  }
  return std::unique_ptr<BpeModel>(new BpeModel(std::move(impl)));
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  const Impl& m = *impl_;
  if (m.ignore_merges) {
    const int32_t id = m.SymbolId(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  if (m.byte_level && word.size() == 1) {
    out->push_back(m.byte_token[static_cast<uint8_t>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  Impl::Shard* shard = nullptr;
  if (cacheable) {
    shard = &m.cache[std::hash<std::string_view>{}(word) % kCacheShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    auto it = shard->words.find(word);
    if (it != shard->words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out->size();
  m.Bpe(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mu);
    if (shard->words.size() >= kMaxEntriesPerShard) shard->words.clear();
    shard->words.emplace(std::string(word), std::vector<int32_t>(out->begin() + first, out->end()));
  }
}

int64_t BpeModel::IdLimit() const { return impl_->id_limit; }
bool BpeModel::HasId(int32_t id) const { return impl_->Find(id) != nullptr; }
const std::string& BpeModel::IdToToken(int32_t id) const {
  static const std::string kNone;
  const Impl::Entry* e = impl_->Find(id);
  return e ? e->token : kNone;
}
const std::string& BpeModel::IdToBytes(int32_t id) const {
  static const std::string kNone;
  const Impl::Entry* e = impl_->Find(id);
  return e ? e->bytes : kNone;
}
int32_t BpeModel::TokenToId(std::string_view token) const {
  auto it = impl_->token_to_id.find(token);
  return it == impl_->token_to_id.end() ? -1 : it->second;
}

}  // namespace zinf::data
