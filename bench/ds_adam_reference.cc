// The ds-shape reference Adam (ds_adam_reference.h): its per-step constants,
// the choice of kernels by SIMD level, the scalar level (ScalarOps, compiled
// for any target) and the self-check against zinf's AdamStep.
#include "bench/ds_adam_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "bench/ds_adam_reference_impl.h"
#include "common/check.h"
#include "common/float16.h"

namespace zinf::bench {

DsAdamKernels DsAdamKernelsAvx2();
DsAdamKernels DsAdamKernelsAvx512();

DsAdamConstants MakeDsAdamConstants(const cpu::AdamOptions& o, int64_t step, double grad_scale) {
  auto base = cpu::MakeAdamStepConstants(o, step, grad_scale);
  ZINF_CHECK(base.ok());
  DsAdamConstants c;
  c.base = *base;
  c.neg_step_size = -base->step_size;
  c.decay_term = static_cast<float>(-o.lr * o.weight_decay);
  return c;
}

DsAdamKernels DsAdamKernelsFor(cpu::SimdLevel level) {
#if defined(__x86_64__)
  if (level >= cpu::SimdLevel::kAvx512) return DsAdamKernelsAvx512();
  if (level >= cpu::SimdLevel::kAvx2 && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    return DsAdamKernelsAvx2();
  }
#else
  (void)level;
#endif
  return KernelsOf<ScalarOps>("scalar");
}

void DsAdamStep(tbb::task_arena& arena, const DsAdamKernels& k, const DsAdamConstants& c, const cpu::AdamBuffers& b) {
  ZINF_CHECK(b.grad_dtype == DType::kFloat32);
  k.adam(arena, c, b);
  if (b.param_copy) k.copy(arena, b);
}

size_t DsAdamBytesPerParam(bool with_copy) { return with_copy ? 34 : 28; }

std::string DsAdamDescription(const DsAdamKernels& k, bool with_copy) {
  char line[512];
  std::snprintf(line, sizeof line,
                "our re-implementation of DeepSpeed cpu_adam's kernel shape (not its code): %s, %zu floats x span 8, "
                "FMA, each 128 Mi-element tile split statically over the threads; fp32 gradient, %s, %zu B/param; "
                "agrees with zinf's Adam within 1e-5 after one step (checked at start)",
                k.name.c_str(), k.floats_per_vector,
                with_copy ? "then a second pass writes the copy from the fp32 params" : "one pass",
                DsAdamBytesPerParam(with_copy));
  return line;
}

namespace {

// |a - b| within rel * scale; NaN never is.
bool Close(double a, double b, double rel, double scale) { return std::fabs(a - b) <= rel * scale; }

float Widen16(uint16_t h, DType dtype) { return dtype == DType::kBFloat16 ? Bf16BitsToFloat(h) : HalfBitsToFloat(h); }

}  // namespace

Status DsAdamSelfCheck(int threads, const DsAdamKernels& k, const cpu::AdamOptions& options, double grad_scale,
                       DType grad_dtype, bool with_copy, DType copy_dtype, cpu::SimdLevel level) {
  tbb::task_arena arena(threads);
  // Whole 8-, 4- and 1-vector spans at 16 and at 8 floats a vector, and a scalar tail.
  const size_t n = (size_t{1} << 20) + 128 * 2 + 64 + 16 + 7;
  std::vector<float> p0(n), m0(n), v0(n), grads32(n);
  std::vector<uint16_t> grads16(grad_dtype == DType::kFloat32 ? 0 : n);
  for (size_t i = 0; i < n; ++i) {
    float g = static_cast<float>(static_cast<int>((i * 2654435761u) % 2001) - 1000) * 1e-3f + 0.5f;
    const float h = static_cast<float>(static_cast<int>((i * 40503u) % 1999) - 999) * 1e-3f;
    if (grad_dtype != DType::kFloat32) {
      grads16[i] = grad_dtype == DType::kBFloat16 ? FloatToBf16Bits(g) : FloatToHalfBits(g);
      g = Widen16(grads16[i], grad_dtype);  // the reference reads the same values as fp32
    }
    grads32[i] = g;
    // Every other element starts from zero state, where the gradient's terms make all of m and v (in a
    // running state 0.999 v dominates them); the others from a state of the scaled gradient's size.
    const bool fresh = i % 2 == 0;
    p0[i] = 0.01f * g + 0.003f * h;
    m0[i] = fresh ? 0.0f : 1e-3f * h;
    v0[i] = fresh ? 0.0f : 1e-6f * h * h + 1e-9f;
  }
  std::vector<float> zp = p0, zm = m0, zv = v0, rp = p0, rm = m0, rv = v0;
  std::vector<uint16_t> zcopy(with_copy ? n : 0), rcopy(with_copy ? n : 0);
  cpu::AdamBuffers zb;
  zb.params = zp.data();
  zb.exp_avg = zm.data();
  zb.exp_avg_sq = zv.data();
  zb.grads = grad_dtype == DType::kFloat32 ? static_cast<const void*>(grads32.data()) : grads16.data();
  zb.grad_dtype = grad_dtype;
  zb.param_copy = with_copy ? zcopy.data() : nullptr;
  zb.param_copy_dtype = copy_dtype;
  zb.num_elems = n;
  cpu::AdamBuffers rb = zb;
  rb.params = rp.data();
  rb.exp_avg = rm.data();
  rb.exp_avg_sq = rv.data();
  rb.grads = grads32.data();
  rb.grad_dtype = DType::kFloat32;
  rb.param_copy = with_copy ? rcopy.data() : nullptr;
  ZINF_RETURN_IF_ERROR(cpu::AdamStep(arena, options, 1, grad_scale, zb, level));
  const DsAdamConstants c = MakeDsAdamConstants(options, 1, grad_scale);
  DsAdamStep(arena, k, c, rb);

  const double copy_rel = copy_dtype == DType::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;  // one rounding step
  auto mismatch = [&](size_t i, const char* what, double z, double r) {
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "ds-shape reference (%s) disagrees with zinf's Adam at element %zu of %zu: %s %.9g "
                  "(zinf) vs %.9g (reference)",
                  k.name.c_str(), i, n, what, z, r);
    return Internal(msg);
  };
  for (size_t i = 0; i < n; ++i) {
    // Scales: the magnitudes of the terms each result sums, so a cancellation does not shrink them.
    const double g = static_cast<double>(grads32[i]) * grad_scale;
    const double m_scale = c.base.beta1 * std::fabs(m0[i]) + c.base.one_minus_beta1 * std::fabs(g);
    const double step = -c.neg_step_size * std::fabs(zm[i]) / (std::sqrt(zv[i]) * c.base.inv_sqrt_bc2 + c.base.eps);
    const double p_scale = std::fabs(p0[i]) + std::fabs(zp[i]) + step;
    if (!Close(zm[i], rm[i], 1e-5, m_scale)) return mismatch(i, "exp_avg", zm[i], rm[i]);
    if (!Close(zv[i], rv[i], 1e-5, std::fabs(zv[i]))) return mismatch(i, "exp_avg_sq", zv[i], rv[i]);
    if (!Close(zp[i], rp[i], 1e-5, p_scale)) return mismatch(i, "params", zp[i], rp[i]);
    if (with_copy) {
      const double z = Widen16(zcopy[i], copy_dtype), r = Widen16(rcopy[i], copy_dtype);
      // fp16's subnormal steps are 2^-24 apart, whatever the value.
      if (std::fabs(z - r) > copy_rel * std::max(std::fabs(z), std::fabs(r)) + 0x1p-24) {
        return mismatch(i, "param copy", z, r);
      }
    }
  }
  return Status::Ok();
}

}  // namespace zinf::bench
