#include "model/gpt_plan.h"

#include <string>

#include "common/device_allocator.h"
#include "model/gpt.h"

namespace zinf::model {
namespace {

uint64_t Dev(uint64_t bytes) { return DeviceAllocator::RoundUp(bytes); }

}  // namespace

Result<PlanModel> PlanGptModel(const model::GptConfig& config, int64_t micro_batch, int64_t seq_len, bool checkpointing,
                               DType compute_dtype, DType matmul_dtype, model::AttentionKernel attention) {
  ZINF_RETURN_IF_ERROR(config.Validate());
  if (micro_batch < 1) return InvalidArgument("micro-batch must be >= 1");
  if (seq_len == 0) seq_len = model::DefaultSeqLen(config);
  if (seq_len < 1 || seq_len > config.max_seq_len) {
    return InvalidArgument("seq-len " + std::to_string(seq_len) + " is outside 1.." +
                           std::to_string(config.max_seq_len) + " (the model's context)");
  }
  PlanModel m;
  m.description = config.ToString();
  for (int u = 0; u < model::NumUnits(config); ++u) m.unit_elems.push_back(model::UnitNumParams(config, u));
  m.held_units = {model::EmbeddingUnit()};
  model::GptRunOptions o;
  o.batch_size = micro_batch;
  o.seq_len = seq_len;
  o.activation_checkpointing = checkpointing;
  o.param_dtype = compute_dtype;
  o.grad_dtype = DType::kFloat32;
  o.matmul_dtype = matmul_dtype;
  o.attention = attention;
  const bool flash = model::ResolveAttention(config, o) == model::AttentionKernel::kFlash;
  const model::ActivationLayout layout = model::ActivationLayout::For(config, o);
  m.activation_bytes = Dev(layout.total_bytes);
  const uint64_t tokens = static_cast<uint64_t>(micro_batch * seq_len);
  m.io_buffer_bytes = 2 * Dev(tokens * 4) + Dev(4);
  m.activation_note = "micro-batch " + std::to_string(micro_batch) + " x seq-len " + std::to_string(seq_len) +
                      (checkpointing ? ", checkpointing" : "") + (flash ? ", flash attention" : "") + ": " +
                      layout.ToString();
  m.flops_per_micro_step = model::TrainingFlops(config, micro_batch, seq_len);
  return m;
}

}  // namespace zinf::model
