// The C ABI of the engine, its communicators and its streams: thin wrappers
// over zinf::Engine, Communicator and Stream that hold the C++ objects and
// the pointer arrays the C structs point into.
// Thread-safety: as zinf.h states per group; the wrappers add no state that
// is shared between threads beyond what the wrapped objects already guard.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "capi/capi_internal.h"
#include "common/communicator.h"
#include "cpu/host_device.h"
#include "cpu/transport_comm.h"
#include "sched/backends.h"
#include "sched/lr_schedule.h"
#include "zinf/config.h"
#include "zinf/device.h"
#include "zinf/engine.h"
#include "zinf/zinf.h"

enum class CommKind { kMpi, kNccl, kTransport };

struct zinf_comm {
  std::unique_ptr<zinf::Communicator> comm;
  CommKind kind;
};

struct zinf_engine {
  // Destroyed in reverse order: the engine before the device it uses.
  std::shared_ptr<zinf::Device> device;
  std::unique_ptr<zinf::Engine> engine;
  zinf::Config config;
};

struct zinf_stream {
  std::shared_ptr<zinf::Device> device;  // keeps the device alive while the stream is
  std::unique_ptr<zinf::Stream> stream;
};

namespace zinf::capi {
namespace {

Status CheckDType(int dtype, const char* what) {
  if (dtype < ZINF_DTYPE_FP32 || dtype > ZINF_DTYPE_FP16) {
    return InvalidArgument(std::string(what) + " " + std::to_string(dtype) +
                           " is not a zinf_dtype (0 fp32, 1 bf16, 2 fp16)");
  }
  return Status::Ok();
}

// Copies `json` into a malloc'ed C string the caller frees with zinf_string_free.
Status ReturnString(const std::string& text, char** out) {
  char* s = static_cast<char*>(std::malloc(text.size() + 1));
  if (!s) return OutOfMemory("cannot allocate " + std::to_string(text.size() + 1) + " bytes for the result");
  std::memcpy(s, text.c_str(), text.size() + 1);
  *out = s;
  return Status::Ok();
}

// zinf_transport as a cpu::Transport. Owns its ctx (calls destroy) only
// once Own ran: a communicator that could not be created leaves it to the
// caller.
class CTransport final : public cpu::Transport {
 public:
  explicit CTransport(const zinf_transport& t) : t_(t) { t_.destroy = nullptr; }
  ~CTransport() override {
    if (t_.destroy) t_.destroy(t_.ctx);
  }
  int rank() const override { return t_.rank; }
  int size() const override { return t_.size; }
  int local_size() const override { return t_.local_size; }

  Result<Handle> Start(Op op, const void* send, void* recv, size_t bytes, int root) override {
    char error[kErrorBytes] = {0};
    Handle h = nullptr;
    if (t_.start(t_.ctx, static_cast<int>(op), send, recv, bytes, root, &h, error, sizeof(error)) != 0)
      return Unavailable("transport start: " + Text(error));
    return h;
  }
  Result<bool> Test(Handle handle) override {
    char error[kErrorBytes] = {0};
    const int rc = t_.test(t_.ctx, handle, error, sizeof(error));
    if (rc < 0) return Unavailable("transport: " + Text(error));
    return rc == 1;
  }
  void Release(Handle handle) override { t_.release(t_.ctx, handle); }
  Status Post(const std::string& key, const std::string& value) override {
    char error[kErrorBytes] = {0};
    if (t_.post(t_.ctx, key.c_str(), value.data(), value.size(), error, sizeof(error)) != 0)
      return Unavailable("transport board: post " + key + ": " + Text(error));
    return Status::Ok();
  }
  Result<std::optional<std::string>> Read(const std::string& key) override {
    char error[kErrorBytes] = {0};
    std::string value(kValueBytes, '\0');
    size_t n = 0;
    const int rc = t_.read(t_.ctx, key.c_str(), value.data(), value.size(), &n, error, sizeof(error));
    if (rc < 0) return Unavailable("transport board: read " + key + ": " + Text(error));
    if (rc == 0) return std::optional<std::string>();
    value.resize(std::min(n, value.size()));
    return std::optional<std::string>(std::move(value));
  }
  void Own(void (*destroy)(void*)) { t_.destroy = destroy; }

