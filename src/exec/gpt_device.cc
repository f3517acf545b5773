// GptDevice: stream tasks around GptModel's stages.
#include "exec/gpt_device.h"

#include <utility>

#include "common/build_config.h"
#include "common/runtime_info.h"
#if ZINF_HAVE_CUDA
#include "exec/gpt_cuda.h"
#endif

namespace zinf::exec {

using model::BlockUnit;
using model::EmbeddingUnit;
using model::FinalNormUnit;
using model::GptModel;
using model::kStageOther;
using model::MarkOp;
using model::NumUnits;

namespace {

template <class T>
T* HostOf(const StreamContext& ctx, T* device_ptr) {
  return device_ptr ? static_cast<T*>(ctx.Host(device_ptr)) : nullptr;
}

// HostDevice: each stage a task over GptModel, bound to the arena's host address.
class HostStages final : public GptStages {
 public:
  HostStages(Stream& stream, std::shared_ptr<GptModel> model, void* arena)
      : stream_(stream), model_(std::move(model)), arena_(arena) {}

  Status EmbedForward(const int32_t* tokens, const void* embedding) override {
    return Enqueue([=](GptModel& m, const StreamContext& ctx) {
      return m.EmbedForward(HostOf(ctx, tokens), HostOf(ctx, embedding));
    });
  }
  Status BlockForward(int layer, const void* block) override {
    return Enqueue([=](GptModel& m, const StreamContext& ctx) { return m.BlockForward(layer, HostOf(ctx, block)); });
  }
  Status HeadForward(const int32_t* targets, const void* final_norm, const void* embedding, float* loss) override {
    return Enqueue([=](GptModel& m, const StreamContext& ctx) -> Status {
      ZINF_ASSIGN_OR_RETURN(float value,
                            m.HeadForward(HostOf(ctx, targets), HostOf(ctx, final_norm), HostOf(ctx, embedding)));
      if (loss) *HostOf(ctx, loss) = value;
      return Status::Ok();
    });
  }
  Status HeadBackward(float loss_scale, const void* final_norm, const void* embedding, void* final_norm_grad,
                      void* embedding_grad) override {
    return Enqueue([=](GptModel& m, const StreamContext& ctx) {
      return m.HeadBackward(loss_scale, HostOf(ctx, final_norm), HostOf(ctx, embedding), HostOf(ctx, final_norm_grad),
                            HostOf(ctx, embedding_grad));
    });
  }
  Status BlockBackward(int layer, const void* block, void* block_grad) override {
    return Enqueue([=](GptModel& m, const StreamContext& ctx) {
      return m.BlockBackward(layer, HostOf(ctx, block), HostOf(ctx, block_grad));
    });
  }
  Status EmbedBackward(void* embedding_grad) override {
    return Enqueue([=](GptModel& m, const StreamContext& ctx) { return m.EmbedBackward(HostOf(ctx, embedding_grad)); });
  }

 private:
  // Enqueues fn(model, ctx) after binding the arena's host address.
  template <class Fn>
  Status Enqueue(Fn fn) {
    return stream_.Enqueue([model = model_, arena = arena_, fn = std::move(fn)](const StreamContext& ctx) -> Status {
      MarkOp(model->options().profile, kStageOther);  // the task's time before the stage's first op
      void* host = ctx.Host(arena);
      if (!host) return Unimplemented("gpt model: device memory is not reachable from host tasks");
      model->BindActivations(host);
      return fn(*model, ctx);
    });
  }

