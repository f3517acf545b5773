// The element types zinf moves and computes with: fp32 (master weights,
// optimizer state, host gradients), bf16 and fp16 (the 16-bit compute copy and
// device gradients). Names are the short forms used on the command line and
// in logs ("fp32", "bf16", "fp16"). Header only; pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf {

enum class DType : uint8_t {
  kFloat32 = 0,   // IEEE 754 binary32
  kBFloat16 = 1,  // bfloat16: binary32 with the low 16 mantissa bits dropped
  kFloat16 = 2,   // IEEE 754 binary16
};

// "fp32", "bf16", "fp16".
constexpr std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
  }
  return "?";
}

// Bytes per element: 4, 2, 2.
constexpr size_t DTypeSizeBytes(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Accepts "fp32"/"float32"/"float", "bf16"/"bfloat16", "fp16"/"float16"/"half".
inline Result<DType> ParseDType(std::string_view name) {
  if (name == "fp32" || name == "float32" || name == "float") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::kFloat16;
  return InvalidArgument("unknown dtype '" + std::string(name) + "'; expected fp32, bf16 or fp16");
}

}  // namespace zinf
