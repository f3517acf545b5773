// TokenDataset (the token cache: made once, reused while unchanged, remade
// when the text, the tokenizer or the cache itself changes), Split, and
// BatchLoader (windows, targets, determinism by seed, epochs, and a position
// that restores exactly).
#include "data/token_dataset.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "data/embedded_corpus.h"
#include "data_test_util.h"

namespace zinf::data {
namespace {

using test::FreshDir;
using test::ReadFile;
using test::WriteFile;

TEST(TokenDatasetTest, TokenizesOnceAndReusesTheCache) {
  const std::string dir = FreshDir();
  const std::string path = dir + "/text.txt";
  const std::string text = EmbeddedCorpus::Generate(100'000, 3);
  WriteFile(path, text);
  ByteTokenizer tok;
  auto first = TokenDataset::Open(path, tok);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE((*first)->reused_cache());
  EXPECT_EQ((*first)->cache_path(), TokenDataset::CachePath(path, tok, ""));
  EXPECT_TRUE(std::filesystem::exists((*first)->cache_path()));
  const std::vector<int32_t> expected = tok.Encode(text);
  ASSERT_EQ((*first)->num_tokens(), static_cast<int64_t>(expected.size()));
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), (*first)->tokens().begin()));
  EXPECT_EQ((*first)->vocab_size(), 256);

  auto second = TokenDataset::Open(path, tok);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE((*second)->reused_cache());
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), (*second)->tokens().begin()));
}

TEST(TokenDatasetTest, RemakesTheCacheWhenTheTextChanges) {
  const std::string dir = FreshDir();
  const std::string path = dir + "/text.txt";
  WriteFile(path, "first version of the text");
  ByteTokenizer tok;
  ASSERT_TRUE(TokenDataset::Open(path, tok).ok());
  WriteFile(path, "first version of the tex!");  // same size, other content
  auto ds = TokenDataset::Open(path, tok);
  ASSERT_TRUE(ds.ok());
  EXPECT_FALSE((*ds)->reused_cache());
  EXPECT_EQ((*ds)->tokens().back(), '!');
}

TEST(TokenDatasetTest, RemakesACorruptCache) {
  const std::string dir = FreshDir();
  const std::string path = dir + "/text.txt";
  WriteFile(path, "some text to tokenize");
  ByteTokenizer tok;
  std::string cache_path;
  {
    auto ds = TokenDataset::Open(path, tok);
    ASSERT_TRUE(ds.ok());
    cache_path = (*ds)->cache_path();
  }
  std::string bytes = ReadFile(cache_path);
  bytes[64] ^= 1;  // the first token
  WriteFile(cache_path, bytes);
  auto ds = TokenDataset::Open(path, tok);
  ASSERT_TRUE(ds.ok());
  EXPECT_FALSE((*ds)->reused_cache());
  EXPECT_EQ((*ds)->tokens()[0], 's');
  WriteFile(cache_path, bytes.substr(0, 70));  // truncated
  ds = TokenDataset::Open(path, tok);
  ASSERT_TRUE(ds.ok());
  EXPECT_FALSE((*ds)->reused_cache());
  EXPECT_EQ((*ds)->num_tokens(), 21);
}

// A cache made to pass the checks: a header claiming 2^62 + 5 tokens (4x that
// wraps to the real 20 bytes) read the ids far beyond the file; ids beyond the
// vocabulary with a correct checksum reached the model. Both are remade.
TEST(TokenDatasetTest, RemakesACacheMadeToPassItsChecks) {
  const std::string dir = FreshDir();
  const std::string path = dir + "/text.txt";
  WriteFile(path, "abcde");
  ByteTokenizer tok;
  std::string cache_path;
  {
    auto ds = TokenDataset::Open(path, tok);
    ASSERT_TRUE(ds.ok());
    cache_path = (*ds)->cache_path();
  }
  const std::string good = ReadFile(cache_path);
  ASSERT_EQ(good.size(), 64u + 20u);
  std::string bytes = good;
  const uint64_t wrapped = (uint64_t{1} << 62) + 5;
  std::memcpy(bytes.data() + 16, &wrapped, 8);  // num_tokens
  WriteFile(cache_path, bytes);
  auto ds = TokenDataset::Open(path, tok);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_FALSE((*ds)->reused_cache());
  EXPECT_EQ((*ds)->num_tokens(), 5);

  bytes = good;
  const int32_t beyond = 1 << 20;
  std::memcpy(bytes.data() + 64, &beyond, 4);
  const uint64_t sum = XXH3_64bits(bytes.data() + 64, 20);
  std::memcpy(bytes.data() + 56, &sum, 8);  // tokens_hash, made to match
  WriteFile(cache_path, bytes);
  ds = TokenDataset::Open(path, tok);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_FALSE((*ds)->reused_cache());
  EXPECT_EQ((*ds)->tokens()[0], 'a');
}

