// The C ABI of the CPU Adam/AdamW (DeepSpeed's DeepSpeedCPUAdam): a oneTBB
// arena owned by the handle, and AdamStep over the caller's buffers.
// Thread-safety: any thread; tbb::task_arena::execute may be entered
// concurrently, and AdamStep is safe on disjoint buffers.
#include <oneapi/tbb/task_arena.h>

#include <memory>
#include <string>

#include "capi/capi_internal.h"
#include "cpu/adam.h"
#include "zinf/zinf.h"

struct zinf_adam {
  explicit zinf_adam(int threads) : arena(threads) {}
  tbb::task_arena arena;
};

using zinf::Status;
using zinf::capi::Guard;
using zinf::capi::GuardVoid;
using zinf::capi::NotNull;

extern "C" {

ZINF_API void zinf_adam_options_default(zinf_adam_options* out) {
  if (!out) return;
  const zinf::cpu::AdamOptions d;
  out->lr = d.lr;
  out->beta1 = d.beta1;
  out->beta2 = d.beta2;
  out->eps = d.eps;
  out->weight_decay = d.weight_decay;
  out->adamw_mode = d.mode == zinf::cpu::AdamMode::kAdamW ? 1 : 0;
  out->bias_correction = d.bias_correction ? 1 : 0;
}

ZINF_API int zinf_adam_create(int num_threads, zinf_adam** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    if (num_threads < 0) {
      return zinf::InvalidArgument("num_threads is " + std::to_string(num_threads) + "; expected >= 0 (0: all cores)");
    }
    *out = new zinf_adam(num_threads == 0 ? tbb::task_arena::automatic : num_threads);
    return Status::Ok();
  });
}

ZINF_API void zinf_adam_destroy(zinf_adam* adam) {
  GuardVoid([&] { delete adam; });
}

ZINF_API int zinf_adam_step(zinf_adam* adam, const zinf_adam_options* options, int64_t step, double grad_scale,
                            float* params, float* exp_avg, float* exp_avg_sq, const void* grads, zinf_dtype grad_dtype,
                            void* param_copy, zinf_dtype param_copy_dtype, size_t num_elems) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(adam, "adam"));
    ZINF_RETURN_IF_ERROR(NotNull(options, "options"));
    if (grad_dtype < ZINF_DTYPE_FP32 || grad_dtype > ZINF_DTYPE_FP16) {
      return zinf::InvalidArgument("grad_dtype " + std::to_string(static_cast<int>(grad_dtype)) +
                                   " is not a zinf_dtype");
    }
    if (param_copy && param_copy_dtype != ZINF_DTYPE_BF16 && param_copy_dtype != ZINF_DTYPE_FP16) {
      return zinf::InvalidArgument("param_copy_dtype must be ZINF_DTYPE_BF16 or ZINF_DTYPE_FP16");
    }
    zinf::cpu::AdamOptions o;
    o.lr = options->lr;
    o.beta1 = options->beta1;
    o.beta2 = options->beta2;
    o.eps = options->eps;
    o.weight_decay = options->weight_decay;
    o.mode = options->adamw_mode ? zinf::cpu::AdamMode::kAdamW : zinf::cpu::AdamMode::kAdam;
    o.bias_correction = options->bias_correction != 0;
    zinf::cpu::AdamBuffers b;
    b.params = params;
    b.exp_avg = exp_avg;
    b.exp_avg_sq = exp_avg_sq;
    b.grads = grads;
    b.grad_dtype = static_cast<zinf::DType>(grad_dtype);
    b.param_copy = param_copy;
    if (param_copy) b.param_copy_dtype = static_cast<zinf::DType>(param_copy_dtype);
    b.num_elems = num_elems;
    return zinf::cpu::AdamStep(adam->arena, o, step, grad_scale, b);
  });
}

}  // extern "C"
