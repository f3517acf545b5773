// The kernels behind ds_adam_reference.h, written once over a small policy of
// vector operations (`Ops`: V, kWidth, Load, Store, Set, Mul, Fma, Sqrt, Div,
// StoreBf16, StoreFp16) and instantiated by one translation unit per
// instruction set (ds_adam_reference_avx512.cc with VecOps<16>, _avx2.cc with
// VecOps<8>, ds_adam_reference.cc with ScalarOps), each compiled with that
// set's flags, as the streaming bound's are. Everything has internal linkage, so no function
// compiled for one set can be merged into code that runs on another.
//
// The update of one vector is DeepSpeed cpu_adam's sequence (the shape of
// Step_AVX in DeepSpeed csrc/includes/cpu_adam.h / csrc/adam/cpu_adam_impl.cpp,
// re-implemented here), with fused multiply-adds where it has them:
//   g = g * grad_scale                       (when a loss scale is folded in)
//   [Adam]  g = fma(p, weight_decay, g)
//   m = fma(g, 1 - beta1, m * beta1)
//   v = fma(g * g, 1 - beta2, v * beta2)
//   d = fma(sqrt(v), 1 / sqrt(1 - beta2^t), eps)
//   [AdamW] p = fma(p, -lr * weight_decay, p)
//   p = fma(m / d, -lr / (1 - beta1^t), p)
// Thread-safety: pure functions over disjoint ranges.
#pragma once

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "bench/ds_adam_reference.h"
#include "bench/vec_types.h"
#include "common/float16.h"

namespace zinf::bench {
namespace {

// One float a "vector": the scalar tail of every level and the whole of the
// scalar level. Fused where the translation unit may use FMA instructions.
struct ScalarOps {
  using V = float;
  static constexpr size_t kWidth = 1;
  static V Load(const float* p) { return *p; }
  static void Store(float* p, V x) { *p = x; }
  static V Set(float x) { return x; }
  static V Mul(V a, V b) { return a * b; }
#if defined(__FMA__)
  static V Fma(V a, V b, V c) { return std::fma(a, b, c); }
#else
  static V Fma(V a, V b, V c) { return a * b + c; }  // -ffp-contract=off: two roundings
#endif
  static V Sqrt(V a) { return std::sqrt(a); }
  static V Div(V a, V b) { return a / b; }
  static void StoreBf16(uint16_t* p, V x) { *p = FloatToBf16Bits(x); }
  static void StoreFp16(uint16_t* p, V x) { *p = FloatToHalfBits(x); }
};

#if defined(__x86_64__)
// kFloats-wide vectors (GCC's vector extensions); FMA, sqrt and the fp16
// conversion in AVX-512 (16 floats) or AVX2 + FMA + F16C (8) intrinsics,
// since -ffp-contract=off never fuses `a * b + c`. Instantiated only by the
// translation unit compiled for that width's instruction set.
template <int kFloats>
struct VecOps {
  static_assert(kFloats == 8 || kFloats == 16);
  using V = typename Vec<kFloats>::F;
  using U = typename Vec<kFloats>::U32;
  using H = typename Vec<kFloats>::U16;
  static constexpr size_t kWidth = kFloats;
  static V Load(const float* p) {
    V x;
    std::memcpy(&x, p, sizeof x);
    return x;
  }
  static void Store(float* p, V x) { std::memcpy(p, &x, sizeof x); }
  static V Set(float x) { return V{} + x; }
  static V Mul(V a, V b) { return a * b; }
  static V Div(V a, V b) { return a / b; }
  static V Fma(V a, V b, V c) {
    if constexpr (kFloats == 16) {
      return _mm512_fmadd_ps(a, b, c);
    } else {
      return _mm256_fmadd_ps(a, b, c);
    }
  }
  static V Sqrt(V a) {
    if constexpr (kFloats == 16) {
      return _mm512_sqrt_ps(a);
    } else {
      return _mm256_sqrt_ps(a);
    }
  }
  // Round to nearest even (float16.h: FloatToBf16Bits) in integer arithmetic,
  // as no AVX512_BF16 is assumed; NaN quieted, its top payload kept.
  static void StoreBf16(uint16_t* p, V x) {
    U u;
    std::memcpy(&u, &x, sizeof u);
    const U rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const U bits = (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded;
    const H h = __builtin_convertvector(bits, H);
    std::memcpy(p, &h, sizeof h);
  }
  static void StoreFp16(uint16_t* p, V x) {  // vcvtps2ph, round to nearest even
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    if constexpr (kFloats == 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, kRound));
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, kRound));
    }
  }
};
#endif

