// One element of an fp32, bf16 or fp16 array, widened to fp32 on load and
// rounded to nearest even on store (through common/float16.h). Shared by the
// scalar CPU kernels and the CUDA kernels (ZINF_HOST_DEVICE), so both read
// and write 16-bit data the same way. Header only; pure, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/host_device.h"
#include "common/float16.h"
#include "zinf/dtype.h"

namespace zinf::math {

template <DType kType>
ZINF_HOST_DEVICE inline float LoadAsFloat(const void* base, size_t i) {
  if constexpr (kType == DType::kFloat32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (kType == DType::kBFloat16) {
    return Bf16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
  } else {
    return HalfBitsToFloat(static_cast<const uint16_t*>(base)[i]);
  }
}

template <DType kType>
ZINF_HOST_DEVICE inline void StoreFromFloat(void* base, size_t i, float x) {
  if constexpr (kType == DType::kFloat32) {
    static_cast<float*>(base)[i] = x;
  } else if constexpr (kType == DType::kBFloat16) {
    static_cast<uint16_t*>(base)[i] = FloatToBf16Bits(x);
  } else {
    static_cast<uint16_t*>(base)[i] = FloatToHalfBits(x);
  }
}

}  // namespace zinf::math
