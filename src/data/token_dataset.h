// Training text as tokens: TokenDataset tokenizes a UTF-8 text file once into
// a cached token file and memory-maps it; Split cuts train and validation
// parts; BatchLoader serves [B, T] int32 batches of inputs and next-token
// targets in a seed-determined shuffled order, with a position a checkpoint
// saves and restores.
//
// The token cache. "<data>.<tokenizer>-<fingerprint>.tokens" beside the data
// file, or "<cache_dir>/<basename>-<path hash>.<tokenizer>-<fingerprint>.tokens"
// when a cache directory is given. Layout (little-endian):
//   bytes 0..63   header: magic "ZINFTOK1", version (u32, 1), token width
//                 (u32, 4), num_tokens (u64), source size in bytes (u64),
//                 xxh3-64 of the source bytes (u64), tokenizer fingerprint
//                 (u64), vocab size (u64), xxh3-64 of the token bytes (u64)
//   bytes 64..    num_tokens int32 ids
// Open reuses the cache when its header matches the source (same size and
// content hash) and the tokenizer, and its token bytes hash to the recorded
// value; otherwise it re-tokenizes (streaming: the text is memory-mapped and
// the tokens are written as they come, so neither needs to fit in memory)
// and replaces the cache atomically (write, fsync, rename).
//
// Thread-safety: a TokenDataset is immutable after Open (its tokens may be
// read from any thread); a BatchLoader serves one caller.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/file_util.h"
#include "data/tokenizer.h"
#include "zinf/status.h"

namespace zinf::data {

// A token stream's split (train and valid), or packed rows' split (chat
// data: then the targets are the rows' own, -1 where there is no target).
struct DataSplit {
  std::span<const int32_t> train;               // the first tokens
  std::span<const int32_t> valid;               // the last floor(n · valid_fraction) tokens
  std::span<const int32_t> train_targets = {};  // empty for a token stream
  std::span<const int32_t> valid_targets = {};
};

class TokenDataset {
 public:
  // Tokenizes `path` with `tokenizer` (or reuses the cache; see above).
  // cache_dir "" means beside the data file. Errors name the path.
  static Result<std::unique_ptr<TokenDataset>> Open(const std::string& path, const Tokenizer& tokenizer,
                                                    const std::string& cache_dir = "");
  // Tokens of in-memory text (the embedded corpus), not cached.
  static std::unique_ptr<TokenDataset> FromText(std::string_view text, const Tokenizer& tokenizer);

  std::span<const int32_t> tokens() const { return tokens_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t vocab_size() const { return vocab_size_; }
  // Where the cache lives ("" for FromText) and whether Open reused it.
  const std::string& cache_path() const { return cache_path_; }
  bool reused_cache() const { return reused_cache_; }

  // kInvalidArgument unless 0 <= valid_fraction < 1.
  Result<DataSplit> Split(double valid_fraction) const;

  // The cache file Open uses for (path, tokenizer, cache_dir).
  static std::string CachePath(const std::string& path, const Tokenizer& tokenizer, const std::string& cache_dir);

 private:
  TokenDataset() = default;
  MappedFile cache_;                // Open: the mapped token file
  std::vector<int32_t> in_memory_;  // FromText
  std::span<const int32_t> tokens_;
  int64_t vocab_size_ = 0;
  std::string cache_path_;
  bool reused_cache_ = false;
};

// Where a BatchLoader is: the next batch starts at window `window` of the
// permutation of epoch `epoch`. Plain numbers, for a checkpoint.
struct LoaderPosition {
  uint64_t epoch = 0;
  uint64_t window = 0;
  friend bool operator==(const LoaderPosition&, const LoaderPosition&) = default;
  std::string ToString() const;  // "epoch=2 window=17"
};

// Windows: the tokens split into W = (n - 1) / T non-overlapping windows;
// window k is tokens [k·T, k·T + T] (T + 1 tokens: inputs are the first T,
// targets the last T). With row targets (packed chat rows), window k is
// row k: inputs tokens[k·T, k·T + T), targets row_targets[k·T, k·T + T),
// W = n / T. Each epoch visits every window once, in a permutation
// that depends only on (seed, epoch) (or in order when shuffle is off); a
// batch is the next B windows, continuing into the next epoch when one ends.
class BatchLoader {
 public:
  struct Options {
    int64_t batch_size = 1;  // B
    int64_t seq_len = 0;     // T
    uint64_t seed = 0;
    bool shuffle = true;
  };
  // `tokens` (and `row_targets`) must outlive the loader. kInvalidArgument
  // for B or T < 1, fewer than T + 1 tokens (a stream) or rows whose sizes
  // differ or are not a whole number of rows.
  static Result<BatchLoader> Create(std::span<const int32_t> tokens, const Options& options,
                                    std::span<const int32_t> row_targets = {});

  // Fills tokens and targets, int32 [B, T] row-major each.
  void Next(int32_t* tokens, int32_t* targets);

  LoaderPosition Position() const { return position_; }
  // kOutOfRange if window >= NumWindows().
  Status Restore(const LoaderPosition& position);

  int64_t NumWindows() const { return num_windows_; }
  const Options& options() const { return options_; }

 private:
  void BuildPermutation();
  std::span<const int32_t> tokens_;
  std::span<const int32_t> row_targets_;  // empty for a token stream
  Options options_;
  int64_t num_windows_ = 0;
  LoaderPosition position_;
  std::vector<uint64_t> permutation_;  // of position_.epoch; empty when not shuffling
};

}  // namespace zinf::data