// Runs fn(lo, hi) over [begin, end), a multiple of `block` elements, one tile
// of kDsTileElems at a time; a tile's blocks are split as OpenMP's static
// schedule splits a loop of `blocks` iterations over T threads: thread k gets
// blocks/T consecutive blocks, one more if k < blocks % T.
template <class Fn>
void ForStaticTiles(tbb::task_arena& arena, size_t begin, size_t end, size_t block, const Fn& fn) {
  const size_t threads = static_cast<size_t>(arena.max_concurrency());
  for (size_t t = begin; t < end; t += kDsTileElems) {
    const size_t tile_end = std::min(end, t + kDsTileElems);
    const size_t blocks = (tile_end - t) / block, q = blocks / threads, r = blocks % threads;
    arena.execute([&] {
      tbb::parallel_for(
          size_t{0}, threads,
          [&](size_t k) {
            const size_t first = k * q + std::min(k, r), count = q + (k < r ? 1 : 0);
            if (count > 0) fn(t + first * block, t + (first + count) * block);
          },
          tbb::static_partitioner());
    });
  }
}

template <class Ops>
struct DsKernel {
  using V = typename Ops::V;
  static constexpr size_t W = Ops::kWidth;

  struct Coefs {
    explicit Coefs(const DsAdamConstants& c)
        : grad_scale(Ops::Set(c.base.grad_scale)),
          beta1(Ops::Set(c.base.beta1)),
          one_minus_beta1(Ops::Set(c.base.one_minus_beta1)),
          beta2(Ops::Set(c.base.beta2)),
          one_minus_beta2(Ops::Set(c.base.one_minus_beta2)),
          eps(Ops::Set(c.base.eps)),
          inv_sqrt_bc2(Ops::Set(c.base.inv_sqrt_bc2)),
          neg_step_size(Ops::Set(c.neg_step_size)),
          weight_decay(Ops::Set(c.base.weight_decay)),
          decay_term(Ops::Set(c.decay_term)),
          scale(c.base.grad_scale != 1.0f),
          l2(c.base.decay == math::AdamDecay::kL2),
          decoupled(c.base.decay == math::AdamDecay::kDecoupled) {}
    V grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_sqrt_bc2, neg_step_size, weight_decay,
        decay_term;
    bool scale, l2, decoupled;
  };

  static void Update(const Coefs& k, V g, V& p, V& m, V& v) {
    if (k.scale) g = Ops::Mul(g, k.grad_scale);
    if (k.l2) g = Ops::Fma(p, k.weight_decay, g);
    m = Ops::Fma(g, k.one_minus_beta1, Ops::Mul(m, k.beta1));
    v = Ops::Fma(Ops::Mul(g, g), k.one_minus_beta2, Ops::Mul(v, k.beta2));
    const V denom = Ops::Fma(Ops::Sqrt(v), k.inv_sqrt_bc2, k.eps);
    if (k.decoupled) p = Ops::Fma(p, k.decay_term, p);
    p = Ops::Fma(Ops::Div(m, denom), k.neg_step_size, p);
  }

