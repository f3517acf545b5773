// GptDevice: GptModel's stages as tasks on a device stream, with parameters,
// gradients, tokens and the activation arena in device memory — the way the
// engine runs the model. The arena is allocated with Device::Allocate when
// created (so memory_stats() and the budget count it) and freed, stream-
// ordered, when destroyed. Each Enqueue* returns once the task is queued;
// a task translates its device pointers with StreamContext::Host and runs the
// CPU kernels; a failing stage becomes the stream's sticky error.
//
// On HostDevice a task translates its device pointers with
// StreamContext::Host and runs GptModel's CPU kernels. On a CUDA device the
// stages launch CUDA kernels and cuBLAS products on the stream instead
// (exec/gpt_cuda.h): the elementwise and row math is the CPU's
// (math/gpt_math.h, math/decoder_math.h, math/lane_math.h), the matrix
// products are cuBLAS's, so results agree with the CPU within GEMM
// rounding. On CUDA,
// tokens and targets are not range-checked (the CPU path checks them).
//
// Thread-safety: enqueue from one thread at a time (one stream's order is the
// enqueue order). The Device and the Stream must outlive the GptDevice;
// queued tasks keep the model itself alive.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/gpt.h"
#include "zinf/device.h"

namespace zinf::exec {

using model::ActivationLayout;
using model::GptConfig;
using model::GptModel;
using model::GptRunOptions;

// The six stages on one kind of device; every pointer is device memory.
// GptDevice checks arguments and order where it can and forwards here.
class GptStages {
 public:
  virtual ~GptStages() = default;
  virtual Status EmbedForward(const int32_t* tokens, const void* embedding) = 0;
  virtual Status BlockForward(int layer, const void* block) = 0;
  virtual Status HeadForward(const int32_t* targets, const void* final_norm, const void* embedding, float* loss) = 0;
  virtual Status HeadBackward(float loss_scale, const void* final_norm, const void* embedding, void* final_norm_grad,
                              void* embedding_grad) = 0;
  virtual Status BlockBackward(int layer, const void* block, void* block_grad) = 0;
  virtual Status EmbedBackward(void* embedding_grad) = 0;
};

class GptDevice {
 public:
  // kOutOfMemory (from the device) when the arena does not fit the budget.
  static Result<std::unique_ptr<GptDevice>> Create(Device& device, Stream& stream, const GptConfig& config,
                                                   const GptRunOptions& options);
  ~GptDevice();
  GptDevice(const GptDevice&) = delete;
  GptDevice& operator=(const GptDevice&) = delete;

  const GptConfig& config() const { return model_->config(); }
  const ActivationLayout& activation_layout() const { return model_->activation_layout(); }
  uint64_t activation_bytes() const { return model_->activation_bytes(); }
  Stream& stream() { return stream_; }

  // The stages of GptModel (same order and meaning); every pointer is device
  // memory of `device`. `loss` is a device float written by the task.
  Status EnqueueEmbedForward(const int32_t* tokens, const void* embedding);
  Status EnqueueBlockForward(int layer, const void* block);
  Status EnqueueHeadForward(const int32_t* targets, const void* final_norm, const void* embedding, float* loss);
  Status EnqueueHeadBackward(float loss_scale, const void* final_norm, const void* embedding, void* final_norm_grad,
                             void* embedding_grad);
  Status EnqueueBlockBackward(int layer, const void* block, void* block_grad);
  Status EnqueueEmbedBackward(void* embedding_grad);

  // The whole forward (one task per unit, as the engine would issue them).
  Status EnqueueForward(const int32_t* tokens, const int32_t* targets, const std::vector<const void*>& unit_params,
                        float* loss);
  Status EnqueueBackward(const std::vector<const void*>& unit_params, const std::vector<void*>& unit_grads,
                         float loss_scale = 1.0f);

 private:
  GptDevice(Device& device, Stream& stream, std::shared_ptr<GptModel> model, void* arena);

  Device& device_;
  Stream& stream_;
  std::shared_ptr<GptModel> model_;  // the layout; on HostDevice also the kernels
  void* arena_;                      // device pointer
  std::unique_ptr<GptStages> stages_;
};

}  // namespace zinf::exec
