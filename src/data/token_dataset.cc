#include "data/token_dataset.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>

#include "common/logging.h"

namespace zinf::data {
namespace {

static_assert(std::endian::native == std::endian::little, "the token cache is little-endian");

constexpr char kMagic[8] = {'Z', 'I', 'N', 'F', 'T', 'O', 'K', '1'};
constexpr uint32_t kVersion = 1;

struct CacheHeader {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;
  uint64_t num_tokens;
  uint64_t source_bytes;
  uint64_t source_hash;
  uint64_t tokenizer_fingerprint;
  uint64_t vocab_size;
  uint64_t tokens_hash;
};
static_assert(sizeof(CacheHeader) == 64);

std::string Hex(uint64_t v, int digits) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(digits, '0');
  for (int i = digits - 1; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 15];
  return s;
}

// Why `cache` cannot be used for this source and tokenizer ("" when it can).
std::string CacheMismatch(const MappedFile& cache, const CacheHeader& want) {
  if (cache.size_bytes() < sizeof(CacheHeader)) return "shorter than its header";
  CacheHeader h;
  std::memcpy(&h, cache.chars(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return "not a zinf token file";
  if (h.version != kVersion || h.token_bytes != 4) return "another format version";
  if (h.source_bytes != want.source_bytes || h.source_hash != want.source_hash) return "the data file changed";
  if (h.tokenizer_fingerprint != want.tokenizer_fingerprint || h.vocab_size != want.vocab_size) {
    return "made with another tokenizer";
  }
  // Divide, not multiply: 4 * num_tokens wraps for a header that says 2^62
  // tokens, and the ids would be read far beyond the file.
  const uint64_t body_bytes = cache.size_bytes() - sizeof(CacheHeader);
  if (body_bytes % 4 != 0 || h.num_tokens != body_bytes / 4) return "truncated";
  const auto* ids = reinterpret_cast<const int32_t*>(cache.chars() + sizeof(CacheHeader));
  if (XXH3_64bits(ids, body_bytes) != h.tokens_hash) return "its tokens do not match their checksum";
  // A checksum is no proof against a file made to pass it: every id must be
  // one of the tokenizer's, or the model would index outside its tables.
  int64_t largest = 0;
  for (uint64_t i = 0; i < h.num_tokens; ++i) largest = std::max<int64_t>(largest, ids[i] < 0 ? INT64_MAX : ids[i]);
  if (h.num_tokens > 0 && static_cast<uint64_t>(largest) >= want.vocab_size)
    return "it holds ids the tokenizer has not";
  return "";
}

}  // namespace

std::string TokenDataset::CachePath(const std::string& path, const Tokenizer& tokenizer, const std::string& cache_dir) {
  const std::string suffix = "." + tokenizer.Name() + "-" + Hex(tokenizer.Fingerprint(), 16) + ".tokens";
  if (cache_dir.empty()) return path + suffix;
  std::error_code ec;
  std::string abs = std::filesystem::absolute(path, ec).lexically_normal().string();
  if (ec) abs = path;
  const std::string base = std::filesystem::path(path).filename().string();
  return cache_dir + "/" + base + "-" + Hex(XXH3_64bits(abs.data(), abs.size()), 8) + suffix;
}

Result<std::unique_ptr<TokenDataset>> TokenDataset::Open(const std::string& path, const Tokenizer& tokenizer,
                                                         const std::string& cache_dir) {
  auto text_or = MappedFile::Open(path);
  if (!text_or.ok()) return std::move(text_or).status().WithContext("--data");
  const MappedFile text = std::move(text_or).value();

  CacheHeader want{};
  std::memcpy(want.magic, kMagic, sizeof(kMagic));
  want.version = kVersion;
  want.token_bytes = 4;
  want.source_bytes = text.size_bytes();
  want.source_hash = XXH3_64bits(text.chars(), text.size_bytes());
  want.tokenizer_fingerprint = tokenizer.Fingerprint();
  want.vocab_size = static_cast<uint64_t>(tokenizer.VocabSize());

  auto ds = std::unique_ptr<TokenDataset>(new TokenDataset());
  ds->cache_path_ = CachePath(path, tokenizer, cache_dir);
  ds->vocab_size_ = tokenizer.VocabSize();

  if (auto cached = MappedFile::Open(ds->cache_path_); cached.ok()) {
    const std::string why = CacheMismatch(*cached, want);
    if (why.empty()) {
      ds->cache_ = std::move(cached).value();
      ds->reused_cache_ = true;
    } else {
      ZINF_LOG_INFO("token cache {}: {}; tokenizing {} again", ds->cache_path_, why, path);
    }
  }

  if (!ds->reused_cache_) {
    if (!cache_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(cache_dir, ec);
      if (ec) return IoError("create token cache directory " + cache_dir + ": " + ec.message());
    }
    auto created = FileWriter::Create(ds->cache_path_);
    if (!created.ok()) {
      return std::move(created).status().WithContext(
          "write token cache for " + path + (cache_dir.empty() ? " (a cache directory can go elsewhere)" : ""));
    }
    FileWriter out = std::move(created).value();
    CacheHeader header = want;
    ZINF_RETURN_IF_ERROR(out.Write(&header, sizeof(header)));  // rewritten with the counts at the end
    XXH3_state_t* hash = XXH3_createState();
    XXH3_64bits_reset(hash);
    Status write_status;
    uint64_t num_tokens = 0;
    tokenizer.EncodeStream(std::string_view(text.chars(), text.size_bytes()), size_t{1} << 20,
                           [&](std::span<const int32_t> ids) {
                             if (!write_status.ok()) return;
                             XXH3_64bits_update(hash, ids.data(), ids.size_bytes());
                             num_tokens += ids.size();
                             write_status = out.Write(ids.data(), ids.size_bytes());
                           });
    header.tokens_hash = XXH3_64bits_digest(hash);
    XXH3_freeState(hash);
    ZINF_RETURN_IF_ERROR(write_status.WithContext("write token cache"));
    header.num_tokens = num_tokens;
    ZINF_RETURN_IF_ERROR(out.WriteAt(0, &header, sizeof(header)));
    ZINF_RETURN_IF_ERROR(out.Commit());
    ZINF_ASSIGN_OR_RETURN(ds->cache_, MappedFile::Open(ds->cache_path_));
    const std::string why = CacheMismatch(ds->cache_, want);
    if (!why.empty()) return DataLoss("token cache " + ds->cache_path_ + " just written: " + why);
  }
  CacheHeader h;
  std::memcpy(&h, ds->cache_.chars(), sizeof(h));
  // mmap is page-aligned, so the ids after the 64-byte header are aligned.
  ds->tokens_ = std::span<const int32_t>(reinterpret_cast<const int32_t*>(ds->cache_.chars() + sizeof(CacheHeader)),
                                         h.num_tokens);
  return ds;
}

std::unique_ptr<TokenDataset> TokenDataset::FromText(std::string_view text, const Tokenizer& tokenizer) {
  auto ds = std::unique_ptr<TokenDataset>(new TokenDataset());
  ds->in_memory_ = tokenizer.Encode(text);
  ds->tokens_ = ds->in_memory_;
  ds->vocab_size_ = tokenizer.VocabSize();
  return ds;
}

Result<DataSplit> TokenDataset::Split(double valid_fraction) const {
  if (!(valid_fraction >= 0.0 && valid_fraction < 1.0)) {
    return InvalidArgument("validation fraction must be in [0, 1), got " + std::to_string(valid_fraction));
  }
  const size_t n = tokens_.size();
  const size_t num_valid = static_cast<size_t>(static_cast<double>(n) * valid_fraction);
  return DataSplit{tokens_.first(n - num_valid), tokens_.last(num_valid)};
}

// ---- BatchLoader ------------------------------------------------------------------

std::string LoaderPosition::ToString() const {
  return "epoch=" + std::to_string(epoch) + " window=" + std::to_string(window);
}

Result<BatchLoader> BatchLoader::Create(std::span<const int32_t> tokens, const Options& options,
                                        std::span<const int32_t> row_targets) {
  if (options.batch_size < 1)
    return InvalidArgument("batch size must be >= 1, got " + std::to_string(options.batch_size));
  if (options.seq_len < 1)
    return InvalidArgument("sequence length must be >= 1, got " + std::to_string(options.seq_len));
  const bool rows = !row_targets.empty();
  if (rows && (row_targets.size() != tokens.size() || tokens.size() % options.seq_len != 0)) {
    return InvalidArgument("packed rows: " + std::to_string(tokens.size()) + " inputs and " +
                           std::to_string(row_targets.size()) + " targets are not whole rows of " +
                           std::to_string(options.seq_len));
  }
  if (!rows && static_cast<int64_t>(tokens.size()) < options.seq_len + 1) {
    return InvalidArgument("need at least seq_len + 1 = " + std::to_string(options.seq_len + 1) +
                           " tokens for one window, have " + std::to_string(tokens.size()));
  }
  BatchLoader l;
  l.tokens_ = tokens;
  l.row_targets_ = row_targets;
  l.options_ = options;
  l.num_windows_ = rows ? static_cast<int64_t>(tokens.size()) / options.seq_len
                        : (static_cast<int64_t>(tokens.size()) - 1) / options.seq_len;
  l.BuildPermutation();
  return l;
}

void BatchLoader::BuildPermutation() {
  if (!options_.shuffle) {
    permutation_.clear();
    return;
  }
  permutation_.resize(num_windows_);
  for (int64_t i = 0; i < num_windows_; ++i) permutation_[i] = static_cast<uint64_t>(i);
  // Fisher-Yates driven by SplitMix64 of (seed, epoch), with Lemire's
  // multiply-shift for the bounded draw: the same order on every platform,
  // which std::uniform_int_distribution does not promise.
  uint64_t state = options_.seed ^ (0xD1B54A32D192ED03ull * (position_.epoch + 1));
  auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int64_t i = num_windows_ - 1; i > 0; --i) {
    const uint64_t j =
        static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(permutation_[i], permutation_[j]);
  }
}

void BatchLoader::Next(int32_t* tokens, int32_t* targets) {
  const int64_t T = options_.seq_len;
  for (int64_t b = 0; b < options_.batch_size; ++b) {
    const uint64_t w = options_.shuffle ? permutation_[position_.window] : position_.window;
    const int32_t* src = tokens_.data() + w * T;
    std::memcpy(tokens + b * T, src, T * sizeof(int32_t));
    const int32_t* next = row_targets_.empty() ? src + 1 : row_targets_.data() + w * T;
    std::memcpy(targets + b * T, next, T * sizeof(int32_t));
    if (++position_.window == static_cast<uint64_t>(num_windows_)) {
      position_.window = 0;
      ++position_.epoch;
      BuildPermutation();
    }
  }
}

Status BatchLoader::Restore(const LoaderPosition& position) {
  if (position.window >= static_cast<uint64_t>(num_windows_)) {
    return OutOfRange("loader position " + position.ToString() + ": the data has only " + std::to_string(num_windows_) +
                      " windows of " + std::to_string(options_.seq_len + 1) + " tokens");
  }
  const bool new_epoch = position.epoch != position_.epoch;
  position_ = position;
  if (new_epoch) BuildPermutation();
  return Status::Ok();
}

}  // namespace zinf::data