 private:
  static constexpr size_t kErrorBytes = 1024;
  static constexpr size_t kValueBytes = 4096;
  static std::string Text(const char* s) { return s[0] ? std::string(s) : std::string("(no reason given)"); }
  zinf_transport t_;
};

Status CreateEngine(Result<Config> config, zinf_comm* comm, zinf_engine** out) {
  ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
  if (!config.ok()) return std::move(config).status();
  if (!config->auto_keys.empty()) {
    std::string keys;
    for (const std::string& k : config->auto_keys) keys += (keys.empty() ? "" : ", ") + k;
    return InvalidArgument(config->source + ": " + keys + (config->auto_keys.size() == 1 ? " is" : " are") +
                           " \"auto\": resolve the config first (zinf_config_resolve_auto, with the model's hidden "
                           "size and the trainer's values) or set numbers");
  }
  auto engine = std::make_unique<zinf_engine>();
  engine->config = std::move(*config);
  DeviceOptions device_options;
  device_options.spec = engine->config.zinf.device;
  device_options.memory_budget = engine->config.zinf.device_memory;
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(device_options));
  engine->device = std::move(device);
  ZINF_ASSIGN_OR_RETURN(engine->engine,
                        Engine::Create(engine->config, *engine->device, comm ? comm->comm.get() : nullptr));
  *out = engine.release();
  return Status::Ok();
}

Status CheckStream(const zinf_engine* engine, const zinf_stream* stream) {
  ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
  ZINF_RETURN_IF_ERROR(NotNull(stream, "stream"));
  if (stream->device != engine->device) {
    return InvalidArgument(
        "the stream belongs to another engine's device (create it with zinf_stream_create on this engine)");
  }
  return Status::Ok();
}

// Fills `out` from `p`. The tensor array is the engine's own: it stays as
// returned until the engine is destroyed (zinf/engine.h), so an array an
// earlier fetch returned is not rewritten by a later one.
void ExportPointers(const UnitPointers& p, zinf_unit_pointers* out) {
  out->data = p.data;
  out->dtype = static_cast<zinf_dtype>(p.dtype);
  out->num_elems = p.num_elems;
  out->tensors = p.tensors.data();
  out->num_tensors = p.tensors.size();
}

Status CheckUnitIndex(zinf_engine* engine, int unit) {
  if (unit < 0 || unit >= engine->engine->num_units()) {
    return InvalidArgument("no unit " + std::to_string(unit) + " (" + std::to_string(engine->engine->num_units()) +
                           " registered)");
  }
  return Status::Ok();
}

// JSON has no inf or NaN: those become strings.
nlohmann::json Number(double x) {
  if (std::isfinite(x)) return x;
  if (std::isnan(x)) return "nan";
  return x > 0 ? "inf" : "-inf";
}

}  // namespace
}  // namespace zinf::capi

using zinf::Status;
using zinf::capi::Guard;
using zinf::capi::GuardVoid;
using zinf::capi::NotNull;

extern "C" {

// ---- Communicators ----------------------------------------------------------

ZINF_API int zinf_comm_create_mpi(double timeout_seconds, zinf_comm** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    zinf::CommOptions options;
    if (timeout_seconds > 0) options.timeout_seconds = timeout_seconds;
    ZINF_ASSIGN_OR_RETURN(auto comm, zinf::sched::CreateCommunicator(zinf::sched::CommBackend::kMpi, options));
    *out = new zinf_comm{std::move(comm), CommKind::kMpi};
    return Status::Ok();
  });
}

ZINF_API int zinf_nccl_get_unique_id(void* out, size_t bytes) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    if (bytes != ZINF_NCCL_UNIQUE_ID_BYTES) {
      return zinf::InvalidArgument("bytes is " + std::to_string(bytes) + "; an ncclUniqueId has " +
                                   std::to_string(ZINF_NCCL_UNIQUE_ID_BYTES));
    }
    ZINF_ASSIGN_OR_RETURN(zinf::gpu::NcclUniqueId id, zinf::sched::NewNcclUniqueId());
    std::memcpy(out, id.bytes, sizeof(id.bytes));
    return Status::Ok();
  });
}

