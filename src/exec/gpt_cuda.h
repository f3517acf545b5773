// The GPT model's stages on a CUDA device (model::GptStages): the layers of
// model/layers.h as the kernels of gpu/kernels.h plus cuBLAS fp32 matrix
// products (no TF32), with GptModel's activation layout in a device arena
// and GptModel's stage order. Every call enqueues on the stream and returns;
// nothing waits for the device. The elementwise and row math is the CPU's;
// the matrix products and the atomic embedding scatter-add differ from the
// CPU in rounding only. No CUDA header leaks from here.
// Thread-safety: one thread at a time (one stream's order).
#pragma once

#include <memory>

#include "model/gpt.h"
#include "exec/gpt_device.h"
#include "zinf/device.h"

namespace zinf::gpu {

// `arena` holds layout.total_bytes of `device` memory; device and stream
// (a CUDA stream of `device`) must outlive the stages.
Result<std::unique_ptr<model::GptStages>> CreateGptCudaStages(Device& device, Stream& stream,
                                                              const model::GptConfig& config,
                                                              const model::GptRunOptions& options,
                                                              const model::ActivationLayout& layout, void* arena);

}  // namespace zinf::gpu