  // [lo, hi) in blocks of kSpan vectors: all loads of a block, its kSpan
  // updates, then all its stores.
  template <int kSpan>
  static void AdamBlocks(const Coefs& k, const cpu::AdamBuffers& b, size_t lo, size_t hi) {
    const float* grads = static_cast<const float*>(b.grads);
    for (size_t i = lo; i < hi; i += W * kSpan) {
      V g[kSpan], p[kSpan], m[kSpan], v[kSpan];
#pragma GCC unroll 8
      for (int j = 0; j < kSpan; ++j) {
        g[j] = Ops::Load(grads + i + j * W);
        m[j] = Ops::Load(b.exp_avg + i + j * W);
        v[j] = Ops::Load(b.exp_avg_sq + i + j * W);
        p[j] = Ops::Load(b.params + i + j * W);
      }
#pragma GCC unroll 8
      for (int j = 0; j < kSpan; ++j) Update(k, g[j], p[j], m[j], v[j]);
#pragma GCC unroll 8
      for (int j = 0; j < kSpan; ++j) {
        Ops::Store(b.params + i + j * W, p[j]);
        Ops::Store(b.exp_avg + i + j * W, m[j]);
        Ops::Store(b.exp_avg_sq + i + j * W, v[j]);
      }
    }
  }

  template <bool kBf16, int kSpan>
  static void CopyBlocks(const float* params, uint16_t* copy, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i += W * kSpan) {
      V x[kSpan];
#pragma GCC unroll 8
      for (int j = 0; j < kSpan; ++j) x[j] = Ops::Load(params + i + j * W);
#pragma GCC unroll 8
      for (int j = 0; j < kSpan; ++j) {
        if constexpr (kBf16) {
          Ops::StoreBf16(copy + i + j * W, x[j]);
        } else {
          Ops::StoreFp16(copy + i + j * W, x[j]);
        }
      }
    }
  }

  // The largest prefix of [done, n) made of whole kSpan blocks, in tiles;
  // returns the new `done`.
  template <int kSpan>
  static size_t AdamSpan(tbb::task_arena& arena, const Coefs& k, const cpu::AdamBuffers& b, size_t done) {
    const size_t block = W * kSpan, end = done + (b.num_elems - done) / block * block;
    ForStaticTiles(arena, done, end, block, [&](size_t lo, size_t hi) { AdamBlocks<kSpan>(k, b, lo, hi); });
    return end;
  }

  template <bool kBf16, int kSpan>
  static size_t CopySpan(tbb::task_arena& arena, const cpu::AdamBuffers& b, size_t done) {
    const size_t block = W * kSpan, end = done + (b.num_elems - done) / block * block;
    uint16_t* copy = static_cast<uint16_t*>(b.param_copy);
    ForStaticTiles(arena, done, end, block,
                   [&](size_t lo, size_t hi) { CopyBlocks<kBf16, kSpan>(b.params, copy, lo, hi); });
    return end;
  }

  // Spans of 8, then 4, then 1 vectors, then the scalar tail on this thread.
  static void Adam(tbb::task_arena& arena, const DsAdamConstants& c, const cpu::AdamBuffers& b) {
    const Coefs k(c);
    size_t done = AdamSpan<8>(arena, k, b, 0);
    done = AdamSpan<4>(arena, k, b, done);
    done = AdamSpan<1>(arena, k, b, done);
    if (done < b.num_elems)
      DsKernel<ScalarOps>::AdamBlocks<1>(typename DsKernel<ScalarOps>::Coefs(c), b, done, b.num_elems);
  }

  template <bool kBf16>
  static void CopyAs(tbb::task_arena& arena, const cpu::AdamBuffers& b) {
    size_t done = CopySpan<kBf16, 8>(arena, b, 0);
    done = CopySpan<kBf16, 1>(arena, b, done);
    DsKernel<ScalarOps>::CopyBlocks<kBf16, 1>(b.params, static_cast<uint16_t*>(b.param_copy), done, b.num_elems);
  }

  static void Copy(tbb::task_arena& arena, const cpu::AdamBuffers& b) {
    if (b.param_copy_dtype == DType::kBFloat16) {
      CopyAs<true>(arena, b);
    } else {
      CopyAs<false>(arena, b);
    }
  }
};

template <class Ops>
DsAdamKernels KernelsOf(const char* name) {
  return {name, Ops::kWidth, &DsKernel<Ops>::Adam, &DsKernel<Ops>::Copy};
}

}  // namespace
}  // namespace zinf::bench
