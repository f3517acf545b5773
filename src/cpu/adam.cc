// AdamStep: argument checks, the per-call constants (in double, rounded once),
// and the block-parallel dispatch to the kernels of the chosen SIMD level.
#include "cpu/adam.h"

#include <cmath>
#include <string>

#include "cpu/kernel_args.h"
#include "cpu/kernels.h"
#include "cpu/parallel_blocks.h"

namespace zinf::cpu {
namespace {

bool FiniteNonNegative(double x) { return std::isfinite(x) && x >= 0.0; }

Status CheckOptions(const AdamOptions& o, int64_t step, double grad_scale) {
  auto bad = [](const std::string& what) { return InvalidArgument("Adam: " + what); };
  if (!FiniteNonNegative(o.lr)) return bad("lr must be finite and >= 0, got " + std::to_string(o.lr));
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0)) return bad("beta1 must be in [0, 1), got " + std::to_string(o.beta1));
  if (!(o.beta2 >= 0.0 && o.beta2 < 1.0)) return bad("beta2 must be in [0, 1), got " + std::to_string(o.beta2));
  if (!(o.eps > 0.0 && std::isfinite(o.eps))) return bad("eps must be finite and > 0, got " + std::to_string(o.eps));
  if (!FiniteNonNegative(o.weight_decay)) {
    return bad("weight_decay must be finite and >= 0, got " + std::to_string(o.weight_decay));
  }
  if (step < 1) return bad("step must be >= 1 (the first step is 1), got " + std::to_string(step));
  if (!FiniteNonNegative(grad_scale)) {
    return bad("grad_scale must be finite and >= 0, got " + std::to_string(grad_scale));
  }
  return Status::Ok();
}

}  // namespace

Result<math::AdamStepConstants> MakeAdamStepConstants(const AdamOptions& options, int64_t step, double grad_scale) {
  ZINF_RETURN_IF_ERROR(CheckOptions(options, step, grad_scale));
  const double t = static_cast<double>(step);
  const double bc1 = options.bias_correction ? 1.0 - std::pow(options.beta1, t) : 1.0;
  const double bc2 = options.bias_correction ? 1.0 - std::pow(options.beta2, t) : 1.0;
  math::AdamStepConstants c;
  c.grad_scale = static_cast<float>(grad_scale);
  c.beta1 = static_cast<float>(options.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - options.beta1);
  c.beta2 = static_cast<float>(options.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - options.beta2);
  c.eps = static_cast<float>(options.eps);
  // beta == 0 makes a bias correction exactly 1; otherwise 1 - beta^t > 0.
  c.step_size = static_cast<float>(options.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.weight_decay = static_cast<float>(options.weight_decay);
  c.decay_factor = static_cast<float>(1.0 - options.lr * options.weight_decay);
  if (options.weight_decay == 0.0) {
    c.decay = math::AdamDecay::kNone;
  } else {
    c.decay = options.mode == AdamMode::kAdamW ? math::AdamDecay::kDecoupled : math::AdamDecay::kL2;
  }
  return c;
}

Status AdamStep(tbb::task_arena& arena, const AdamOptions& options, int64_t step, double grad_scale,
                const AdamBuffers& buffers, SimdLevel level) {
  ZINF_ASSIGN_OR_RETURN(const math::AdamStepConstants constants, MakeAdamStepConstants(options, step, grad_scale));
  return AdamStep(arena, constants, buffers, level);
}

Status AdamStep(tbb::task_arena& arena, const math::AdamStepConstants& constants, const AdamBuffers& b,
                SimdLevel level) {
  ZINF_RETURN_IF_ERROR(cpu::CheckSimdLevel(level));
  const size_t n = b.num_elems;
  if (n == 0) return Status::Ok();
  if (!b.params || !b.exp_avg || !b.exp_avg_sq || !b.grads) {
    return InvalidArgument("Adam: params, exp_avg, exp_avg_sq and grads must not be null (" + std::to_string(n) +
                           " elements)");
  }
  ZINF_RETURN_IF_ERROR(cpu::CheckDType(b.grad_dtype, "Adam: grads"));
  cpu::ParamCopy copy = cpu::ParamCopy::kNone;
  if (b.param_copy) {
    ZINF_RETURN_IF_ERROR(cpu::CheckDType(b.param_copy_dtype, "Adam: param_copy"));
    copy = b.param_copy_dtype == DType::kBFloat16  ? cpu::ParamCopy::kBf16
           : b.param_copy_dtype == DType::kFloat16 ? cpu::ParamCopy::kFp16
                                                   : cpu::ParamCopy::kFp32;
  }
  const size_t copy_bytes = b.param_copy ? DTypeSizeBytes(b.param_copy_dtype) : 0;
  ZINF_RETURN_IF_ERROR(cpu::CheckNoOverlap({{b.params, n * 4, "params"},
                                            {b.exp_avg, n * 4, "exp_avg"},
                                            {b.exp_avg_sq, n * 4, "exp_avg_sq"},
                                            {b.grads, n * DTypeSizeBytes(b.grad_dtype), "grads"},
                                            {b.param_copy, n * copy_bytes, "param_copy"}})
                           .WithContext("Adam"));
  const cpu::AdamKernelFn kernel = cpu::Kernels(level).adam[static_cast<int>(b.grad_dtype)][static_cast<int>(copy)];
  const size_t grad_bytes = DTypeSizeBytes(b.grad_dtype);
  const size_t bytes_per_elem = 24 + grad_bytes + copy_bytes;
  cpu::ParallelForBlocks(arena, n, bytes_per_elem, [&](size_t begin, size_t end) {
    kernel(constants, b.params + begin, b.exp_avg + begin, b.exp_avg_sq + begin,
           static_cast<const unsigned char*>(b.grads) + begin * grad_bytes,
           b.param_copy ? static_cast<unsigned char*>(b.param_copy) + begin * copy_bytes : nullptr, end - begin);
  });
  return Status::Ok();
}

}  // namespace zinf::cpu