  Stream& stream_;
  std::shared_ptr<GptModel> model_;
  void* arena_;
};

// The model's one factory: the stages of a device the host cannot address
// (CUDA), in the one place besides the backend registry that asks what was
// built.
Result<std::unique_ptr<GptStages>> CreateDeviceStages(Device& device, Stream& stream, const GptConfig& config,
                                                      const GptModel& model, void* arena) {
#if ZINF_HAVE_CUDA
  return CreateGptCudaStages(device, stream, config, model.options(), model.activation_layout(), arena);
#else
  return NotBuilt(OptionalBackend::kCuda);
#endif
}

}  // namespace

Result<std::unique_ptr<GptDevice>> GptDevice::Create(Device& device, Stream& stream, const GptConfig& config,
                                                     const GptRunOptions& options) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<GptModel> model, GptModel::Create(config, options));
  const uint64_t bytes = model->activation_bytes();
  auto arena = device.Allocate(bytes, stream);
  if (!arena.ok()) {
    return std::move(arena).status().WithContext("gpt model " + config.name + ": activations (" +
                                                 model->activation_layout().ToString() + ")");
  }
  std::unique_ptr<GptDevice> g(new GptDevice(device, stream, std::move(model), *arena));
  if (device.kind() == DeviceKind::kHost) {
    g->stages_ = std::make_unique<HostStages>(stream, g->model_, g->arena_);
  } else {
    auto stages = CreateDeviceStages(device, stream, config, *g->model_, g->arena_);
    if (!stages.ok()) return std::move(stages).status().WithContext("gpt model " + config.name);
    g->stages_ = std::move(*stages);
  }
  return g;
}

GptDevice::GptDevice(Device& device, Stream& stream, std::shared_ptr<GptModel> model, void* arena)
    : device_(device), stream_(stream), model_(std::move(model)), arena_(arena) {}

GptDevice::~GptDevice() {
  stages_.reset();
  // Stream-ordered: after every task queued so far.
  device_.Free(arena_, stream_).IgnoreError();
}

Status GptDevice::EnqueueEmbedForward(const int32_t* tokens, const void* embedding) {
  return stages_->EmbedForward(tokens, embedding);
}

Status GptDevice::EnqueueBlockForward(int layer, const void* block) { return stages_->BlockForward(layer, block); }

Status GptDevice::EnqueueHeadForward(const int32_t* targets, const void* final_norm, const void* embedding,
                                     float* loss) {
  return stages_->HeadForward(targets, final_norm, embedding, loss);
}

Status GptDevice::EnqueueHeadBackward(float loss_scale, const void* final_norm, const void* embedding,
                                      void* final_norm_grad, void* embedding_grad) {
  return stages_->HeadBackward(loss_scale, final_norm, embedding, final_norm_grad, embedding_grad);
}

Status GptDevice::EnqueueBlockBackward(int layer, const void* block, void* block_grad) {
  return stages_->BlockBackward(layer, block, block_grad);
}

Status GptDevice::EnqueueEmbedBackward(void* embedding_grad) { return stages_->EmbedBackward(embedding_grad); }

Status GptDevice::EnqueueForward(const int32_t* tokens, const int32_t* targets,
                                 const std::vector<const void*>& unit_params, float* loss) {
  const GptConfig& c = config();
  if (static_cast<int>(unit_params.size()) != NumUnits(c)) {
    return InvalidArgument("gpt model: EnqueueForward needs " + std::to_string(NumUnits(c)) +
                           " unit parameter buffers, got " + std::to_string(unit_params.size()));
  }
  ZINF_RETURN_IF_ERROR(EnqueueEmbedForward(tokens, unit_params[EmbeddingUnit()]));
  for (int l = 0; l < c.num_layers; ++l) ZINF_RETURN_IF_ERROR(EnqueueBlockForward(l, unit_params[BlockUnit(l)]));
  return EnqueueHeadForward(targets, unit_params[FinalNormUnit(c)], unit_params[EmbeddingUnit()], loss);
}

Status GptDevice::EnqueueBackward(const std::vector<const void*>& unit_params, const std::vector<void*>& unit_grads,
                                  float loss_scale) {
  const GptConfig& c = config();
  const int n = NumUnits(c);
  if (static_cast<int>(unit_params.size()) != n || static_cast<int>(unit_grads.size()) != n) {
    return InvalidArgument("gpt model: EnqueueBackward needs " + std::to_string(n) +
                           " unit parameter and gradient buffers");
  }
  const int fin = FinalNormUnit(c), emb = EmbeddingUnit();
  ZINF_RETURN_IF_ERROR(
      EnqueueHeadBackward(loss_scale, unit_params[fin], unit_params[emb], unit_grads[fin], unit_grads[emb]));
  for (int l = static_cast<int>(c.num_layers) - 1; l >= 0; --l) {
    ZINF_RETURN_IF_ERROR(EnqueueBlockBackward(l, unit_params[BlockUnit(l)], unit_grads[BlockUnit(l)]));
  }
  return EnqueueEmbedBackward(unit_grads[emb]);
}

}  // namespace zinf::exec