ZINF_API int zinf_comm_create_nccl(int rank, int world_size, const void* unique_id, size_t unique_id_bytes,
                                   int cuda_device, zinf_comm** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    ZINF_RETURN_IF_ERROR(NotNull(unique_id, "unique_id"));
    if (unique_id_bytes != ZINF_NCCL_UNIQUE_ID_BYTES) {
      return zinf::InvalidArgument("unique_id_bytes is " + std::to_string(unique_id_bytes) + "; an ncclUniqueId has " +
                                   std::to_string(ZINF_NCCL_UNIQUE_ID_BYTES));
    }
    if (world_size < 1 || rank < 0 || rank >= world_size) {
      return zinf::InvalidArgument("rank " + std::to_string(rank) + " of world_size " + std::to_string(world_size) +
                                   ": need 0 <= rank < world_size");
    }
    zinf::gpu::NcclUniqueId id;
    std::memcpy(id.bytes, unique_id, sizeof(id.bytes));
    ZINF_ASSIGN_OR_RETURN(auto comm,
                          zinf::sched::CreateNcclCommunicator(rank, world_size, id, cuda_device, zinf::CommOptions{}));
    *out = new zinf_comm{std::move(comm), CommKind::kNccl};
    return Status::Ok();
  });
}

ZINF_API int zinf_comm_wrap_nccl(void* nccl_comm, zinf_comm** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    ZINF_RETURN_IF_ERROR(NotNull(nccl_comm, "nccl_comm"));
    ZINF_ASSIGN_OR_RETURN(auto comm, zinf::sched::WrapNcclCommunicator(nccl_comm, zinf::CommOptions{}));
    *out = new zinf_comm{std::move(comm), CommKind::kNccl};
    return Status::Ok();
  });
}

ZINF_API int zinf_comm_create_transport(const zinf_transport* transport, double timeout_seconds, zinf_comm** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(transport, "transport"));
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    if (!transport->start || !transport->test || !transport->release || !transport->post || !transport->read)
      return zinf::InvalidArgument("transport: start, test, release, post and read must all be set");
    zinf::CommOptions options;
    if (timeout_seconds > 0) options.timeout_seconds = timeout_seconds;
    auto wrapped = std::make_unique<zinf::capi::CTransport>(*transport);
    zinf::capi::CTransport* raw = wrapped.get();
    ZINF_ASSIGN_OR_RETURN(auto comm, zinf::cpu::CreateTransportCommunicator(std::move(wrapped), options));
    raw->Own(transport->destroy);
    *out = new zinf_comm{std::move(comm), CommKind::kTransport};
    return Status::Ok();
  });
}

ZINF_API int zinf_comm_rank(const zinf_comm* comm, int* out_rank) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(comm, "comm"));
    ZINF_RETURN_IF_ERROR(NotNull(out_rank, "out_rank"));
    *out_rank = comm->comm->rank();
    return Status::Ok();
  });
}

ZINF_API int zinf_comm_size(const zinf_comm* comm, int* out_size) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(comm, "comm"));
    ZINF_RETURN_IF_ERROR(NotNull(out_size, "out_size"));
    *out_size = comm->comm->size();
    return Status::Ok();
  });
}

ZINF_API void zinf_comm_destroy(zinf_comm* comm) {
  GuardVoid([&] { delete comm; });
}

// ---- Engine -----------------------------------------------------------------

ZINF_API int zinf_engine_create(const char* config_json, zinf_comm* comm, zinf_engine** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(config_json, "config_json"));
    return zinf::capi::CreateEngine(zinf::ParseConfig(config_json, "<config_json>"), comm, out);
  });
}

