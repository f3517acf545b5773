// The embedded corpus: deterministic text, an entropy rate that the text's
// own likelihood confirms, and the optimal windowed loss a trained model is
// measured against.
#include "data/embedded_corpus.h"

#include <gtest/gtest.h>

#include <cmath>

#include "data/tokenizer.h"

namespace zinf::data {
namespace {

TEST(EmbeddedCorpusTest, GenerationIsDeterministicAndExactInLength) {
  const std::string a = EmbeddedCorpus::Generate(10'000, 1);
  EXPECT_EQ(a.size(), 10'000u);
  EXPECT_EQ(a, EmbeddedCorpus::Generate(10'000, 1));
  EXPECT_NE(a, EmbeddedCorpus::Generate(10'000, 2));
  EXPECT_EQ(EmbeddedCorpus::Generate(500, 1), a.substr(0, 500));
  EXPECT_TRUE(EmbeddedCorpus::Generate(0, 1).empty());
  // Readable toy English.
  EXPECT_NE(a.find(" the "), std::string::npos);
  EXPECT_NE(a.find(".\n"), std::string::npos);
}

TEST(EmbeddedCorpusTest, EntropyRateIsTheWordEntropyOverTheMeanWordLength) {
  const double h = EmbeddedCorpus::EntropyRateNats();
  EXPECT_DOUBLE_EQ(h, EmbeddedCorpus::WordEntropyNats() / EmbeddedCorpus::MeanBytesPerWord());
  // Nontrivial: well below a byte-unigram model and well above zero.
  EXPECT_GT(h, 0.1);
  EXPECT_LT(h, 1.0);
  EXPECT_GT(EmbeddedCorpus::MeanBytesPerWord(), 3.0);
  EXPECT_LT(EmbeddedCorpus::MeanBytesPerWord(), 8.0);
  std::printf("embedded corpus: H = %.6f nats/byte (H_word = %.6f nats, L = %.6f bytes/word)\n", h,
              EmbeddedCorpus::WordEntropyNats(), EmbeddedCorpus::MeanBytesPerWord());
}

// The law of large numbers (Shannon-McMillan-Breiman): -ln P(text) / n
// converges to H. 2 MB gives about 400k words; the per-word log-loss has a
// standard deviation under 1 nat, so the mean is within ~0.005 nats/byte.
TEST(EmbeddedCorpusTest, LikelihoodOfGeneratedTextMatchesTheEntropyRate) {
  for (uint64_t seed : {1, 2}) {
    auto nll = EmbeddedCorpus::NegLogLikelihoodPerByte(EmbeddedCorpus::Generate(2'000'000, seed));
    ASSERT_TRUE(nll.ok()) << nll.status().ToString();
    EXPECT_NEAR(*nll, EmbeddedCorpus::EntropyRateNats(), 0.01);
  }
  EXPECT_FALSE(EmbeddedCorpus::NegLogLikelihoodPerByte("the zebra dances ").ok());
}

TEST(EmbeddedCorpusTest, OptimalWindowLossApproachesTheEntropyRate) {
  ByteTokenizer tok;
  const std::vector<int32_t> tokens = tok.Encode(EmbeddedCorpus::Generate(400'000, 5));
  const double h = EmbeddedCorpus::EntropyRateNats();
  double previous = 1e9;
  for (int64_t t : {8, 16, 64, 256}) {
    auto loss = EmbeddedCorpus::OptimalWindowLossNats(tokens, t);
    ASSERT_TRUE(loss.ok()) << loss.status().ToString();
    std::printf("optimal loss at seq_len %3lld: %.4f nats (H + %.4f)\n", static_cast<long long>(t), *loss, *loss - h);
    EXPECT_GT(*loss, h - 0.01);  // no predictor beats the entropy rate (up to sampling noise)
    EXPECT_LT(*loss, previous);  // more context, less loss
    previous = *loss;
  }
  EXPECT_LT(previous, h + 0.03);
  // The bound a trained model is held to: H + 0.3 nats is reachable.
  EXPECT_LT(*EmbeddedCorpus::OptimalWindowLossNats(tokens, 64), h + 0.3);

  std::vector<int32_t> bad = {'t', 'h', 'e', ' ', 'z'};
  EXPECT_FALSE(EmbeddedCorpus::OptimalWindowLossNats(bad, 4).ok());
  EXPECT_FALSE(EmbeddedCorpus::OptimalWindowLossNats(bad, 5).ok());  // too short
}

}  // namespace
}  // namespace zinf::data
