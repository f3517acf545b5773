// Parsing and printing of byte sizes and counts, as users type them on the
// command line and in config files: "4G", "512K", "1.5GiB", "1e9", "4096".
// K, M, G, T, P are binary (1024-based) with or without "B"/"iB" — the
// convention of fio and of DeepSpeed's aio sizes. Thread-safe (pure).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf {

// A non-negative whole number of bytes. Errors (kInvalidArgument) name the text:
// empty, negative, fractional bytes, unknown suffix, overflow.
Result<uint64_t> ParseSize(std::string_view text);

// A non-negative whole count such as a number of parameters: "124M",
// "1.5B", "7e9", "350K". Suffixes are decimal: K=1e3, M=1e6, G or B=1e9, T=1e12.
Result<uint64_t> ParseCount(std::string_view text);

// A number of model parameters (--params): ParseCount, then at least 1 and
// at most kMaxParamCount, so that the 16 bytes of model state per parameter
// still count in an int64. Errors name the text and the bound.
inline constexpr int64_t kMaxParamCount = int64_t{1} << 59;
Result<int64_t> ParseParamCount(std::string_view text);

// "4.00 GiB", "512 KiB", "17 B".
std::string FormatBytes(uint64_t bytes);

// "1.23 G", "456 M" in powers of 1000, for counts such as parameters.
std::string FormatCount(double count);

}  // namespace zinf