ZINF_API int zinf_config_resolve_auto(const char* config_json, const char* context_json, char** out_config_json,
                                      char** out_notes) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(config_json, "config_json"));
    ZINF_RETURN_IF_ERROR(NotNull(out_config_json, "out_config_json"));
    ZINF_ASSIGN_OR_RETURN(zinf::Config config, zinf::ParseConfig(config_json, "<config_json>"));
    zinf::AutoContext ctx;
    ctx.min_reduce_bucket_elems = 65536;  // the engine's smallest reduce bucket (one norm block)
    if (context_json) {
      auto j = nlohmann::json::parse(context_json, nullptr, false);
      if (j.is_discarded() || !j.is_object()) return zinf::InvalidArgument("context_json: not a JSON object");
      for (const auto& [key, value] : j.items()) {
        if (value.is_null()) continue;
        auto need_int = [&](std::optional<int64_t>* dst) -> Status {
          if (!value.is_number_integer() || value.get<int64_t>() < 0) {
            return zinf::InvalidArgument("context_json." + key + ": an integer >= 0, got " + value.dump());
          }
          *dst = value.get<int64_t>();
          return Status::Ok();
        };
        auto need_num = [&](std::optional<double>* dst) -> Status {
          if (!value.is_number() || !std::isfinite(value.get<double>())) {
            return zinf::InvalidArgument("context_json." + key + ": a finite number, got " + value.dump());
          }
          *dst = value.get<double>();
          return Status::Ok();
        };
        if (key == "hidden_size")
          ZINF_RETURN_IF_ERROR(need_int(&ctx.hidden_size));
        else if (key == "micro_batch_size")
          ZINF_RETURN_IF_ERROR(need_int(&ctx.micro_batch_size));
        else if (key == "gradient_accumulation_steps")
          ZINF_RETURN_IF_ERROR(need_int(&ctx.gradient_accumulation_steps));
        else if (key == "total_num_steps")
          ZINF_RETURN_IF_ERROR(need_int(&ctx.total_num_steps));
        else if (key == "warmup_num_steps")
          ZINF_RETURN_IF_ERROR(need_int(&ctx.warmup_num_steps));
        else if (key == "world_size")
          ZINF_RETURN_IF_ERROR(need_int(&ctx.world_size));
        else if (key == "lr")
          ZINF_RETURN_IF_ERROR(need_num(&ctx.lr));
        else if (key == "weight_decay")
          ZINF_RETURN_IF_ERROR(need_num(&ctx.weight_decay));
        else if (key == "gradient_clipping")
          ZINF_RETURN_IF_ERROR(need_num(&ctx.gradient_clipping));
        else {
          return zinf::InvalidArgument("context_json." + key +
                                       ": unknown (hidden_size, lr, weight_decay, micro_batch_size, "
                                       "gradient_accumulation_steps, gradient_clipping, total_num_steps, "
                                       "warmup_num_steps, world_size)");
        }
      }
    }
    ZINF_ASSIGN_OR_RETURN(std::vector<std::string> notes, zinf::ResolveAuto(config, ctx));
    std::string text;
    for (const std::string& n : notes) text += n + "\n";
    char* resolved = nullptr;
    ZINF_RETURN_IF_ERROR(zinf::capi::ReturnString(config.ToJson(0), &resolved));
    if (out_notes) {
      if (Status s = zinf::capi::ReturnString(text, out_notes); !s.ok()) {
        std::free(resolved);
        return s;
      }
    }
    *out_config_json = resolved;
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_create_from_file(const char* config_path, zinf_comm* comm, zinf_engine** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(config_path, "config_path"));
    return zinf::capi::CreateEngine(zinf::LoadConfigFile(config_path), comm, out);
  });
}

ZINF_API void zinf_engine_destroy(zinf_engine* engine) {
  GuardVoid([&] {
    if (!engine) return;
    if (engine->engine) (void)engine->engine->Synchronize();
    delete engine;
  });
}

ZINF_API int zinf_engine_config_json(const zinf_engine* engine, char** out_json) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(out_json, "out_json"));
    return zinf::capi::ReturnString(engine->config.ToJson(2), out_json);
  });
}

ZINF_API int zinf_engine_get_info(const zinf_engine* engine, zinf_engine_info* out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    const zinf::Engine& e = *engine->engine;
    out->rank = e.rank();
    out->world_size = e.world_size();
    out->zero_stage = e.zero_stage();
    out->num_units = e.num_units();
    out->compute_dtype = static_cast<zinf_dtype>(e.compute_dtype());
    out->gradient_accumulation_steps = e.gradient_accumulation_steps();
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_host_memory(const zinf_engine* engine, void** out_base, uint64_t* out_bytes) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(out_base, "out_base"));
    ZINF_RETURN_IF_ERROR(NotNull(out_bytes, "out_bytes"));
    const std::span<std::byte> memory = zinf::cpu::HostAddressableMemory(*engine->device);
    *out_base = memory.data();
    *out_bytes = memory.size();
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_add_unit(zinf_engine* engine, const char* name, const zinf_param_spec* params,
                                  size_t num_params, int* out_unit) {
  return zinf_engine_add_unit_ex(engine, name, params, num_params, nullptr, 0, out_unit);
}

