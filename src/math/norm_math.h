// The block-and-lane shape of the gradient sum of squares, shared by the CPU
// kernels (kernels_*.cc, norm.cc) and the CUDA norm kernel (gpu/kernels.cu):
// fixed blocks of kNormBlockElems elements, element i of a block squared in
// double (exact) and added to lane i % kNormLanes in element order, the lanes
// combined by CombineNormLanes. Header only; pure functions.
#pragma once

#include <cstddef>

#include "common/host_device.h"

namespace zinf::math {

inline constexpr size_t kNormBlockElems = size_t{64} * 1024;
inline constexpr int kNormLanes = 16;

// The 16 lanes of one block in a fixed pairwise order:
// s[i] = l[i] + l[i+8] (i < 8), then s[i] + s[i+4], s[i] + s[i+2], s[0] + s[1].
ZINF_HOST_DEVICE inline double CombineNormLanes(const double lanes[kNormLanes]) {
  double s[8];
  for (int i = 0; i < 8; ++i) s[i] = lanes[i] + lanes[i + 8];
  for (int i = 0; i < 4; ++i) s[i] = s[i] + s[i + 4];
  for (int i = 0; i < 2; ++i) s[i] = s[i] + s[i + 2];
  return s[0] + s[1];
}

}  // namespace zinf::math
