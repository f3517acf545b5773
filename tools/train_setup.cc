// `zinf train`'s phases up to the first step: the configuration (a file or
// the embedded default's, then flags), the tokenizer and data, the model's
// shape, and the build — device, engine, this run's row of `zinf plan`
// checked before registration writes the initial state to its tiers, the
// model on the device and its initial weights. Then the header rank 0
// prints. One thread (the command's).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/units.h"
#include "cpu/mpi_comm.h"
#include "data/embedded_corpus.h"
#include "data/gpt_weights.h"
#include "data/safetensors.h"
#include "model/gpt_plan.h"
#include "sched/device_kernels.h"
#include "sched/partition.h"
#include "sched/state_bytes.h"
#include "tools/train.h"
#include "tools/train_run.h"

namespace zinf::tools {
namespace {

// The embedded default's configuration: ZeRO stage 3, parameter shards in
// pinned host memory, the optimizer state on NVMe in $ZINF_TMPDIR, else in a
// directory under the working directory that the run removes.
void SetDefaultConfig(TrainRun& run) {
  Config& config = run.config;
  config.zero.stage = 3;
  config.zero.stage3_param_persistence_threshold = 0;  // every unit partitioned, gathered around its use
  config.bf16.enabled = true;
  config.gradient_clipping = 1.0;
  config.optimizer.lr = kDefaultLr;
  config.optimizer.weight_decay = 0.01;
  config.scheduler.type = SchedulerType::kWarmupDecayLR;
  config.scheduler.warmup_min_lr = 0;
  config.scheduler.warmup_max_lr = kDefaultLr;
  config.scheduler.warmup_num_steps = 20;
  config.scheduler.warmup_type = WarmupType::kLinear;
  config.zero.offload_param.device = OffloadDevice::kCpu;
  config.zero.offload_optimizer.device = OffloadDevice::kNvme;
  const char* env = std::getenv("ZINF_TMPDIR");
  const bool given = env && *env;
  run.tmp.path = given ? std::string(env)
                       : (std::filesystem::current_path() / ("zinf-train-" + std::to_string(getpid()))).string();
  run.tmp.remove = !given;
  std::filesystem::create_directories(run.tmp.path);
  config.zero.offload_optimizer.nvme_path = {run.tmp.path};
}

// The flags over the configuration: steps, learning rate, schedule length
// and the batch sizes.
Status ApplyScheduleFlags(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  Config& config = run.config;
  run.steps = opt.steps > 0 ? opt.steps : kDefaultSteps;
  if (opt.sample_tokens < 0) return BadInput("--sample-tokens must be >= 0 (0: no sample)");
  if (opt.lr > 0) {
    config.optimizer.lr = opt.lr;
    if (config.scheduler.type != SchedulerType::kNone) config.scheduler.warmup_max_lr = opt.lr;
  }
  if (config.scheduler.type == SchedulerType::kWarmupDecayLR ||
      config.scheduler.type == SchedulerType::kWarmupCosineLR) {
    if (config.scheduler.total_num_steps <= 0 || run.defaults) {
      config.scheduler.total_num_steps = std::max<int64_t>(run.steps, config.scheduler.warmup_num_steps + 2);
    }
  }
  if (opt.micro_batch > 0) {
    if (config.train_micro_batch_size_per_gpu && *config.train_micro_batch_size_per_gpu != opt.micro_batch &&
        !run.defaults) {
      return BadInput(
          "--micro-batch " + std::to_string(opt.micro_batch) + " contradicts train_micro_batch_size_per_gpu = " +
          std::to_string(*config.train_micro_batch_size_per_gpu) + " in " + opt.config + ": drop one of them");
    }
    config.train_micro_batch_size_per_gpu = opt.micro_batch;
  }
  if (opt.grad_accum > 0) config.gradient_accumulation_steps = opt.grad_accum;
  if (!config.train_micro_batch_size_per_gpu && !config.train_batch_size)
    config.train_micro_batch_size_per_gpu = kDefaultMicroBatch;
  if (!config.gradient_accumulation_steps && !(config.train_batch_size && config.train_micro_batch_size_per_gpu))
    config.gradient_accumulation_steps = 1;
  auto b = ResolveBatchSizes(config, run.world);
  if (!b.ok()) return BadInput(b.status().message());
  run.batch = *b;
  config.train_micro_batch_size_per_gpu = run.batch.micro_batch_size;
  config.gradient_accumulation_steps = run.batch.gradient_accumulation_steps;
  config.train_batch_size = run.batch.train_batch_size;
  return Status::Ok();
}

// Conversations (--data *.jsonl) tokenized by the chat template and packed
// into rows of T tokens; rank 0 reports what came of them.
Status OpenChatData(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  const data::Tokenizer& tokenizer = *run.tokenizer;
  const int64_t T = run.T;
  data::ChatTemplate tmpl;
  auto t =
      opt.chat_template == "auto" ? data::DetectChatTemplate(tokenizer) : data::ParseChatTemplate(opt.chat_template);
  if (!t.ok()) return BadInput("--chat-template: " + t.status().message());
  tmpl = *t;
  const bool tty = run.talk && isatty(2);
  auto progress = [&, last = std::chrono::steady_clock::now()](uint64_t done, uint64_t total) mutable {
    const auto now = std::chrono::steady_clock::now();
    if (!tty || (now - last < std::chrono::milliseconds(500) && done < total)) return;
    last = now;
    std::fprintf(stderr, "\r  tokenizing %s: %.0f%%", opt.data.c_str(), 100.0 * done / std::max<uint64_t>(total, 1));
    if (done == total) std::fputc('\n', stderr);
  };
  auto d = data::ChatDataset::Open(opt.data, tokenizer, tmpl, T, progress);
  if (!d.ok()) return BadInput(d.status().message());
  const data::ChatDataStats& st = (*d)->stats();
  if (run.talk) {
    std::printf(
        "  chat data: %lld examples (%s template), %lld rows of %lld tokens (%.0f%% filled), "
        "%lld trained targets (%.0f%%)",
        static_cast<long long>(st.examples), std::string(data::ChatTemplateName(tmpl)).c_str(),
        static_cast<long long>(st.rows), static_cast<long long>(T),
        100.0 * st.tokens / std::max<double>(1, st.rows * (T + 1)), static_cast<long long>(st.trained_targets),
        100.0 * st.trained_targets / std::max<double>(1, st.rows * T));
    if (st.truncated) {
      std::printf("; %lld longer than a row were cut (%lld of them dropped: no response left)",
                  static_cast<long long>(st.truncated), static_cast<long long>(st.dropped));
    }
    std::printf("\n");
  }
  run.chat_data = std::move(*d);
  return Status::Ok();
}

// The model's shape: --model-dir's config.json, a preset or the default's,
// then the shape flags.
Status ResolveShape(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  model::GptConfig& mc = run.mc;
  if (!opt.model.empty() && !opt.model_dir.empty()) return BadInput("give --model or --model-dir, not both");
  if (!opt.model_dir.empty()) {
    auto h = data::ReadHfConfig(opt.model_dir);
    if (!h.ok()) return BadInput(h.status().message());
    run.hf = std::move(*h);
    mc = run.hf->config;
  } else if (!opt.model.empty()) {
    auto p = model::GptPreset(opt.model);
    if (!p.ok()) return BadInput(p.status().message());
    mc = *p;
  } else {
    mc = DefaultTrainModel(run.tokenizer->VocabSize());
  }
  if (opt.layers > 0) mc.num_layers = opt.layers;
  if (opt.d_model > 0) mc.embed_dim = opt.d_model;
  if (opt.heads > 0) mc.num_heads = opt.heads;
  // With RoPE the context does not size any parameter: cap the default.
  mc.max_seq_len = opt.seq_len > 0 ? opt.seq_len : model::DefaultSeqLen(mc);
  if (opt.vocab > 0) mc.vocab_size = opt.vocab;
  if (Status s = mc.Validate(); !s.ok()) return BadInput(s.message());
  if (run.hf && run.hf->sliding_window > 0 && mc.max_seq_len > run.hf->sliding_window) {
    return BadInput(opt.model_dir + "/config.json: \"sliding_window\" " + std::to_string(run.hf->sliding_window) +
                    " is shorter than --seq-len " + std::to_string(mc.max_seq_len) +
                    "; zinf's attention is full causal: give --seq-len <= the window");
  }
  if (run.hf && (opt.layers > 0 || opt.d_model > 0 || opt.heads > 0 || opt.vocab > 0)) {
    return BadInput("--model-dir takes its shape from config.json: drop --layers/--d-model/--heads/--vocab");
  }
  return Status::Ok();
}

// "auto" values from the model's shape and the run, as DeepSpeed's Hugging
// Face integration resolves them (zinf plan does the same).
Status ResolveAutoValues(TrainRun& run) {
  Config& config = run.config;
  if (config.auto_keys.empty()) return Status::Ok();
  AutoContext ctx;
  ctx.hidden_size = run.mc.embed_dim;
  ctx.world_size = run.world;
  ctx.min_reduce_bucket_elems = sched::kNormBlock;
  ctx.micro_batch_size = run.batch.micro_batch_size;
  ctx.gradient_accumulation_steps = run.batch.gradient_accumulation_steps;
  if (run.opt.lr > 0) ctx.lr = run.opt.lr;
  ctx.total_num_steps = config.scheduler.total_num_steps > 0 ? config.scheduler.total_num_steps : run.steps;
  auto r = ResolveAuto(config, ctx);
  if (!r.ok()) return BadInput(r.status().message());
  for (const std::string& line : *r) Log().info("auto: {}", line);
  config.train_batch_size = run.batch.train_batch_size;
  return Status::Ok();
}

// The train and validation splits (conversations are tokenized here, now
// that the context length is known).
Status SplitData(TrainRun& run) {
  const int64_t T = run.T;
  if (run.chat) {
    ZINF_RETURN_IF_ERROR(OpenChatData(run));
    auto s = run.chat_data->Split(0.05);
    if (!s.ok()) return BadInput(s.status().message() + "; use more data or a shorter --seq-len");
    run.split = *s;
    return Status::Ok();
  }
  auto s = run.dataset->Split(0.05);
  if (!s.ok()) return BadInput(s.status().message());
  run.split = *s;
  if (static_cast<int64_t>(run.split.train.size()) < T + 1 || static_cast<int64_t>(run.split.valid.size()) < T + 1) {
    return BadInput("the data has " + std::to_string(run.dataset->num_tokens()) + " tokens: too few for a context of " +
                    std::to_string(T) + " (train and validation each need at least " + std::to_string(T + 1) +
                    "); use more data or a shorter --seq-len");
  }
  return Status::Ok();
}

// The device (--device over zinf.device), its stream and the engine.
Status BuildEngine(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  DeviceOptions dopt;
  dopt.spec = opt.device.empty() ? run.config.zinf.device : opt.device;
  dopt.memory_budget = run.config.zinf.device_memory;
  if (!opt.device_memory.empty()) {
    auto m = ParseSize(opt.device_memory);
    if (!m.ok()) return BadInput("--device-memory: " + m.status().message());
    dopt.memory_budget = *m;
  }
  auto d = CreateDevice(dopt);
  if (!d.ok() && d.status().code() == StatusCode::kInvalidArgument)
    return BadInput("--device: " + d.status().message());
  ZINF_ASSIGN_OR_RETURN(run.device, run.Check(std::move(d), "device"));
  ZINF_ASSIGN_OR_RETURN(run.stream, run.Check(run.device->CreateStream(), "stream"));
  auto e = Engine::Create(run.config, *run.device, run.comm.get());
  if (!e.ok()) return BadInput(e.status().message());
  run.engine = std::move(*e);
  return Status::Ok();
}

std::string ShortOf(const char* tier, uint64_t need, uint64_t have, const char* what) {
  return std::string(tier) + " needs " + FormatBytes(need) + " of " + FormatBytes(have) + " (" +
         FormatBytes(need - have) + " short; " + what + ")";
}

// This run's row of `zinf plan`: a configuration the engine cannot honour,
// or a model the tiers cannot hold, stops here, before registration writes
// the initial state to its tiers.
Status CheckPlan(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  const Config& config = run.config;
  run.matmul_dtype = opt.matmul.empty()     ? config.zinf.matmul
                     : opt.matmul == "bf16" ? DType::kBFloat16
                                            : DType::kFloat32;
  run.attention = opt.attention.empty()      ? model::ToAttentionKernel(config.zinf.attention)
                  : opt.attention == "flash" ? model::AttentionKernel::kFlash
                  : opt.attention == "plain" ? model::AttentionKernel::kPlain
                                             : model::AttentionKernel::kAuto;
  sched::PlanInput pin;
  pin.config = config;
  pin.world_size = run.world;
  pin.reductions_on_device = sched::CommunicatesDeviceMemory(run.comm.get());
  pin.host_device = run.device->kind() == DeviceKind::kHost;
  pin.gradient_accumulation_steps = run.batch.gradient_accumulation_steps;
  auto m = model::PlanGptModel(run.mc, run.B, run.T, opt.checkpointing, run.engine->compute_dtype(), run.matmul_dtype,
                               run.attention);
  if (!m.ok()) return BadInput(m.status().message());
  pin.model = std::move(*m);
  if (Status s = ApplyPlanRateFlags(opt.rates, pin.rates); !s.ok()) return BadInput(s.message());
  run.rates_measured = opt.rates.any();
  pin.device_memory = run.device->memory_stats().budget_bytes;
  pin.host_memory = sched::PinnedBudgetBytes(config);
  const auto& z = config.zero;
  if (const std::string path = sched::PlanNvmePath(config); !path.empty()) {
    if (auto free = sched::FreeBytesAt(path); free.ok()) pin.nvme_free = *free;
  }
  const sched::PlanRow row = sched::PlanCombination(pin, z.stage, z.offload_optimizer.device, z.offload_param.device);
  if (!row.runnable) return BadInput("the plan: " + row.note);
  std::string problems;
  auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  if (!row.fits_device) add(ShortOf("device", row.device_bytes, pin.device_memory, "--device-memory, or offload more"));
  if (!row.fits_host) add(ShortOf("pinned host memory", row.host_bytes, pin.host_memory, "zinf.host_memory"));
  if (!row.fits_nvme) add(ShortOf("NVMe", row.nvme_bytes, pin.nvme_free, "free space at nvme_path"));
  if (!problems.empty())
    return BadInput("the model does not fit (zinf plan's row for this configuration): " + problems);
  run.plan_row = row;
  return Status::Ok();
}

// The model on the device, and each unit's initial weights registered with
// the engine: from --model-dir's checkpoint (one unit in host memory at a
// time, read from the mapped files), --init, or the seed.
Status BuildModel(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  const model::GptConfig& mc = run.mc;
  model::GptRunOptions& ro = run.ro;
  ro.batch_size = run.B;
  ro.seq_len = run.T;
  ro.num_threads = run.threads;
  ro.param_dtype = run.engine->compute_dtype();
  ro.grad_dtype = DType::kFloat32;
  ro.matmul_dtype = run.matmul_dtype;
  ro.attention = run.attention;
  ro.activation_checkpointing = opt.checkpointing;
  ZINF_ASSIGN_OR_RETURN(run.gpt, run.Check(exec::GptDevice::Create(*run.device, *run.stream, mc, ro), "model"));

  run.units = model::NumUnits(mc);
  std::vector<std::vector<float>> init;
  std::optional<data::HfCheckpoint> checkpoint;
  if (run.hf) {
    if (!opt.init.empty()) return BadInput("give --init or --model-dir, not both");
    auto ck = data::HfCheckpoint::Open(opt.model_dir, mc);
    if (!ck.ok()) return BadInput(ck.status().message());
    checkpoint = std::move(*ck);
  }
  if (!opt.init.empty()) {
    auto reader = data::SafetensorsReader::Open(opt.init);
    if (!reader.ok()) return BadInput(reader.status().message());
    auto w = data::ImportGptWeights(*reader, mc);
    if (!w.ok()) return BadInput(w.status().message());
    init = std::move(*w);
  }
  for (int u = 0; u < run.units; ++u) {
    std::vector<float> v;
    if (checkpoint) {
      v.resize(model::UnitNumParams(mc, u));
      ZINF_RETURN_IF_ERROR(run.Check(checkpoint->ReadUnit(u, v), "read " + opt.model_dir));
    } else if (init.empty()) {
      v.resize(model::UnitNumParams(mc, u));
      model::InitUnitParams(mc, u, opt.seed, v.data());
    } else {
      v = std::move(init[u]);
    }
    ZINF_RETURN_IF_ERROR(
        run.Check(run.engine->AddUnit("unit" + std::to_string(u),
                                      {{"flat", {static_cast<int64_t>(v.size())}, DType::kFloat32, v.data()}}),
                  "register")
            .status());
  }
  run.params = model::NumParams(mc);
  return Status::Ok();
}

}  // namespace

Status ResolveConfig(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  run.embedded = opt.data.empty();
  run.defaults = opt.config.empty();
  if (!run.defaults) {
    auto c = LoadConfigFile(opt.config);
    if (!c.ok()) return BadInput(c.status().message());
    run.config = std::move(*c);
  } else {
    SetDefaultConfig(run);
  }
  ZINF_ASSIGN_OR_RETURN(
      run.comm,
      run.Check(cpu::CreateMpiCommunicator(CommOptions{.timeout_seconds = run.config.zinf.comm_timeout_s}), "ranks"));
  run.rank = run.comm->rank();
  run.world = run.comm->size();
  run.talk = run.rank == 0;
  return ApplyScheduleFlags(run);
}

Status OpenData(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  // A Hugging Face folder brings its tokenizer unless --tokenizer says otherwise.
  std::string tokenizer_spec = opt.tokenizer;
  if (tokenizer_spec.empty() && !opt.model_dir.empty() && std::filesystem::exists(opt.model_dir + "/tokenizer.json")) {
    tokenizer_spec = opt.model_dir + "/tokenizer.json";
  }
  std::string& files = run.tokenizer_files;
  if (!opt.model_dir.empty()) {
    files = opt.model_dir;
  } else if (!tokenizer_spec.empty()) {
    const std::filesystem::path t(tokenizer_spec);
    if (t.filename() == "tokenizer.json")
      files = t.parent_path().string();
    else if (std::filesystem::exists(t / "tokenizer.json"))
      files = t.string();
  }
  if (!files.empty()) {
    std::error_code ec;
    const auto abs = std::filesystem::absolute(files, ec);
    if (!ec) files = abs.string();
  }
  auto t = data::MakeTokenizer(tokenizer_spec);
  if (!t.ok()) return BadInput(t.status().message());
  run.tokenizer = std::move(*t);
  // Text is tokenized here; conversations (.jsonl) once the context length
  // is known, since they are packed into rows of it.
  run.chat = !run.embedded && data::IsChatDataPath(opt.data);
  if (run.embedded) {
    run.dataset = data::TokenDataset::FromText(data::EmbeddedCorpus::Generate(kDefaultCorpusBytes, 7), *run.tokenizer);
  } else if (!run.chat) {
    auto d = data::TokenDataset::Open(opt.data, *run.tokenizer);
    if (!d.ok()) return BadInput(d.status().message());
    run.dataset = std::move(*d);
  }
  return Status::Ok();
}

Status ResolveModel(TrainRun& run) {
  ZINF_RETURN_IF_ERROR(ResolveShape(run));
  ZINF_RETURN_IF_ERROR(ResolveAutoValues(run));
  if (run.mc.vocab_size < run.tokenizer->VocabSize()) {
    return BadInput("the model's vocabulary (" + std::to_string(run.mc.vocab_size) +
                    ") is smaller than the tokenizer's (" + std::to_string(run.tokenizer->VocabSize()) +
                    "): raise --vocab");
  }
  run.T = run.mc.max_seq_len;
  run.B = run.batch.micro_batch_size;
  ZINF_RETURN_IF_ERROR(SplitData(run));
  // The machine's threads shared among the ranks on it (not the world: other
  // machines' ranks have their own cores).
  run.threads = run.opt.threads > 0
                    ? run.opt.threads
                    : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / run.comm->local_size());
  run.config.zinf.optimizer_threads = run.threads;
  return Status::Ok();
}