TEST(TokenDatasetTest, CacheDirectoryAndTokenizerKeepCachesApart) {
  const std::string dir = FreshDir();
  const std::string path = dir + "/text.txt";
  const std::string text = test::SampleText();
  WriteFile(path, text);
  const auto vocab = test::GenerateVocabulary(text, 50);
  std::filesystem::create_directories(dir + "/vocab");
  auto bpe = Gpt2BpeTokenizer::Load(test::WriteVocabulary(vocab, dir + "/vocab"));
  ASSERT_TRUE(bpe.ok());
  ByteTokenizer bytes;

  auto a = TokenDataset::Open(path, bytes, dir + "/cache");
  auto b = TokenDataset::Open(path, **bpe, dir + "/cache");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  EXPECT_NE((*a)->cache_path(), (*b)->cache_path());
  EXPECT_EQ((*a)->cache_path().rfind(dir + "/cache/text.txt-", 0), 0u) << (*a)->cache_path();
  const std::vector<int32_t> expected = (*bpe)->Encode(text);
  ASSERT_EQ((*b)->num_tokens(), static_cast<int64_t>(expected.size()));
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), (*b)->tokens().begin()));
  EXPECT_EQ((*b)->vocab_size(), (*bpe)->VocabSize());
  auto again = TokenDataset::Open(path, **bpe, dir + "/cache");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->reused_cache());
}

TEST(TokenDatasetTest, EmptyTextAndMissingFile) {
  const std::string dir = FreshDir();
  WriteFile(dir + "/empty.txt", "");
  ByteTokenizer tok;
  auto empty = TokenDataset::Open(dir + "/empty.txt", tok);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ((*empty)->num_tokens(), 0);
  auto missing = TokenDataset::Open(dir + "/missing.txt", tok);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/missing.txt"), std::string::npos) << missing.status().ToString();
}

TEST(TokenDatasetTest, SplitTakesTheValidationTail) {
  ByteTokenizer tok;
  auto ds = TokenDataset::FromText(std::string(1000, 'x') + std::string(10, 'y'), tok);
  auto split = ds->Split(0.01);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->train.size(), 1000u);
  EXPECT_EQ(split->valid.size(), 10u);
  EXPECT_EQ(split->valid[0], 'y');
  EXPECT_EQ(ds->Split(0.0)->valid.size(), 0u);
  EXPECT_FALSE(ds->Split(1.0).ok());
  EXPECT_FALSE(ds->Split(-0.1).ok());
}

std::vector<int32_t> Iota(int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(BatchLoaderTest, TargetsAreTheNextTokens) {
  const std::vector<int32_t> data = Iota(1001);
  auto loader = BatchLoader::Create(data, {.batch_size = 3, .seq_len = 10, .seed = 5});
  ASSERT_TRUE(loader.ok());
  EXPECT_EQ(loader->NumWindows(), 100);
  std::vector<int32_t> x(30), y(30);
  for (int step = 0; step < 5; ++step) {
    loader->Next(x.data(), y.data());
    for (int b = 0; b < 3; ++b) {
      EXPECT_EQ(x[b * 10] % 10, 0);  // windows start at multiples of T
      for (int t = 0; t < 10; ++t) {
        EXPECT_EQ(x[b * 10 + t], x[b * 10] + t);
        EXPECT_EQ(y[b * 10 + t], x[b * 10 + t] + 1);
      }
    }
  }
}

TEST(BatchLoaderTest, EachEpochVisitsEveryWindowOnceInASeededOrder) {
  const std::vector<int32_t> data = Iota(641);
  auto a = BatchLoader::Create(data, {.batch_size = 4, .seq_len = 8, .seed = 1});
  auto b = BatchLoader::Create(data, {.batch_size = 4, .seq_len = 8, .seed = 1});
  auto c = BatchLoader::Create(data, {.batch_size = 4, .seq_len = 8, .seed = 2});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->NumWindows(), 80);
  std::vector<int32_t> xa(32), ya(32), xb(32), yb(32), xc(32), yc(32);
  std::vector<int32_t> epoch0, epoch1;
  bool differs_from_other_seed = false;
  for (int step = 0; step < 40; ++step) {  // two epochs of 20 batches
    a->Next(xa.data(), ya.data());
    b->Next(xb.data(), yb.data());
    c->Next(xc.data(), yc.data());
    ASSERT_EQ(xa, xb);
    differs_from_other_seed |= xa != xc;
    for (int k = 0; k < 4; ++k) (step < 20 ? epoch0 : epoch1).push_back(xa[k * 8] / 8);
  }
  EXPECT_TRUE(differs_from_other_seed);
  EXPECT_EQ(std::set<int32_t>(epoch0.begin(), epoch0.end()).size(), 80u);
  EXPECT_EQ(std::set<int32_t>(epoch1.begin(), epoch1.end()).size(), 80u);
  EXPECT_NE(epoch0, epoch1);  // a new permutation per epoch
  EXPECT_EQ(a->Position(), (LoaderPosition{2, 0}));
}

