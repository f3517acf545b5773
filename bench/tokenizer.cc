// `zinf bench tokenizer`: how fast a tokenizer encodes text, per thread.
// Each of --threads threads encodes the whole text (its own copy of the
// work, sharing the tokenizer and its word cache, as data-loading threads
// would); a pass is timed from the start of the first thread to the end of
// the last, so MB/s per thread = text bytes / pass seconds. One warm-up pass
// fills the word cache, then the median of --loops passes is reported. The
// reference, measured the same way in the same run on the same text, is the
// byte tokenizer (one id per byte: a scan that writes 4 bytes per input
// byte, so it is bound by memory, not by tokenization); the ratio says how
// far the tokenizer is from that bound. Text: --text FILE, or --size bytes
// of the embedded corpus (src/data/embedded_corpus.h: English words of a
// small grammar, so almost every word is a cache hit after the warm-up).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "common/units.h"
#include "data/embedded_corpus.h"
#include "data/tokenizer.h"

namespace zinf::bench {
namespace {

struct Options {
  std::string tokenizer;
  std::string text_file;
  std::string size = "8M";
  int threads = 1;
  int loops = 5;
  bool json = false;
};

struct Timing {
  double seconds = 0;  // median pass
  size_t tokens = 0;   // per thread per pass
};

// Times `loops` passes after one warm-up; prints progress to stderr when the
// whole run looks longer than a couple of seconds.
Timing TimeEncode(const data::Tokenizer& tok, std::string_view text, int threads, int loops, const char* label,
                  bool quiet) {
  std::vector<double> seconds;
  std::atomic<size_t> tokens{0};
  const double start = NowSeconds();
  bool progress = false;
  for (int pass = 0; pass <= loops; ++pass) {
    tokens = 0;
    const double t0 = NowSeconds();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        size_t n = 0;
        tok.EncodeStream(text, size_t{1} << 16, [&](std::span<const int32_t> ids) { n += ids.size(); });
        tokens += n;
      });
    }
    for (auto& th : pool) th.join();
    const double dt = NowSeconds() - t0;
    if (pass > 0) seconds.push_back(dt);
    const double elapsed = NowSeconds() - start;
    if (!quiet && (progress || elapsed * (loops + 1) / (pass + 1) > 2.0)) {
      progress = true;
      std::fprintf(stderr, "\r# %s: pass %d/%d (%.1f s)   ", label, pass + 1, loops + 1, elapsed);
      std::fflush(stderr);
    }
  }
  if (progress) std::fprintf(stderr, "\n");
  return {Median(seconds), tokens / static_cast<size_t>(threads)};
}

int Run(const Options& opt) {
  if (opt.threads < 1 || opt.loops < 1) {
    std::fprintf(stderr, "zinf bench tokenizer: --threads and --loops must be >= 1\n");
    return 2;
  }
  auto tok = data::MakeTokenizer(opt.tokenizer);
  if (!tok.ok()) {
    std::fprintf(stderr, "zinf bench tokenizer: %s\n", tok.status().message().c_str());
    return 2;
  }
  std::string text, source;
  if (!opt.text_file.empty()) {
    std::ifstream in(opt.text_file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "zinf bench tokenizer: --text: cannot open %s\n", opt.text_file.c_str());
      return 2;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    source = opt.text_file;
  } else {
    auto bytes = ParseSize(opt.size);
    if (!bytes.ok()) {
      std::fprintf(stderr, "zinf bench tokenizer: --size: %s\n", bytes.status().message().c_str());
      return 2;
    }
    text = data::EmbeddedCorpus::Generate(*bytes, /*seed=*/1);
    source = "embedded corpus";
  }
  if (text.empty()) {
    std::fprintf(stderr, "zinf bench tokenizer: the text is empty\n");
    return 2;
  }
  if (!opt.json) {
    std::printf("# zinf bench tokenizer: %s (%s, vocabulary %lld), text %s (%s), %d thread(s), median of %d passes\n",
                opt.tokenizer.c_str(), (*tok)->Name().c_str(), static_cast<long long>((*tok)->VocabSize()),
                source.c_str(), FormatBytes(text.size()).c_str(), opt.threads, opt.loops);
    std::printf("# MB/s per thread = text bytes / pass seconds (10^6 bytes); reference: the byte tokenizer\n");
  }
  const data::ByteTokenizer bytes_tok;
  const Timing ref = TimeEncode(bytes_tok, text, opt.threads, opt.loops, "byte", opt.json);
  const Timing got = TimeEncode(**tok, text, opt.threads, opt.loops, (*tok)->Name().c_str(), opt.json);
  const double mb = static_cast<double>(text.size()) / 1e6;
  const double ref_mbs = mb / ref.seconds, got_mbs = mb / got.seconds;
  if (opt.json) {
    nlohmann::json out = {{"bench", "tokenizer"},
                          {"tokenizer", opt.tokenizer},
                          {"name", (*tok)->Name()},
                          {"text", source},
                          {"text_bytes", text.size()},
                          {"threads", opt.threads},
                          {"loops", opt.loops},
                          {"tokens", got.tokens},
                          {"bytes_per_token", static_cast<double>(text.size()) / got.tokens},
                          {"seconds", got.seconds},
                          {"mb_per_s_per_thread", got_mbs},
                          {"reference", {{"name", "byte"}, {"seconds", ref.seconds}, {"mb_per_s_per_thread", ref_mbs}}},
                          {"ratio_to_reference", got_mbs / ref_mbs}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("%-10s %12s %10s %12s %14s %10s\n", "tokenizer", "tokens", "bytes/tok", "seconds", "MB/s/thread",
              "vs byte");
  std::printf("%-10s %12zu %10.2f %12.4f %14.1f %10.4f\n", "byte", ref.tokens, 1.0, ref.seconds, ref_mbs, 1.0);
  std::printf("%-10s %12zu %10.2f %12.4f %14.1f %10.4f\n", (*tok)->Name().c_str(), got.tokens,
              static_cast<double>(text.size()) / got.tokens, got.seconds, got_mbs, got_mbs / ref_mbs);
  return 0;
}

}  // namespace

void RegisterTokenizer(CLI::App& bench, int* exit_code) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd =
      bench.add_subcommand("tokenizer", "Encoding speed of a tokenizer (MB/s per thread) vs the byte tokenizer");
  cmd->add_option("--tokenizer", opt->tokenizer, "tokenizer.json (or a directory with one), or a GPT-2 BPE directory")
      ->required();
  cmd->add_option("--text", opt->text_file, "Text file to encode (default: the embedded corpus)");
  cmd->add_option("--size", opt->size, "Bytes of embedded corpus when no --text is given, e.g. 8M")
      ->capture_default_str();
  cmd->add_option("--threads", opt->threads, "Threads, each encoding the whole text")->capture_default_str();
  cmd->add_option("--loops", opt->loops, "Timed passes (median reported; one warm-up pass before)")
      ->capture_default_str();
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of the table");
  cmd->callback([opt, exit_code] { *exit_code = Run(*opt); });
}

}  // namespace zinf::bench