ZINF_API int zinf_engine_scheduled_lr(const zinf_engine* engine, int64_t completed_steps, double* out_lr) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(out_lr, "out_lr"));
    if (completed_steps < 0) return zinf::InvalidArgument("completed_steps must be >= 0");
    ZINF_ASSIGN_OR_RETURN(zinf::sched::LrSchedule schedule,
                          zinf::sched::LrSchedule::Create(engine->config.scheduler, engine->config.optimizer.lr));
    *out_lr = schedule.LrAt(completed_steps);
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_add_param_group(zinf_engine* engine, double weight_decay, double lr, int* out_group) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_ASSIGN_OR_RETURN(
        int group, engine->engine->AddParamGroup(zinf::ParamGroupOptions{.weight_decay = weight_decay, .lr = lr}));
    if (out_group) *out_group = group;
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_set_group_lr(zinf_engine* engine, int group, double lr) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    return engine->engine->SetGroupLr(group, lr);
  });
}

ZINF_API int zinf_engine_add_unit_ex(zinf_engine* engine, const char* name, const zinf_param_spec* params,
                                     size_t num_params, const int* groups, int flags, int* out_unit) {
  return Guard(__func__, [&]() -> Status {
    if ((flags & ~ZINF_UNIT_FROZEN) != 0) {
      return zinf::InvalidArgument("flags " + std::to_string(flags) + ": only ZINF_UNIT_FROZEN is defined");
    }
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(name, "name"));
    if (num_params > 0) ZINF_RETURN_IF_ERROR(NotNull(params, "params"));
    std::vector<zinf::ParamSpec> specs(num_params);
    for (size_t i = 0; i < num_params; ++i) {
      const zinf_param_spec& p = params[i];
      const std::string what = std::string("unit '") + name + "' param " + std::to_string(i);
      ZINF_RETURN_IF_ERROR(zinf::capi::CheckDType(p.dtype, (what + " dtype").c_str()));
      if (p.ndim > 0) ZINF_RETURN_IF_ERROR(NotNull(p.shape, (what + " shape").c_str()));
      specs[i].name = p.name ? p.name : "";
      specs[i].shape.assign(p.shape, p.shape + p.ndim);
      specs[i].dtype = static_cast<zinf::DType>(p.dtype);
      specs[i].init = p.init;
      specs[i].group = groups ? groups[i] : 0;
    }
    ZINF_ASSIGN_OR_RETURN(
        int unit, engine->engine->AddUnit(name, specs, zinf::UnitOptions{.frozen = (flags & ZINF_UNIT_FROZEN) != 0}));
    if (out_unit) *out_unit = unit;
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_fetch(zinf_engine* engine, int unit, zinf_stream* stream, zinf_unit_pointers* out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckStream(engine, stream));
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckUnitIndex(engine, unit));
    ZINF_ASSIGN_OR_RETURN(zinf::UnitPointers p, engine->engine->Fetch(unit, *stream->stream));
    zinf::capi::ExportPointers(p, out);
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_grad_buffers(zinf_engine* engine, int unit, zinf_unit_pointers* out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckUnitIndex(engine, unit));
    ZINF_ASSIGN_OR_RETURN(zinf::UnitPointers p, engine->engine->GradBuffers(unit));
    zinf::capi::ExportPointers(p, out);
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_grads_ready(zinf_engine* engine, int unit, zinf_stream* stream) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckStream(engine, stream));
    return engine->engine->GradsReady(unit, *stream->stream);
  });
}

ZINF_API int zinf_engine_release(zinf_engine* engine, int unit, zinf_stream* stream) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckStream(engine, stream));
    return engine->engine->Release(unit, *stream->stream);
  });
}

ZINF_API int zinf_engine_step(zinf_engine* engine, int* out_boundary) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_ASSIGN_OR_RETURN(bool boundary, engine->engine->Step());
    if (out_boundary) *out_boundary = boundary ? 1 : 0;
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_report_loss(zinf_engine* engine, double loss) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    return engine->engine->ReportLoss(loss);
  });
}

ZINF_API int zinf_engine_trace_begin(zinf_engine* engine, zinf_stream* stream, int64_t* out_token) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckStream(engine, stream));
    ZINF_RETURN_IF_ERROR(NotNull(out_token, "out_token"));
    ZINF_ASSIGN_OR_RETURN(int64_t token, engine->engine->TraceBegin(*stream->stream));
    *out_token = token;
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_trace_end(zinf_engine* engine, zinf_stream* stream, int64_t token, const char* lane,
                                   const char* what) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckStream(engine, stream));
    ZINF_RETURN_IF_ERROR(NotNull(lane, "lane"));
    ZINF_RETURN_IF_ERROR(NotNull(what, "what"));
    return engine->engine->TraceEnd(token, *stream->stream, lane, what);
  });
}

