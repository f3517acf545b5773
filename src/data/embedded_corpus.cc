#include "data/embedded_corpus.h"

#include <array>
#include <cmath>
#include <string_view>

#include "common/check.h"

namespace zinf::data {
namespace {

constexpr int kNumWords = 16;

struct Word {
  std::string_view surface;  // letters plus terminator
  // Successors and their probabilities in eighths (summing to 8).
  std::array<std::pair<int, int>, 5> next;
};

enum : int {
  kThe,
  kA,
  kOld,
  kBig,
  kCat,
  kDog,
  kBird,
  kSees,
  kEats,
  kAnd,
  kSleeps,
  kRuns,
  kBarks,
  kSings,
  kFish,
  kThen
};

// The grammar: article (adjective) noun verb ..., sentences ended by an
// intransitive verb or "eats fish"; "and" joins a second subject.
constexpr Word kWords[kNumWords] = {
    {"the ", {{{kCat, 2}, {kDog, 2}, {kBird, 1}, {kOld, 2}, {kBig, 1}}}},
    {"a ", {{{kCat, 3}, {kDog, 2}, {kBird, 2}, {kBig, 1}, {-1, 0}}}},
    {"old ", {{{kCat, 4}, {kDog, 4}, {-1, 0}, {-1, 0}, {-1, 0}}}},
    {"big ", {{{kDog, 4}, {kBird, 2}, {kCat, 2}, {-1, 0}, {-1, 0}}}},
    {"cat ", {{{kSees, 2}, {kEats, 2}, {kSleeps, 2}, {kRuns, 1}, {kAnd, 1}}}},
    {"dog ", {{{kSees, 2}, {kEats, 1}, {kRuns, 3}, {kBarks, 2}, {-1, 0}}}},
    {"bird ", {{{kSings, 4}, {kSees, 2}, {kEats, 2}, {-1, 0}, {-1, 0}}}},
    {"sees ", {{{kThe, 4}, {kA, 4}, {-1, 0}, {-1, 0}, {-1, 0}}}},
    {"eats ", {{{kThe, 2}, {kA, 2}, {kFish, 4}, {-1, 0}, {-1, 0}}}},
    {"and ", {{{kThe, 4}, {kA, 4}, {-1, 0}, {-1, 0}, {-1, 0}}}},
    {"sleeps.\n", {{{kThe, 4}, {kA, 2}, {kThen, 2}, {-1, 0}, {-1, 0}}}},
    {"runs.\n", {{{kThe, 4}, {kA, 2}, {kThen, 2}, {-1, 0}, {-1, 0}}}},
    {"barks!\n", {{{kThe, 4}, {kA, 4}, {-1, 0}, {-1, 0}, {-1, 0}}}},
    {"sings.\n", {{{kThe, 2}, {kA, 4}, {kThen, 2}, {-1, 0}, {-1, 0}}}},
    {"fish.\n", {{{kThe, 4}, {kA, 2}, {kThen, 2}, {-1, 0}, {-1, 0}}}},
    {"then ", {{{kThe, 4}, {kA, 4}, {-1, 0}, {-1, 0}, {-1, 0}}}},
};

using Matrix = std::array<std::array<double, kNumWords>, kNumWords>;

Matrix TransitionMatrix() {
  Matrix p{};
  for (int w = 0; w < kNumWords; ++w) {
    int total = 0;
    for (auto [v, eighths] : kWords[w].next) {
      if (v < 0) continue;
      p[w][v] += eighths / 8.0;
      total += eighths;
    }
    ZINF_CHECK(total == 8);
  }
  return p;
}

// π (I - P) = 0 with the last equation replaced by Σ π = 1, by Gaussian
// elimination with partial pivoting (the chain is irreducible, so the system
// is regular).
std::array<double, kNumWords> Stationary() {
  const Matrix p = TransitionMatrix();
  // Row i of the system: Σ_w π(w) (δ_wi - P(w -> i)) = 0.
  std::array<std::array<double, kNumWords + 1>, kNumWords> a{};
  for (int i = 0; i < kNumWords; ++i) {
    for (int w = 0; w < kNumWords; ++w) a[i][w] = (w == i ? 1.0 : 0.0) - p[w][i];
  }
  for (int w = 0; w < kNumWords; ++w) a[kNumWords - 1][w] = 1.0;
  a[kNumWords - 1][kNumWords] = 1.0;
  for (int col = 0; col < kNumWords; ++col) {
    int pivot = col;
    for (int r = col + 1; r < kNumWords; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    }
    std::swap(a[col], a[pivot]);
    ZINF_CHECK(std::fabs(a[col][col]) > 1e-12);
    for (int r = 0; r < kNumWords; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (int c = col; c <= kNumWords; ++c) a[r][c] -= f * a[col][c];
    }
  }
  std::array<double, kNumWords> pi{};
  for (int i = 0; i < kNumWords; ++i) pi[i] = a[i][kNumWords] / a[i][i];
  return pi;
}

const std::array<double, kNumWords>& Pi() {
  static const std::array<double, kNumWords> pi = Stationary();
  return pi;
}

// SplitMix64 (Steele, Lea, Flood 2014): the same stream on every platform.
struct SplitMix64 {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

}  // namespace

std::string EmbeddedCorpus::Generate(uint64_t num_bytes, uint64_t seed) {
  SplitMix64 rng{seed};
  // X_1 ~ π: inverse CDF on a 53-bit uniform.
  const double u = static_cast<double>(rng.Next() >> 11) * 0x1.0p-53;
  int w = kNumWords - 1;
  double cdf = 0;
  for (int i = 0; i < kNumWords; ++i) {
    cdf += Pi()[i];
    if (u < cdf) {
      w = i;
      break;
    }
  }
  std::string text;
  text.reserve(num_bytes + 16);
  while (text.size() < num_bytes) {
    text += kWords[w].surface;
    // Successor: three uniform bits pick one of eight equal slots, so the
    // sampled probabilities are exactly the table's eighths.
    int slot = static_cast<int>(rng.Next() >> 61);
    for (auto [v, eighths] : kWords[w].next) {
      if (slot < eighths) {
        w = v;
        break;
      }
      slot -= eighths;
    }
  }
  text.resize(num_bytes);
  return text;
}

double EmbeddedCorpus::WordEntropyNats() {
  const Matrix p = TransitionMatrix();
  double h = 0;
  for (int w = 0; w < kNumWords; ++w) {
    for (int v = 0; v < kNumWords; ++v) {
      if (p[w][v] > 0) h -= Pi()[w] * p[w][v] * std::log(p[w][v]);
    }
  }
  return h;
}

double EmbeddedCorpus::MeanBytesPerWord() {
  double l = 0;
  for (int w = 0; w < kNumWords; ++w) l += Pi()[w] * static_cast<double>(kWords[w].surface.size());
  return l;
}

double EmbeddedCorpus::EntropyRateNats() { return WordEntropyNats() / MeanBytesPerWord(); }

Result<double> EmbeddedCorpus::OptimalWindowLossNats(std::span<const int32_t> tokens, int64_t seq_len) {
  if (seq_len < 1) return InvalidArgument("seq_len must be >= 1, got " + std::to_string(seq_len));
  const int64_t num_windows = tokens.empty() ? 0 : (static_cast<int64_t>(tokens.size()) - 1) / seq_len;
  if (num_windows < 1) {
    return InvalidArgument("need at least seq_len + 1 = " + std::to_string(seq_len + 1) + " tokens, got " +
                           std::to_string(tokens.size()));
  }
  // Hidden state: (word w, byte k of its surface), flattened.
  std::vector<int> state_word, state_pos;
  std::array<int, kNumWords> first_state{};
  for (int w = 0; w < kNumWords; ++w) {
    first_state[w] = static_cast<int>(state_word.size());
    for (size_t k = 0; k < kWords[w].surface.size(); ++k) {
      state_word.push_back(w);
      state_pos.push_back(static_cast<int>(k));
    }
  }
  const int num_states = static_cast<int>(state_word.size());
  const Matrix p = TransitionMatrix();
  const double mean_len = MeanBytesPerWord();
  auto emits = [&](int s) { return static_cast<uint8_t>(kWords[state_word[s]].surface[state_pos[s]]); };

  std::vector<double> belief(num_states), predicted(num_states);
  double total_nats = 0;
  for (int64_t win = 0; win < num_windows; ++win) {
    const int32_t* x = tokens.data() + win * seq_len;
    // Stationary phase: the window starts at byte k of word w with
    // probability π(w) / L.
    for (int s = 0; s < num_states; ++s) belief[s] = Pi()[state_word[s]] / mean_len;
    for (int64_t t = 0; t <= seq_len; ++t) {
      if (x[t] < 0 || x[t] > 255) {
        return InvalidArgument("token " + std::to_string(win * seq_len + t) + " is " + std::to_string(x[t]) +
                               ", not a byte");
      }
      if (t > 0) {  // predict x[t] from the belief after x[0 .. t-1]
        std::fill(predicted.begin(), predicted.end(), 0.0);
        for (int s = 0; s < num_states; ++s) {
          if (belief[s] == 0) continue;
          const int w = state_word[s];
          if (state_pos[s] + 1 < static_cast<int>(kWords[w].surface.size())) {
            predicted[s + 1] += belief[s];
          } else {
            for (int v = 0; v < kNumWords; ++v) {
              if (p[w][v] > 0) predicted[first_state[v]] += belief[s] * p[w][v];
            }
          }
        }
        belief.swap(predicted);
      }
      double prob = 0;
      for (int s = 0; s < num_states; ++s) {
        if (emits(s) != static_cast<uint8_t>(x[t])) belief[s] = 0;
        prob += belief[s];
      }
      if (prob <= 0) {
        return InvalidArgument("token " + std::to_string(win * seq_len + t) +
                               " has probability 0 under the embedded corpus source");
      }
      if (t > 0) total_nats -= std::log(prob);
      for (double& b : belief) b /= prob;
    }
  }
  return total_nats / static_cast<double>(num_windows * seq_len);
}

Result<double> EmbeddedCorpus::NegLogLikelihoodPerByte(std::string_view text) {
  const Matrix p = TransitionMatrix();
  double nats = 0;
  size_t pos = 0;
  int prev = -1;
  while (pos < text.size()) {
    int w = -1;
    for (int i = 0; i < kNumWords; ++i) {
      if (text.substr(pos).starts_with(kWords[i].surface)) w = i;
    }
    if (w < 0) break;  // a cut-off last word
    const double prob = prev < 0 ? Pi()[w] : p[prev][w];
    if (prob <= 0) return InvalidArgument("byte " + std::to_string(pos) + ": word transition of probability 0");
    nats -= std::log(prob);
    pos += kWords[w].surface.size();
    prev = w;
  }
  if (pos == 0) return InvalidArgument("the text does not start with a word of the embedded corpus");
  if (text.size() - pos >= 8)
    return InvalidArgument("byte " + std::to_string(pos) + ": not a word of the embedded corpus");
  return nats / static_cast<double>(pos);
}

}  // namespace zinf::data
