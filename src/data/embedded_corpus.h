// The embedded default corpus: text generated in code (no download) by a
// source whose entropy rate is known exactly, so a test can say how good a
// trained model must be.
//
// The source. A first-order Markov chain over the K = 16 words of a toy
// grammar ("the", "dog", "sees", "fish.\n", ...; the table is in
// embedded_corpus.cc). Each word w has a surface s(w): its letters plus one
// terminator (" ", or ".\n" / "!\n" for the sentence-final words), and the
// text is the concatenation s(X_1) s(X_2) ... The successor probabilities
// P(w -> v) are multiples of 1/8. X_1 is drawn from the stationary
// distribution π (π P = π), so the word process is stationary.
//
// The entropy rate. The surfaces form a prefix-free code (a surface ends at
// its first terminator), so bytes and words determine each other, and for a
// stationary word process coded this way the entropy rate per byte is the
// entropy rate per word over the mean bytes per word:
//
//   H_word = - Σ_w π(w) Σ_v P(w -> v) ln P(w -> v)           [nats / word]
//   L      =   Σ_w π(w) |s(w)|                               [bytes / word]
//   H      =   H_word / L                                    [nats / byte]
//
// (Cover & Thomas, Elements of Information Theory, ch. 4; for variable
// length words the byte process is the renewal-reward form of the same
// limit.) With the byte tokenizer one token is one byte, so H is the lowest
// achievable cross-entropy per token in the limit of unbounded context. π
// is computed in double precision by solving π (I - P) = 0, Σ π = 1.
//
// A model sees finite windows. OptimalWindowLossNats gives the exact
// cross-entropy of the Bayes-optimal predictor that knows the source and
// sees each window from its first token (phase unknown at the start), which
// is what the best possible model reaches on BatchLoader's windows; it is
// H plus a start-up cost that shrinks as 1 / seq_len.
//
// The numbers (printed by the corpus test): H_word = 1.1831 nats, L = 4.4205
// bytes, H = 0.2676 nats per byte; the optimal windowed loss is H + 0.132
// at seq_len 8, H + 0.066 at 16, H + 0.017 at 64, H + 0.004 at 256. So a
// trained model's validation loss <= H + 0.3 is reachable at any seq_len >= 8
// and leaves the model the rest of the margin. A model on this corpus needs a
// vocabulary of at least 256 (the byte tokenizer's).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf::data {

class EmbeddedCorpus {
 public:
  // Exactly num_bytes bytes of the source's text (the last word may be cut),
  // deterministic in (num_bytes, seed) on every platform.
  static std::string Generate(uint64_t num_bytes, uint64_t seed);

  // H above, nats per byte (= per byte-tokenizer token).
  static double EntropyRateNats();
  // H_word and L above.
  static double WordEntropyNats();
  static double MeanBytesPerWord();

  // Mean -ln p(x_t | x_0 .. x_{t-1}) over t = 1 .. seq_len of every window
  // [k·seq_len, k·seq_len + seq_len] of `byte_tokens` (BatchLoader's
  // windows), for the exact source posterior given the window so far, the
  // window starting at a stationary random point of the text. kInvalidArgument
  // if a token is not a byte or the text is not the source's (probability 0).
  static Result<double> OptimalWindowLossNats(std::span<const int32_t> byte_tokens, int64_t seq_len);

  // -ln P(text) / |text| under the source, for text that starts at a word
  // boundary (as Generate's does): the empirical counterpart of H.
  static Result<double> NegLogLikelihoodPerByte(std::string_view text);
};

}  // namespace zinf::data