ZINF_API int zinf_engine_loss_scale(zinf_engine* engine, float* out_scale) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(out_scale, "out_scale"));
    ZINF_ASSIGN_OR_RETURN(float scale, engine->engine->loss_scale());
    *out_scale = scale;
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_synchronize(zinf_engine* engine) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    return engine->engine->Synchronize();
  });
}

ZINF_API int zinf_engine_stats_json(zinf_engine* engine, char** out_json) {
  return Guard(__func__, [&]() -> Status {
    using zinf::capi::Number;
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(out_json, "out_json"));
    ZINF_ASSIGN_OR_RETURN(zinf::StepStats s, engine->engine->Stats());
    nlohmann::json j;
    j["step"] = s.step;
    j["boundary"] = s.boundary;
    j["behind"] = s.behind;
    j["skipped"] = s.skipped;
    j["loss_scale"] = Number(s.loss_scale);
    j["next_loss_scale"] = Number(s.next_loss_scale);
    j["lr"] = Number(s.lr);
    j["grad_norm"] = Number(s.grad_norm);
    j["clip_coef"] = Number(s.clip_coef);
    j["optimizer_seconds"] = Number(s.optimizer_seconds);
    j["comm_seconds"] = Number(s.comm_seconds);
    j["copy_seconds"] = Number(s.copy_seconds);
    j["io_seconds"] = Number(s.io_seconds);
    j["nvme_bytes_read"] = s.nvme_bytes_read;
    j["nvme_bytes_written"] = s.nvme_bytes_written;
    j["nvme_bytes_read_total"] = s.nvme_bytes_read_total;
    j["nvme_bytes_written_total"] = s.nvme_bytes_written_total;
    j["copy_bytes"] = s.copy_bytes;
    j["stall_seconds"] = Number(s.stall_seconds);
    j["longest_stall"] = s.longest_stall;
    j["collectives"] = nlohmann::json::array();
    for (const auto& c : s.collectives) {
      j["collectives"].push_back({{"kind", c.kind}, {"calls", c.calls}, {"bytes", c.bytes}});
    }
    j["device_bytes_in_use"] = s.device_bytes_in_use;
    j["summary"] = s.ToString();
    j["timeline"] = nlohmann::json::array();
    for (const zinf::TimelineSpan& t : s.timeline) {
      j["timeline"].push_back({{"lane", t.lane}, {"what", t.what}, {"start", Number(t.start)}, {"end", Number(t.end)}});
    }
    j["timeline_dropped"] = s.timeline_dropped;
    // Replace, not throw, on invalid UTF-8 in a message (a path, say).
    return zinf::capi::ReturnString(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), out_json);
  });
}

ZINF_API int zinf_engine_read_state(zinf_engine* engine, int unit, zinf_state_kind kind, float* host_dst,
                                    size_t num_elems) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(host_dst, "host_dst"));
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckUnitIndex(engine, unit));
    if (kind < ZINF_STATE_MASTER || kind > ZINF_STATE_COMPUTE_PARAMS) {
      return zinf::InvalidArgument("kind " + std::to_string(static_cast<int>(kind)) + " is not a zinf_state_kind");
    }
    ZINF_ASSIGN_OR_RETURN(const int64_t elems, engine->engine->unit_elems(unit));
    if (static_cast<int64_t>(num_elems) != elems) {
      return zinf::InvalidArgument("num_elems is " + std::to_string(num_elems) + "; unit " + std::to_string(unit) +
                                   " has " + std::to_string(elems) + " elements");
    }
    return engine->engine->ReadState(unit, static_cast<zinf::StateKind>(kind), host_dst);
  });
}

ZINF_API int zinf_engine_write_state(zinf_engine* engine, int unit, zinf_state_kind kind, const float* host_src,
                                     size_t num_elems) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(host_src, "host_src"));
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckUnitIndex(engine, unit));
    if (kind != ZINF_STATE_MASTER) {
      return zinf::InvalidArgument("kind " + std::to_string(static_cast<int>(kind)) +
                                   ": only ZINF_STATE_MASTER (the parameters) can be written");
    }
    ZINF_ASSIGN_OR_RETURN(const int64_t elems, engine->engine->unit_elems(unit));
    if (static_cast<int64_t>(num_elems) != elems) {
      return zinf::InvalidArgument("num_elems is " + std::to_string(num_elems) + "; unit " + std::to_string(unit) +
                                   " has " + std::to_string(elems) + " elements");
    }
    return engine->engine->WriteState(unit, zinf::StateKind::kMaster, host_src);
  });
}

