// The streaming kernels behind stream_bound.h, written once over the vector
// width and instantiated by one translation unit per instruction set
// (stream_bound_sse2.cc, _avx2.cc, _avx512.cc), each compiled with that set's
// flags, as src/cpu's kernels are. Everything has internal linkage, so no
// function compiled for one set can be merged into code that runs on another.
// GCC vector extensions (vec_types.h) give explicit widths without intrinsics.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bench/stream_bound.h"
#include "bench/vec_types.h"

namespace zinf::bench {
namespace {

// Per element: x += s * g for each of params, exp_avg and exp_avg_sq (read and
// written), g read from the gradient (16-bit values widened by a shift), and
// the top half of the new param written as the 16-bit copy: Adam's bytes,
// with arithmetic that can never be the limit.
// The copy is written, never read: like the Adam kernel, stream it past the
// cache (non-temporal stores), so it costs its own bytes and no read for
// ownership. `p` is aligned to sizeof(V): chunks start on 16-element lines.
template <class V>
void StoreWriteOnly(uint16_t* p, const V& v) {
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) {
    __m256i x;
    std::memcpy(&x, &v, 32);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), x);
    return;
  }
#endif
#if defined(__SSE2__)
  if constexpr (sizeof(V) == 16) {
    __m128i x;
    std::memcpy(&x, &v, 16);
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), x);
    return;
  } else if constexpr (sizeof(V) == 8) {
    long long x;
    std::memcpy(&x, &v, 8);
    _mm_stream_si64(reinterpret_cast<long long*>(p), x);
    return;
  }
#endif
  std::memcpy(p, &v, sizeof v);
}

template <int W, int U, bool k16BitGrad, bool kCopy>
void StreamChunk(const cpu::AdamBuffers& a, size_t lo, size_t hi) {
  using F = typename Vec<W>::F;
  using U32 = typename Vec<W>::U32;
  using U16 = typename Vec<W>::U16;
  float* __restrict p = a.params;
  float* __restrict m = a.exp_avg;
  float* __restrict v = a.exp_avg_sq;
  const unsigned char* __restrict g = static_cast<const unsigned char*>(a.grads);
  uint16_t* __restrict c = static_cast<uint16_t*>(a.param_copy);
  const F s = F{} + 1e-7f;
  size_t i = lo;
  for (; i + size_t{W} * U <= hi; i += size_t{W} * U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const size_t j = i + static_cast<size_t>(u) * W;
      F gv;
      if constexpr (k16BitGrad) {
        U16 h;
        std::memcpy(&h, g + j * 2, sizeof h);
        const U32 wide = __builtin_convertvector(h, U32) << 16;
        std::memcpy(&gv, &wide, sizeof gv);
      } else {
        std::memcpy(&gv, g + j * 4, sizeof gv);
      }
      F x, y, z;
      std::memcpy(&x, p + j, sizeof x);
      std::memcpy(&y, m + j, sizeof y);
      std::memcpy(&z, v + j, sizeof z);
      x += s * gv;
      y += s * gv;
      z += s * gv;
      std::memcpy(p + j, &x, sizeof x);
      std::memcpy(m + j, &y, sizeof y);
      std::memcpy(v + j, &z, sizeof z);
      if constexpr (kCopy) {
        U32 bits;
        std::memcpy(&bits, &x, sizeof bits);
        const U16 top = __builtin_convertvector(bits >> 16, U16);
        StoreWriteOnly(c + j, top);
      }
    }
  }
  if constexpr (kCopy) {
#if defined(__SSE2__)
    _mm_sfence();  // the streamed stores are ordered before the pass is timed as done
#endif
  }
  for (; i < hi; ++i) {
    float gs;
    if constexpr (k16BitGrad) {
      uint16_t h;
      std::memcpy(&h, g + i * 2, 2);
      const uint32_t wide = uint32_t{h} << 16;
      std::memcpy(&gs, &wide, 4);
    } else {
      std::memcpy(&gs, g + i * 4, 4);
    }
    p[i] += 1e-7f * gs;
    m[i] += 1e-7f * gs;
    v[i] += 1e-7f * gs;
    if constexpr (kCopy) {
      uint32_t bits;
      std::memcpy(&bits, p + i, 4);
      c[i] = static_cast<uint16_t>(bits >> 16);
    }
  }
}

template <int W, int U, bool k16BitGrad, bool kCopy, bool kStatic>
double TimeStream(tbb::task_arena& arena, const cpu::AdamBuffers& a) {
  const size_t n = a.num_elems;
  const auto t0 = std::chrono::steady_clock::now();
  arena.execute([&] {
    if constexpr (kStatic) {
      // One contiguous chunk per thread, split on 64-byte (16-float) lines.
      const size_t threads = static_cast<size_t>(arena.max_concurrency());
      const size_t lines = (n + 15) / 16;
      tbb::parallel_for(
          size_t{0}, threads,
          [&](size_t t) {
            const size_t lo = std::min(n, lines * t / threads * 16), hi = std::min(n, lines * (t + 1) / threads * 16);
            StreamChunk<W, U, k16BitGrad, kCopy>(a, lo, hi);
          },
          tbb::static_partitioner());
    } else {
      // Tasks of at least 64 Ki elements, split on 16-element lines too.
      const size_t lines = (n + 15) / 16;
      tbb::parallel_for(tbb::blocked_range<size_t>(0, lines, size_t{4096}), [&](const tbb::blocked_range<size_t>& r) {
        StreamChunk<W, U, k16BitGrad, kCopy>(a, r.begin() * 16, std::min(n, r.end() * 16));
      });
    }
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Dispatches on the arrays' gradient type and copy at run time.
template <int W, int U, bool kStatic>
double TimeStreamAny(tbb::task_arena& arena, const cpu::AdamBuffers& a) {
  const bool g16 = a.grad_dtype != DType::kFloat32, copy = a.param_copy != nullptr;
  if (g16) {
    return copy ? TimeStream<W, U, true, true, kStatic>(arena, a) : TimeStream<W, U, true, false, kStatic>(arena, a);
  }
  return copy ? TimeStream<W, U, false, true, kStatic>(arena, a) : TimeStream<W, U, false, false, kStatic>(arena, a);
}

// The four variants of width W floats, named with the instruction set.
template <int W>
std::vector<StreamVariant> VariantsOfWidth(const std::string& isa) {
  return {{isa + " x1 auto", &TimeStreamAny<W, 1, false>},
          {isa + " x4 auto", &TimeStreamAny<W, 4, false>},
          {isa + " x1 static", &TimeStreamAny<W, 1, true>},
          {isa + " x4 static", &TimeStreamAny<W, 4, true>}};
}

}  // namespace
}  // namespace zinf::bench
