// The GPT's description for the planner (common/plan_model.h): its units'
// sizes, the units the client holds, activations and FLOPs per micro-step.
// Pure function.
#pragma once

#include <cstdint>

#include "common/plan_model.h"
#include "model/gpt.h"
#include "model/gpt_config.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::model {

// A GPT (gpt_config.h) trained on micro_batch × seq_len tokens per rank and
// micro-step, with activations for the given compute dtype and matrix
// products' operands (bf16 operands add their rounded copies), and the
// attention (model::ResolveAttention: flash keeps O(T) per head, plain T²).
// seq_len 0 is model::DefaultSeqLen.
Result<PlanModel> PlanGptModel(const model::GptConfig& config, int64_t micro_batch, int64_t seq_len, bool checkpointing,
                               DType compute_dtype, DType matmul_dtype = DType::kFloat32,
                               model::AttentionKernel attention = model::AttentionKernel::kAuto);

}  // namespace zinf::model
