// Shared by the libFuzzer targets: splitting an input into the files of a
// multi-file format (NUL separates them: no JSON text holds a raw NUL), the
// check every rejection must pass (a message that names the source), and a
// scratch directory per process for targets that need files.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/logging.h"
#include "zinf/status.h"

namespace zinf::fuzz {

// A broken promise of the code under test: abort, so libFuzzer keeps the input.
#define ZINF_FUZZ_CHECK(cond, what)                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "fuzz check failed at %s:%d: %s: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                                \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// The parts of `text` between NULs, at most `max_parts` (the last keeps the rest).
inline std::vector<std::string_view> SplitParts(std::string_view text, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t nul = text.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(text.substr(0, nul));
    text.remove_prefix(nul + 1);
  }
  parts.push_back(text);
  return parts;
}

// Every rejection is an answer: a message that names the source (at its
// start, or after the operation for an I/O error: "open PATH: ...") and says
// something more.
// With ZINF_FUZZ_SHOW=1 in the environment each rejection is printed, to see
// what a seed or a crash input gets as its answer.
inline void CheckRejection(const Status& s, std::string_view source) {
  static const bool show = std::getenv("ZINF_FUZZ_SHOW") != nullptr;
  if (show) std::fprintf(stderr, "rejected: %s\n", s.ToString().substr(0, 400).c_str());
  ZINF_FUZZ_CHECK(!s.ok(), "an error without a status");
  const std::string& m = s.message();
  ZINF_FUZZ_CHECK(m.size() > source.size() + 2 && m.find(source) != std::string::npos,
                  "the message does not name " + std::string(source) + ": " + m.substr(0, 200));
}

// A directory of this process's own, removed at exit ($TMPDIR, else /dev/shm
// when present so that the writes cost no disk, else /tmp).
inline const std::string& ScratchDir() {
  struct Scratch {
    std::string dir;
    ~Scratch() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  };
  static const Scratch scratch = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string base = tmp && *tmp ? tmp : std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    Scratch s{base + "/zinf-fuzz-" + std::to_string(::getpid())};
    std::filesystem::create_directories(s.dir);
    return s;
  }();
  return scratch.dir;
}

// Quiet logs: warnings about the fuzzed files are expected, and slow.
inline void QuietLogs() { (void)SetLogLevel("off"); }

}  // namespace zinf::fuzz