Status Build(TrainRun& run) {
  ZINF_RETURN_IF_ERROR(BuildEngine(run));
  ZINF_RETURN_IF_ERROR(CheckPlan(run));
  return BuildModel(run);
}

void PrintRunHeader(const TrainRun& run) {
  if (!run.talk) return;
  const Config& config = run.config;
  const model::GptConfig& mc = run.mc;
  std::printf("zinf train: %s, %s parameters (%s), %d rank(s), %s\n",
              run.embedded ? "embedded corpus" : run.opt.data.c_str(),
              FormatCount(static_cast<double>(run.params)).c_str(), mc.ToString().c_str(), run.world,
              run.device->name().c_str());
  std::printf(
      "  config: ZeRO stage %d, %s compute, parameter shards on %s, optimizer %s on %s, micro-batch %lld x "
      "accumulation %lld x %d rank(s) = %lld sequences of %lld tokens, %s lr %.3g, clipping %.3g, %lld steps\n",
      config.zero.stage, std::string(DTypeName(run.engine->compute_dtype())).c_str(),
      config.zero.offload_param.device == OffloadDevice::kNone
          ? "device"
          : std::string(OffloadDeviceName(config.zero.offload_param.device)).c_str(),
      std::string(OptimizerTypeName(config.optimizer.type)).c_str(),
      std::string(OffloadDeviceName(config.zero.offload_optimizer.device)).c_str(), static_cast<long long>(run.B),
      static_cast<long long>(run.batch.gradient_accumulation_steps), run.world,
      static_cast<long long>(run.batch.train_batch_size), static_cast<long long>(run.T),
      std::string(SchedulerTypeName(config.scheduler.type)).c_str(), config.optimizer.lr, config.gradient_clipping,
      static_cast<long long>(run.steps));
  if (!run.tmp.path.empty()) {
    std::printf("  optimizer state on NVMe in %s%s\n", run.tmp.path.c_str(),
                run.tmp.remove ? " (removed afterwards)" : "");
  }
  const sched::StateBytes sb = sched::ModelStateBytes(
      run.params, run.world, config.zero.stage, config.zero.offload_optimizer.device, config.zero.offload_param.device);
  std::printf(
      "  plan per rank: model state on device %s, host %s, nvme %s; activations %s; tokens: train %s, validation %s\n",
      FormatBytes(static_cast<uint64_t>(sb.device)).c_str(), FormatBytes(static_cast<uint64_t>(sb.host)).c_str(),
      FormatBytes(static_cast<uint64_t>(sb.nvme)).c_str(), FormatBytes(run.gpt->activation_bytes()).c_str(),
      FormatCount(static_cast<double>(run.split.train.size())).c_str(),
      FormatCount(static_cast<double>(run.split.valid.size())).c_str());
  std::printf(
      "  plan of this configuration (zinf plan's row, buffers included): device %s, pinned host %s, nvme %s; "
      "predicted step %.3g s at %s rates\n",
      FormatBytes(run.plan_row.device_bytes).c_str(), FormatBytes(run.plan_row.host_bytes).c_str(),
      FormatBytes(run.plan_row.nvme_bytes).c_str(), run.plan_row.step_s, run.rates_measured ? "measured" : "default");
  std::fflush(stdout);
}

}  // namespace zinf::tools
