// Paths for tests: the source tree, the build tree, and a scratch directory
// for tests that need disk ($ZINF_TEST_DIR when set, else <build>/test-scratch;
// each test stays under 2 GB there); running a command as a user would; and
// the SplitMix64 mixer the tests draw reproducible data from; element i of a
// buffer of any float dtype, widened to fp32.
#pragma once

#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/float16.h"
#include "zinf/dtype.h"

namespace zinf::test {

// SplitMix64's output function (Steele, Lea, Flood 2014): a well-mixed
// 64-bit value from any 64-bit input, for reproducible test data.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// n floats uniform in [lo, hi) (24 random bits each), element i drawn from
// (seed, i) alone.
inline std::vector<float> UniformFloats(uint64_t seed, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bits = SplitMix64(seed * 0x100000001b3ull ^ i);
    v[i] = lo + (hi - lo) * static_cast<float>(bits >> 40) / 16777216.0f;
  }
  return v;
}

// Element i of `data` (fp32, bf16 or fp16 storage) as fp32.
inline float LoadAsFloat(const void* data, DType dtype, int64_t i) {
  const auto* p = static_cast<const unsigned char*>(data);
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dtype == DType::kBFloat16 ? Bf16BitsToFloat(h) : HalfBitsToFloat(h);
}

// n elements of T (value-initialized) starting `offset` elements past a
// 64-byte boundary, whatever the allocator's own alignment: vector
// accesses need the boundary, and offset 1 takes it away on purpose.
template <class T>
class OffsetBuffer {
 public:
  OffsetBuffer(size_t n, size_t offset) : storage_(n + offset + 64 / sizeof(T)) {
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = storage_.data() + ((64 - base % 64) % 64) / sizeof(T) + offset;
    n_ = n;
  }
  OffsetBuffer(const std::vector<T>& values, size_t offset) : OffsetBuffer(values.size(), offset) {
    std::copy(values.begin(), values.end(), data_);
  }
  // Moves keep the heap block data_ points into; a copy would not.
  OffsetBuffer(OffsetBuffer&&) = default;
  OffsetBuffer& operator=(OffsetBuffer&&) = default;
  OffsetBuffer(const OffsetBuffer&) = delete;
  OffsetBuffer& operator=(const OffsetBuffer&) = delete;
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return n_; }
  std::vector<T> Values() const { return std::vector<T>(data_, data_ + n_); }

 private:
  std::vector<T> storage_;
  T* data_ = nullptr;
  size_t n_ = 0;
};

inline std::string SourceDir() { return ZINF_TEST_SOURCE_DIR; }
inline std::string BinaryDir() { return ZINF_TEST_BINARY_DIR; }

// Created on first use.
inline std::string TestDir() {
  const char* env = std::getenv("ZINF_TEST_DIR");
  std::string dir = env && *env ? env : ZINF_TEST_DIR_DEFAULT;
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial = dir.substr(0, i);
      ::mkdir(partial.c_str(), 0755);
    }
  }
  return dir;
}

// The interpreter of scripts/setup's Python environment ($ZINF_PYTHON
// overrides the configured one), which has torch, transformers, tokenizers,
// peft, accelerate and deepspeed from PyPI.
inline std::string Python() {
  const char* env = std::getenv("ZINF_PYTHON");
  return env && *env ? env : ZINF_TEST_PYTHON_DEFAULT;
}

// The folder of real tokenizer.json files (llama3/, qwen3/, llama2/):
// $ZINF_TOKENIZER_DIR, else the configured default (../shared/data/tokenizers
// beside the checkout).
inline std::string TokenizerDir() {
  const char* env = std::getenv("ZINF_TOKENIZER_DIR");
  return env && *env ? env : ZINF_TEST_TOKENIZER_DIR_DEFAULT;
}

// Runs `command` through the shell; returns its exit code (-1 when it did not
// exit normally) and everything it wrote to stdout (redirect stderr in the
// command to capture it too).
struct CommandResult {
  int exit_code;
  std::string output;
};
inline CommandResult RunCommand(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed: " + command};
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Whether Python() runs and imports every module of `modules` (space
// separated), e.g. "torch transformers"; the answer is cached per list.
inline bool PythonHas(const std::string& modules) {
  static std::map<std::string, bool> cache;
  auto it = cache.find(modules);
  if (it != cache.end()) return it->second;
  std::string imports;
  for (size_t pos = 0; pos < modules.size();) {
    size_t end = modules.find(' ', pos);
    if (end == std::string::npos) end = modules.size();
    if (end > pos) imports += (imports.empty() ? "import " : ", ") + modules.substr(pos, end - pos);
    pos = end + 1;
  }
  const bool ok = RunCommand("'" + Python() + "' -c '" + imports + "' >/dev/null 2>&1").exit_code == 0;
  return cache[modules] = ok;
}

// The message of a test that skips for want of PythonHas(modules).
inline std::string PythonMissing(const std::string& modules) {
  return Python() + " cannot import " + modules + " (scripts/setup makes the Python environment)";
}

}  // namespace zinf::test
