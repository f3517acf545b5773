// Fixed-width vector types in GCC's vector extensions, for the benchmarks'
// reference kernels (stream_bound_impl.h, ds_adam_reference_impl.h), whose
// translation units fix the instruction set. Types only.
#pragma once

#include <cstdint>

namespace zinf::bench {

template <int kFloats>
struct Vec {
  typedef float F __attribute__((vector_size(kFloats * 4)));
  typedef uint32_t U32 __attribute__((vector_size(kFloats * 4)));
  typedef uint16_t U16 __attribute__((vector_size(kFloats * 2)));
};

}  // namespace zinf::bench