ZINF_API int zinf_engine_broadcast(zinf_engine* engine, void* host, size_t bytes, int root) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    if (bytes > 0) ZINF_RETURN_IF_ERROR(NotNull(host, "host"));
    return engine->engine->Broadcast(host, bytes, root);
  });
}

// ---- Checkpoints ------------------------------------------------------------

ZINF_API int zinf_engine_save(zinf_engine* engine, const char* dir, const char* client_json, char** out_path) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(dir, "dir"));
    std::string client = client_json ? client_json : "{}";
    if (!nlohmann::json::accept(client)) {
      return zinf::InvalidArgument("client_json is not a JSON value: " + client.substr(0, 80));
    }
    ZINF_ASSIGN_OR_RETURN(std::string path, engine->engine->Save(dir, client));
    if (out_path) return zinf::capi::ReturnString(path, out_path);
    return Status::Ok();
  });
}

ZINF_API int zinf_engine_load(zinf_engine* engine, const char* path, char** out_client_json) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(path, "path"));
    ZINF_ASSIGN_OR_RETURN(std::string client, engine->engine->Load(path));
    if (out_client_json) return zinf::capi::ReturnString(client, out_client_json);
    return Status::Ok();
  });
}

// ---- Streams ----------------------------------------------------------------

ZINF_API int zinf_stream_create(zinf_engine* engine, zinf_stream** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    ZINF_ASSIGN_OR_RETURN(auto stream, engine->device->CreateStream());
    *out = new zinf_stream{engine->device, std::move(stream)};
    return Status::Ok();
  });
}

ZINF_API int zinf_stream_adopt(zinf_engine* engine, void* native, zinf_stream** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(engine, "engine"));
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    ZINF_ASSIGN_OR_RETURN(auto stream, engine->device->AdoptStream(native));
    *out = new zinf_stream{engine->device, std::move(stream)};
    return Status::Ok();
  });
}

ZINF_API void zinf_stream_destroy(zinf_stream* stream) {
  GuardVoid([&] {
    if (!stream) return;
    (void)stream->stream->Synchronize();
    delete stream;
  });
}

ZINF_API int zinf_stream_synchronize(zinf_stream* stream) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(stream, "stream"));
    return stream->stream->Synchronize();
  });
}

ZINF_API int zinf_stream_enqueue_host(zinf_stream* stream, zinf_host_fn fn, void* user_data) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(stream, "stream"));
    ZINF_RETURN_IF_ERROR(NotNull(reinterpret_cast<const void*>(fn), "fn"));
    return stream->stream->Enqueue([fn, user_data](const zinf::StreamContext&) -> Status {
      int rc;
      try {
        rc = fn(user_data);
      } catch (...) {  // a C++ caller's function threw: it must not unwind into the stream's thread
        return zinf::Internal("host function threw an exception");
      }
      if (rc == 0) return Status::Ok();
      const auto code =
          (rc > 0 && rc <= ZINF_ERR_INTERNAL) ? static_cast<zinf::StatusCode>(rc) : zinf::StatusCode::kInternal;
      return Status(code, "host function returned " + std::to_string(rc));
    });
  });
}

ZINF_API int zinf_stream_copy(zinf_stream* stream, void* dst, const void* src, uint64_t bytes, zinf_copy_kind kind) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(stream, "stream"));
    if (bytes > 0) {
      ZINF_RETURN_IF_ERROR(NotNull(dst, "dst"));
      ZINF_RETURN_IF_ERROR(NotNull(src, "src"));
    }
    zinf::Device& d = *stream->device;
    switch (kind) {
      case ZINF_COPY_HOST_TO_DEVICE:
        return d.CopyToDevice(dst, src, bytes, *stream->stream);
      case ZINF_COPY_DEVICE_TO_HOST:
        return d.CopyToHost(dst, src, bytes, *stream->stream);
      case ZINF_COPY_DEVICE_TO_DEVICE:
        return d.CopyOnDevice(dst, src, bytes, *stream->stream);
    }
    return zinf::InvalidArgument("kind " + std::to_string(static_cast<int>(kind)) + " is not a zinf_copy_kind");
  });
}

ZINF_API void* zinf_stream_native_handle(const zinf_stream* stream) {
  return stream ? stream->stream->native_handle() : nullptr;
}

}  // extern "C"
