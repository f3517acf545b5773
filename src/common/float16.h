// Scalar conversions between fp32 and the two 16-bit float formats, by exact
// bit manipulation: bf16 (bfloat16) and fp16 (IEEE binary16). These are the
// reference ("slow twin") the SIMD casts in src/cpu/kernels_*.cc must match bit
// for bit, and they compile for the GPU too (ZINF_HOST_DEVICE).
//
// Rules, identical on every SIMD level:
//  - fp32 -> 16 bit rounds to nearest, ties to even; subnormal results are
//    produced (no flush to zero); overflow gives ±inf.
//  - NaN stays NaN: the sign and the top payload bits are kept and the quiet
//    bit is set (what x86 F16C's vcvtps2ph/vcvtph2ps do). bf16 -> fp32 is a
//    pure 16-bit shift, so a signalling bf16 NaN stays signalling.
//  - Widening (bf16/fp16 -> fp32) is exact.
//  - No result depends on the FTZ/DAZ state: only integer operations, and one
//    multiplication whose operands and result are normal numbers.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace zinf {

ZINF_HOST_DEVICE inline uint32_t FloatToBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

ZINF_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// bf16 keeps fp32's exponent, so rounding is integer arithmetic on the bits:
// add 0x7fff plus the lowest kept bit (ties to even), then truncate. Carries
// into the exponent are correct (up to ±inf for values beyond bf16's max).
ZINF_HOST_DEVICE inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

ZINF_HOST_DEVICE inline float Bf16BitsToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// fp32 -> fp16 after F. Giesen's float_to_half_fast3_rtne (public domain,
// https://gist.github.com/rygorous/2156668), with NaN payloads kept as F16C does.
ZINF_HOST_DEVICE inline uint16_t FloatToHalfBits(float f) {
  const uint32_t u = FloatToBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  uint32_t h;
  if (a >= 0x47800000u) {  // |f| >= 65536: inf or NaN (finite values here overflow)
    h = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (a < 0x38800000u) {  // |f| < 2^-14: an fp16 subnormal or zero
    // Adding 0.5 aligns the 10 fp16 subnormal bits at the bottom of the fp32
    // mantissa; the fp32 addition does the round-to-nearest-even.
    const float sum = BitsToFloat(a) + 0.5f;
    h = FloatToBits(sum) - 0x3f000000u;
  } else {
    // Rebias the exponent (127 -> 15) and round the 13 dropped bits to even;
    // a carry out of the mantissa correctly bumps the exponent (to inf at most).
    h = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  }
  return static_cast<uint16_t>(h | sign);
}

ZINF_HOST_DEVICE inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // inf, or NaN made quiet
    return BitsToFloat(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x00400000u : 0u));
  }
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact (both factors and the result are
  // normal fp32 numbers).
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
  return BitsToFloat(sign | FloatToBits(magnitude));
}

}  // namespace zinf