TEST(BatchLoaderTest, RestoredPositionContinuesIdentically) {
  const std::vector<int32_t> data = Iota(1000);
  auto loader = BatchLoader::Create(data, {.batch_size = 3, .seq_len = 7, .seed = 9});
  ASSERT_TRUE(loader.ok());
  std::vector<int32_t> x(21), y(21);
  for (int i = 0; i < 60; ++i) loader->Next(x.data(), y.data());  // into the second epoch (142 windows)
  const LoaderPosition saved = loader->Position();
  EXPECT_EQ(saved.epoch, 1u);
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 60; ++i) {
    loader->Next(x.data(), y.data());
    expected.push_back(x);
  }
  // A fresh loader, as after a restart from a checkpoint.
  auto resumed = BatchLoader::Create(data, {.batch_size = 3, .seq_len = 7, .seed = 9});
  ASSERT_TRUE(resumed->Restore(saved).ok());
  EXPECT_EQ(resumed->Position(), saved);
  for (int i = 0; i < 60; ++i) {
    resumed->Next(x.data(), y.data());
    ASSERT_EQ(x, expected[i]) << "batch " << i;
  }
  Status bad = resumed->Restore({0, 142});
  EXPECT_EQ(bad.code(), StatusCode::kOutOfRange);
  EXPECT_NE(bad.message().find("epoch=0 window=142"), std::string::npos) << bad.ToString();
}

TEST(BatchLoaderTest, UnshuffledLoaderWalksTheWindowsInOrder) {
  const std::vector<int32_t> data = Iota(50);
  auto loader = BatchLoader::Create(data, {.batch_size = 2, .seq_len = 10, .shuffle = false});
  ASSERT_TRUE(loader.ok());
  std::vector<int32_t> x(20), y(20);
  const int32_t expected_starts[] = {0, 10, 20, 30, 0, 10};
  for (int step = 0; step < 3; ++step) {
    loader->Next(x.data(), y.data());
    EXPECT_EQ(x[0], expected_starts[2 * step]);
    EXPECT_EQ(x[10], expected_starts[2 * step + 1]);
  }
}

TEST(BatchLoaderTest, RejectsBadShapes) {
  const std::vector<int32_t> data = Iota(10);
  EXPECT_FALSE(BatchLoader::Create(data, {.batch_size = 0, .seq_len = 4}).ok());
  EXPECT_FALSE(BatchLoader::Create(data, {.batch_size = 1, .seq_len = 0}).ok());
  auto r = BatchLoader::Create(data, {.batch_size = 1, .seq_len = 10});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("need at least seq_len + 1 = 11 tokens"), std::string::npos);
  EXPECT_TRUE(BatchLoader::Create(data, {.batch_size = 1, .seq_len = 9}).ok());
}

TEST(BatchLoaderTest, PackedRowsServeTheirOwnTargets) {
  const std::vector<int32_t> inputs = Iota(12), targets = {-1, 5, -1, 7, 8, 9, -1, -1, 1, 2, 3, -1};
  auto r = BatchLoader::Create(inputs, {.batch_size = 2, .seq_len = 4, .shuffle = false}, targets);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->NumWindows(), 3);  // rows, not (n - 1) / T windows
  std::vector<int32_t> in(8), tg(8);
  r->Next(in.data(), tg.data());
  EXPECT_EQ(in, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(tg, (std::vector<int32_t>{-1, 5, -1, 7, 8, 9, -1, -1}));
  r->Next(in.data(), tg.data());  // row 2, then the next epoch's row 0
  EXPECT_EQ(tg, (std::vector<int32_t>{1, 2, 3, -1, -1, 5, -1, 7}));
  EXPECT_FALSE(BatchLoader::Create(inputs, {.batch_size = 1, .seq_len = 5}, targets).ok());  // not whole rows
  EXPECT_FALSE(BatchLoader::Create(inputs, {.batch_size = 1, .seq_len = 4}, std::span(targets).first(8)).ok());
}

}  // namespace
}  // namespace zinf::data
