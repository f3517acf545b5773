// The GPT model's stages on a CUDA device (GptStages) for the whole
// decoder family of model/gpt_config.h: the layers of model/layers.h and
// model/decoder_layers.h as the kernels of gpu/kernels.h and
// gpu/decoder_kernels.h plus cuBLAS matrix products (fp32 without TF32, or
// bf16 operands), with GptModel's activation layout in a device arena and
// GptModel's stage order. RoPE's table is the CPU model's, built on the host
// and copied to the device once. Every call enqueues on the stream and
// returns; nothing waits for the device. The elementwise and row math, and
// the embedding gradient's sums (rows in order, no atomics), are the CPU's;
// the matrix products differ from the CPU in rounding only. Flash attention (bf16 operands) takes heads
// of 64 and 128 (kInvalidArgument otherwise); the plain attention any head
// size. No CUDA header leaks from here.
// Thread-safety: one thread at a time (one stream's order).
#pragma once

#include <memory>

#include "model/gpt.h"
#include "exec/gpt_device.h"
#include "zinf/device.h"

namespace zinf::exec {

// `arena` holds layout.total_bytes of `device` memory; device and stream
// (a CUDA stream of `device`) must outlive the stages.
Result<std::unique_ptr<GptStages>> CreateGptCudaStages(Device& device, Stream& stream, const model::GptConfig& config,
                                                       const model::GptRunOptions& options,
                                                       const model::ActivationLayout& layout, void* arena);

}  // namespace zinf::exec
