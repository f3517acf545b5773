// `zinf train`: fine-tune the GPT reference model through the engine.
//
// With no arguments it runs the embedded default: a small model on the
// embedded corpus (whose entropy rate is known exactly, so the result can be
// judged), ZeRO stage 3 with the parameter shards in pinned host memory and the
// optimizer state on NVMe in $ZINF_TMPDIR (else a directory under the working
// directory, removed afterwards). Flags override
// the config file; the resolved configuration and the plan are printed first,
// then one live progress line, then a summary with the validation loss and a
// generated sample. Under mpirun every rank trains on its own windows of the
// data; rank 0 prints.
#include "tools/train.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/communicator.h"
#include "common/fault_injection.h"
#include "common/logging.h"
#include "common/runtime_info.h"
#include "common/units.h"
#include "cpu/mpi_comm.h"
#include "data/chat_data.h"
#include "data/embedded_corpus.h"
#include "data/gpt_weights.h"
#include "data/safetensors.h"
#include "data/token_dataset.h"
#include "data/hf_checkpoint.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "model/gpt_config.h"
#include "exec/gpt_device.h"
#include "sched/device_kernels.h"
#include "sched/partition.h"
#include "model/gpt_plan.h"
#include "sched/plan.h"
#include "sched/state_bytes.h"
#include "sched/timeline.h"
#include "tools/plan.h"
#include "tools/train_feed.h"
#include "tools/train_plot.h"
#include "zinf/config.h"
#include "zinf/device.h"
#include "zinf/engine.h"

namespace zinf::tools {
namespace {

struct TrainOptions {
  std::string config;
  std::string model;  // a preset; empty: the flags below (or the default's shape)
  int64_t layers = 0, d_model = 0, heads = 0, seq_len = 0, vocab = 0;
  std::string data, tokenizer, init, export_path, export_names = "zinf", export_dtype = "bf16";
  std::string model_dir, export_dir;  // Hugging Face folders in and out
  std::string chat_template = "auto";  // for .jsonl data
  int64_t steps = 0, micro_batch = 0, grad_accum = 0;
  double lr = 0;
  std::string device;  // empty: the config's zinf.device (auto by default)
  std::string device_memory;
  std::string matmul;  // empty: the config's zinf.matmul (fp32 by default)
  std::string attention;  // empty: the config's zinf.attention (auto by default)
  bool checkpointing = false;  // activation checkpointing: each block's forward again in its backward
  uint64_t seed = 1;
  int threads = 0;
  int sample_tokens = 120;
  std::string metrics_json, plot, timeline;
  std::string save_dir, resume;
  int64_t save_every = 0, keep = 2;
  PlanRateFlags rates;  // measured rates for the plan's step time (zinf plan's flags)
};

// A bad input: one line, exit code 2.
struct Usage {
  std::string message;
};
// A failure while running: exit code 1.
struct Failure {
  std::string message;
};

// The ranks of this run, once they are known: a failure on this rank is
// told to every other one before it propagates, so none of them waits in a
// collective this rank will never join (the engine does the same for its
// own calls; this covers the model's and the loop's).
Communicator* g_ranks = nullptr;

void Fail(const Status& s, const std::string& what) {
  if (g_ranks && g_ranks->size() > 1) g_ranks->Abort(s.WithContext(what));
  throw Failure{what + ": " + s.ToString()};
}
template <class T>
T Must(Result<T> r, const std::string& what) {
  if (!r.ok()) Fail(r.status(), what);
  return std::move(*r);
}
void Must(const Status& s, const std::string& what) {
  if (!s.ok()) Fail(s, what);
}

// The embedded default's shape and schedule: small enough to finish in well
// under 90 s on two cores, large enough to learn the corpus's structure.
constexpr int64_t kDefaultSteps = 300, kDefaultMicroBatch = 8;
constexpr double kDefaultLr = 3e-3;
constexpr uint64_t kDefaultCorpusBytes = 2'000'000;

// Conversations (--data *.jsonl) tokenized by the chat template and packed
// into rows of T tokens; rank 0 reports what came of them.
std::unique_ptr<data::ChatDataset> OpenChatData(const TrainOptions& opt, const data::Tokenizer& tokenizer, int64_t T,
                                                bool talk) {
  data::ChatTemplate tmpl;
  auto t = opt.chat_template == "auto" ? data::DetectChatTemplate(tokenizer) : data::ParseChatTemplate(opt.chat_template);
  if (!t.ok()) throw Usage{"--chat-template: " + t.status().message()};
  tmpl = *t;
  const bool tty = talk && isatty(2);
  auto progress = [&, last = std::chrono::steady_clock::now()](uint64_t done, uint64_t total) mutable {
    const auto now = std::chrono::steady_clock::now();
    if (!tty || (now - last < std::chrono::milliseconds(500) && done < total)) return;
    last = now;
    std::fprintf(stderr, "\r  tokenizing %s: %.0f%%", opt.data.c_str(), 100.0 * done / std::max<uint64_t>(total, 1));
    if (done == total) std::fputc('\n', stderr);
  };
  auto d = data::ChatDataset::Open(opt.data, tokenizer, tmpl, T, progress);
  if (!d.ok()) throw Usage{d.status().message()};
  const data::ChatDataStats& st = (*d)->stats();
  if (talk) {
    std::printf("  chat data: %lld examples (%s template), %lld rows of %lld tokens (%.0f%% filled), "
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
  return std::move(*d);
}

int Run(const TrainOptions& opt) {
  // The progress line is the display; the engine's per-step info lines go to
  // --metrics-json. ZINF_LOG_LEVEL (or --log-level debug) brings them back.
  if (!std::getenv("ZINF_LOG_LEVEL") && Log().level() == spdlog::level::info) SetLogLevel("warn");
  const bool embedded = opt.data.empty();
  const bool defaults = opt.config.empty();

  // ---- Configuration: the file (or the embedded default's), then flags.
  Config config;
  std::string tmp_dir;
  bool remove_tmp = false;
  if (!defaults) {
    auto c = LoadConfigFile(opt.config);
    if (!c.ok()) throw Usage{c.status().message()};
    config = std::move(*c);
  } else {
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
    tmp_dir = env && *env ? std::string(env) : (std::filesystem::current_path() / ("zinf-train-" + std::to_string(getpid()))).string();
    remove_tmp = !(env && *env);
    std::filesystem::create_directories(tmp_dir);
    config.zero.offload_optimizer.nvme_path = {tmp_dir};
  }
  auto comm = Must(CreateMpiCommunicator(CommOptions{.timeout_seconds = config.zinf.comm_timeout_s}), "ranks");
  const int rank = comm->rank(), world = comm->size();
  const bool talk = rank == 0;
  g_ranks = comm.get();
  struct ForgetRanks {
    ~ForgetRanks() { g_ranks = nullptr; }
  } forget_ranks;
  struct RemoveTmp {
    std::string dir;
    bool on;
    ~RemoveTmp() {
      std::error_code ec;
      if (on) std::filesystem::remove_all(dir, ec);
    }
  } remove_guard{tmp_dir, remove_tmp};
  const int64_t steps = opt.steps > 0 ? opt.steps : kDefaultSteps;
  if (opt.sample_tokens < 0) throw Usage{"--sample-tokens must be >= 0 (0: no sample)"};
  if (opt.lr > 0) {
    config.optimizer.lr = opt.lr;
    if (config.scheduler.type != SchedulerType::kNone) config.scheduler.warmup_max_lr = opt.lr;
  }
  if (config.scheduler.type == SchedulerType::kWarmupDecayLR || config.scheduler.type == SchedulerType::kWarmupCosineLR) {
    if (config.scheduler.total_num_steps <= 0 || defaults) config.scheduler.total_num_steps = std::max<int64_t>(steps, config.scheduler.warmup_num_steps + 2);
  }
  if (opt.micro_batch > 0) {
    if (config.train_micro_batch_size_per_gpu && *config.train_micro_batch_size_per_gpu != opt.micro_batch && !defaults) {
      throw Usage{"--micro-batch " + std::to_string(opt.micro_batch) + " contradicts train_micro_batch_size_per_gpu = " +
                  std::to_string(*config.train_micro_batch_size_per_gpu) + " in " + opt.config +
                  ": drop one of them"};
    }
    config.train_micro_batch_size_per_gpu = opt.micro_batch;
  }
  if (opt.grad_accum > 0) config.gradient_accumulation_steps = opt.grad_accum;
  if (!config.train_micro_batch_size_per_gpu && !config.train_batch_size) config.train_micro_batch_size_per_gpu = kDefaultMicroBatch;
  if (!config.gradient_accumulation_steps && !(config.train_batch_size && config.train_micro_batch_size_per_gpu)) config.gradient_accumulation_steps = 1;
  const BatchSizes batch = [&] {
    auto b = ResolveBatchSizes(config, world);
    if (!b.ok()) throw Usage{b.status().message()};
    return *b;
  }();
  config.train_micro_batch_size_per_gpu = batch.micro_batch_size;
  config.gradient_accumulation_steps = batch.gradient_accumulation_steps;
  config.train_batch_size = batch.train_batch_size;

  // ---- Tokenizer and data.
  // A Hugging Face folder brings its tokenizer unless --tokenizer says otherwise.
  std::string tokenizer_spec = opt.tokenizer;
  if (tokenizer_spec.empty() && !opt.model_dir.empty() && std::filesystem::exists(opt.model_dir + "/tokenizer.json")) {
    tokenizer_spec = opt.model_dir + "/tokenizer.json";
  }
  // Where an exported Hugging Face folder copies its tokenizer files from.
  std::string tokenizer_files;
  if (!opt.model_dir.empty()) {
    tokenizer_files = opt.model_dir;
  } else if (!tokenizer_spec.empty()) {
    const std::filesystem::path t(tokenizer_spec);
    if (t.filename() == "tokenizer.json") tokenizer_files = t.parent_path().string();
    else if (std::filesystem::exists(t / "tokenizer.json")) tokenizer_files = t.string();
  }
  if (!tokenizer_files.empty()) {
    std::error_code ec;
    const auto abs = std::filesystem::absolute(tokenizer_files, ec);
    if (!ec) tokenizer_files = abs.string();
  }
  auto tokenizer = [&] {
    auto t = data::MakeTokenizer(tokenizer_spec);
    if (!t.ok()) throw Usage{t.status().message()};
    return std::move(*t);
  }();
  // Text is tokenized here; conversations (.jsonl) once the context length
  // is known, since they are packed into rows of it.
  const bool chat = !embedded && data::IsChatDataPath(opt.data);
  std::unique_ptr<data::TokenDataset> dataset;
  if (embedded) {
    dataset = data::TokenDataset::FromText(data::EmbeddedCorpus::Generate(kDefaultCorpusBytes, 7), *tokenizer);
  } else if (!chat) {
    auto d = data::TokenDataset::Open(opt.data, *tokenizer);
    if (!d.ok()) throw Usage{d.status().message()};
    dataset = std::move(*d);
  }

  // ---- Model.
  model::GptConfig mc;
  std::optional<data::HfModel> hf;
  if (!opt.model.empty() && !opt.model_dir.empty()) throw Usage{"give --model or --model-dir, not both"};
  if (!opt.model_dir.empty()) {
    auto h = data::ReadHfConfig(opt.model_dir);
    if (!h.ok()) throw Usage{h.status().message()};
    hf = std::move(*h);
    mc = hf->config;
  } else if (!opt.model.empty()) {
    auto p = model::GptPreset(opt.model);
    if (!p.ok()) throw Usage{p.status().message()};
    mc = *p;
  } else {
    mc = DefaultTrainModel(tokenizer->VocabSize());
  }
  if (opt.layers > 0) mc.num_layers = opt.layers;
  if (opt.d_model > 0) mc.embed_dim = opt.d_model;
  if (opt.heads > 0) mc.num_heads = opt.heads;
  // With RoPE the context does not size any parameter: cap the default.
  mc.max_seq_len = opt.seq_len > 0 ? opt.seq_len : model::DefaultSeqLen(mc);
  if (opt.vocab > 0) mc.vocab_size = opt.vocab;
  if (Status s = mc.Validate(); !s.ok()) throw Usage{s.message()};
  if (hf && hf->sliding_window > 0 && mc.max_seq_len > hf->sliding_window) {
    throw Usage{opt.model_dir + "/config.json: \"sliding_window\" " + std::to_string(hf->sliding_window) +
                " is shorter than --seq-len " + std::to_string(mc.max_seq_len) +
                "; zinf's attention is full causal: give --seq-len <= the window"};
  }
  if (hf && (opt.layers > 0 || opt.d_model > 0 || opt.heads > 0 || opt.vocab > 0)) {
    throw Usage{"--model-dir takes its shape from config.json: drop --layers/--d-model/--heads/--vocab"};
  }
  // "auto" values from the model's shape and the run, as DeepSpeed's Hugging
  // Face integration resolves them (zinf plan does the same).
  if (!config.auto_keys.empty()) {
    AutoContext ctx;
    ctx.hidden_size = mc.embed_dim;
    ctx.world_size = world;
    ctx.min_reduce_bucket_elems = kNormBlock;
    ctx.micro_batch_size = batch.micro_batch_size;
    ctx.gradient_accumulation_steps = batch.gradient_accumulation_steps;
    if (opt.lr > 0) ctx.lr = opt.lr;
    ctx.total_num_steps = config.scheduler.total_num_steps > 0 ? config.scheduler.total_num_steps : steps;
    auto r = ResolveAuto(config, ctx);
    if (!r.ok()) throw Usage{r.status().message()};
    for (const std::string& line : *r) Log().info("auto: {}", line);
    config.train_batch_size = batch.train_batch_size;
  }
  if (mc.vocab_size < tokenizer->VocabSize()) {
    throw Usage{"the model's vocabulary (" + std::to_string(mc.vocab_size) + ") is smaller than the tokenizer's (" +
                std::to_string(tokenizer->VocabSize()) + "): raise --vocab"};
  }
  const int64_t T = mc.max_seq_len, B = batch.micro_batch_size;
  std::unique_ptr<data::ChatDataset> chat_data;
  data::DataSplit split;
  if (chat) {
    chat_data = OpenChatData(opt, *tokenizer, T, talk);
    auto s = chat_data->Split(0.05);
    if (!s.ok()) throw Usage{s.status().message() + "; use more data or a shorter --seq-len"};
    split = *s;
  } else {
    auto s = dataset->Split(0.05);
    if (!s.ok()) throw Usage{s.status().message()};
    split = *s;
    if (static_cast<int64_t>(split.train.size()) < T + 1 || static_cast<int64_t>(split.valid.size()) < T + 1) {
      throw Usage{"the data has " + std::to_string(dataset->num_tokens()) + " tokens: too few for a context of " +
                  std::to_string(T) + " (train and validation each need at least " + std::to_string(T + 1) +
                  "); use more data or a shorter --seq-len"};
    }
  }
  // The machine's threads shared among the ranks on it (not the world: other
  // machines' ranks have their own cores).
  const int threads =
      opt.threads > 0 ? opt.threads
                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm->local_size());
  config.zinf.optimizer_threads = threads;

  // ---- Device, engine, model.
  DeviceOptions dopt;
  dopt.spec = opt.device.empty() ? config.zinf.device : opt.device;
  dopt.memory_budget = config.zinf.device_memory;
  if (!opt.device_memory.empty()) {
    auto m = ParseSize(opt.device_memory);
    if (!m.ok()) throw Usage{"--device-memory: " + m.status().message()};
    dopt.memory_budget = *m;
  }
  auto device = [&] {
    auto d = CreateDevice(dopt);
    if (!d.ok() && d.status().code() == StatusCode::kInvalidArgument) throw Usage{"--device: " + d.status().message()};
    return Must(std::move(d), "device");
  }();
  auto stream = Must(device->CreateStream(), "stream");
  auto engine = [&] {
    auto e = Engine::Create(config, *device, comm.get());
    if (!e.ok()) throw Usage{e.status().message()};
    return std::move(*e);
  }();
  // ---- This run's row of `zinf plan`: a configuration the engine cannot
  // honour, or a model the tiers cannot hold, stops here, before
  // registration writes the initial state to its tiers.
  bool rates_measured = false;  // any rate from a file, not the stated defaults
  const DType matmul_dtype = opt.matmul.empty()      ? config.zinf.matmul
                             : opt.matmul == "bf16" ? DType::kBFloat16
                                                    : DType::kFloat32;
  const model::AttentionKernel attention = opt.attention.empty()    ? model::ToAttentionKernel(config.zinf.attention)
                                           : opt.attention == "flash" ? model::AttentionKernel::kFlash
                                           : opt.attention == "plain" ? model::AttentionKernel::kPlain
                                                                      : model::AttentionKernel::kAuto;
  const PlanRow plan_row = [&] {
    PlanInput pin;
    pin.config = config;
    pin.world_size = world;
    pin.reductions_on_device = sched::CommunicatesDeviceMemory(comm.get());
    pin.gradient_accumulation_steps = batch.gradient_accumulation_steps;
    auto m = PlanGptModel(mc, B, T, opt.checkpointing, engine->compute_dtype(), matmul_dtype, attention);
    if (!m.ok()) throw Usage{m.status().message()};
    pin.model = std::move(*m);
    if (Status s = ApplyPlanRateFlags(opt.rates, pin.rates); !s.ok()) throw Usage{s.message()};
    rates_measured = opt.rates.any();
    pin.device_memory = device->memory_stats().budget_bytes;
    pin.host_memory = PinnedBudgetBytes(config);
    const auto& z = config.zero;
    if (const std::string path = PlanNvmePath(config); !path.empty()) {
      if (auto free = FreeBytesAt(path); free.ok()) pin.nvme_free = *free;
    }
    const PlanRow row = PlanCombination(pin, z.stage, z.offload_optimizer.device, z.offload_param.device);
    if (!row.runnable) throw Usage{"the plan: " + row.note};
    auto short_of = [](const char* tier, uint64_t need, uint64_t have, const char* what) {
      return std::string(tier) + " needs " + FormatBytes(need) + " of " + FormatBytes(have) + " (" +
             FormatBytes(need - have) + " short; " + what + ")";
    };
    std::string problems;
    auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
    if (!row.fits_device) add(short_of("device", row.device_bytes, pin.device_memory, "--device-memory, or offload more"));
    if (!row.fits_host) add(short_of("pinned host memory", row.host_bytes, pin.host_memory, "zinf.host_memory"));
    if (!row.fits_nvme) add(short_of("NVMe", row.nvme_bytes, pin.nvme_free, "free space at nvme_path"));
    if (!problems.empty()) throw Usage{"the model does not fit (zinf plan's row for this configuration): " + problems};
    return row;
  }();

  model::GptRunOptions ro;
  ro.batch_size = B;
  ro.seq_len = T;
  ro.num_threads = threads;
  ro.param_dtype = engine->compute_dtype();
  ro.grad_dtype = DType::kFloat32;
  ro.matmul_dtype = matmul_dtype;
  ro.attention = attention;
  ro.activation_checkpointing = opt.checkpointing;
  auto gpt = Must(model::GptDevice::Create(*device, *stream, mc, ro), "model");

  const int units = model::NumUnits(mc);
  std::vector<std::vector<float>> init;
  std::optional<data::HfCheckpoint> checkpoint;
  if (hf) {
    if (!opt.init.empty()) throw Usage{"give --init or --model-dir, not both"};
    auto ck = data::HfCheckpoint::Open(opt.model_dir, mc);
    if (!ck.ok()) throw Usage{ck.status().message()};
    checkpoint = std::move(*ck);
  }
  if (!opt.init.empty()) {
    auto reader = data::SafetensorsReader::Open(opt.init);
    if (!reader.ok()) throw Usage{reader.status().message()};
    auto w = data::ImportGptWeights(*reader, mc);
    if (!w.ok()) throw Usage{w.status().message()};
    init = std::move(*w);
  }
  for (int u = 0; u < units; ++u) {
    std::vector<float> v;
    if (checkpoint) {
      // One unit in host memory at a time, read from the mapped files.
      v.resize(model::UnitNumParams(mc, u));
      Must(checkpoint->ReadUnit(u, v), "read " + opt.model_dir);
    } else if (init.empty()) {
      v.resize(model::UnitNumParams(mc, u));
      model::InitUnitParams(mc, u, opt.seed, v.data());
    } else {
      v = std::move(init[u]);
    }
    Must(engine->AddUnit("unit" + std::to_string(u), {{"flat", {static_cast<int64_t>(v.size())}, DType::kFloat32, v.data()}}),
         "register");
  }
  const int64_t params = model::NumParams(mc);

  if (talk) {
    std::printf("zinf train: %s, %s parameters (%s), %d rank(s), %s\n", embedded ? "embedded corpus" : opt.data.c_str(),
                FormatCount(static_cast<double>(params)).c_str(), mc.ToString().c_str(), world, device->name().c_str());
    std::printf("  config: ZeRO stage %d, %s compute, parameter shards on %s, optimizer %s on %s, micro-batch %lld x accumulation %lld x %d rank(s) = %lld sequences of %lld tokens, %s lr %.3g, clipping %.3g, %lld steps\n",
                config.zero.stage, std::string(DTypeName(engine->compute_dtype())).c_str(),
                config.zero.offload_param.device == OffloadDevice::kNone
                    ? "device"
                    : std::string(OffloadDeviceName(config.zero.offload_param.device)).c_str(),
                std::string(OptimizerTypeName(config.optimizer.type)).c_str(),
                std::string(OffloadDeviceName(config.zero.offload_optimizer.device)).c_str(), static_cast<long long>(B),
                static_cast<long long>(batch.gradient_accumulation_steps), world,
                static_cast<long long>(batch.train_batch_size), static_cast<long long>(T),
                std::string(SchedulerTypeName(config.scheduler.type)).c_str(), config.optimizer.lr, config.gradient_clipping,
                static_cast<long long>(steps));
    if (!tmp_dir.empty()) std::printf("  optimizer state on NVMe in %s%s\n", tmp_dir.c_str(), remove_tmp ? " (removed afterwards)" : "");
    const StateBytes sb = ModelStateBytes(params, world, config.zero.stage, config.zero.offload_optimizer.device,
                                          config.zero.offload_param.device);
    std::printf("  plan per rank: model state on device %s, host %s, nvme %s; activations %s; tokens: train %s, validation %s\n",
                FormatBytes(static_cast<uint64_t>(sb.device)).c_str(), FormatBytes(static_cast<uint64_t>(sb.host)).c_str(),
                FormatBytes(static_cast<uint64_t>(sb.nvme)).c_str(), FormatBytes(gpt->activation_bytes()).c_str(),
                FormatCount(static_cast<double>(split.train.size())).c_str(), FormatCount(static_cast<double>(split.valid.size())).c_str());
    std::printf("  plan of this configuration (zinf plan's row, buffers included): device %s, pinned host %s, nvme %s; "
                "predicted step %.3g s at %s rates\n",
                FormatBytes(plan_row.device_bytes).c_str(), FormatBytes(plan_row.host_bytes).c_str(),
                FormatBytes(plan_row.nvme_bytes).c_str(), plan_row.step_s, rates_measured ? "measured" : "default");
    std::fflush(stdout);
  }

  // ---- Training (resumed from a checkpoint when asked).
  data::BatchLoader loader =
      Must(data::BatchLoader::Create(split.train, {B, T, opt.seed, true}, split.train_targets), "data");
  int64_t first_step = 0;
  const bool tty = isatty(2);
  if (!opt.resume.empty()) {
    const std::string from = opt.resume == "latest" ? opt.save_dir : opt.resume;
    if (from.empty()) throw Usage{"--resume latest needs --save-dir"};
    auto client = engine->Load(from);
    if (!client.ok()) throw Usage{"--resume " + opt.resume + ": " + client.status().message()};
    auto j = nlohmann::json::parse(*client, nullptr, false);
    // The client state comes from the checkpoint's manifest: check every
    // field's type before reading it (get<> would throw, and abort the run).
    auto loader_field = [&](const char* key) {
      return j.is_object() && j.contains("loader") && j["loader"].is_object() && j["loader"].contains(key) &&
             j["loader"][key].is_number_unsigned();
    };
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
        j["step"].get<int64_t>() < 0 || !loader_field("epoch") || !loader_field("window")) {
      throw Usage{"--resume " + opt.resume + ": the checkpoint was not written by zinf train"};
    }
    first_step = j["step"].get<int64_t>();
    Must(loader.Restore({j["loader"]["epoch"].get<uint64_t>(), j["loader"]["window"].get<uint64_t>()}), "resume");
    if (talk) std::printf("  resumed from %s at step %lld\n", from.c_str(), static_cast<long long>(first_step));
  }
  // Saves step-N under --save-dir and keeps the newest --keep of them.
  auto save = [&](int64_t done) {
    nlohmann::json client = {{"step", done},
                             {"loader", {{"epoch", loader.Position().epoch}, {"window", loader.Position().window}}},
                             {"model", {{"name", mc.name}, {"vocab_size", mc.vocab_size}, {"max_seq_len", mc.max_seq_len},
                                        {"embed_dim", mc.embed_dim}, {"num_layers", mc.num_layers},
                                        {"num_heads", mc.num_heads}}}};
    // The Llama family's whole shape, for `zinf export --hf-dir`.
    if (!mc.IsGpt2Family()) {
      client["hf_config"] = hf ? hf->config_json : data::HfConfigJson(mc);
      client["tokenizer_dir"] = tokenizer_files;
    }
    const std::string path = Must(engine->Save(opt.save_dir, client.dump()), "save");
    if (!talk) return;
    std::vector<std::filesystem::path> old;
    for (const auto& e : std::filesystem::directory_iterator(opt.save_dir)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos) old.push_back(e.path());
    }
    std::sort(old.begin(), old.end(), [](const auto& a, const auto& b) {
      return std::stoll(a.filename().string().substr(5)) < std::stoll(b.filename().string().substr(5));
    });
    for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(opt.keep, 1)) < old.size(); ++i) {
      std::error_code ec;
      std::filesystem::remove_all(old[i], ec);
    }
    if (!tty) std::fprintf(stderr, "saved %s\n", path.c_str());
  };
  std::vector<int32_t> skip_tok(B * T), skip_tgt(B * T);
  auto feed = Must(tools::TrainFeed::Create(*device, *stream, B * T, batch.gradient_accumulation_steps), "set-up");
  int64_t micro = 0;  // micro-steps fed, validation included
  int32_t* dtok = static_cast<int32_t*>(Must(device->Allocate(B * T * 4, *stream), "tokens"));
  int32_t* dtgt = static_cast<int32_t*>(Must(device->Allocate(B * T * 4, *stream), "targets"));
  float* dloss = static_cast<float*>(Must(device->Allocate(4, *stream), "loss"));
  std::ofstream metrics;
  if (talk && !opt.metrics_json.empty()) {
    metrics.open(opt.metrics_json);
    if (!metrics) throw Usage{"--metrics-json: cannot write " + opt.metrics_json};
  }
  const int L = static_cast<int>(mc.num_layers);
  const bool loss_now = config.zinf.stop_on_nonfinite_loss;  // each loss before its Step: a wait per micro-step
  std::vector<double> losses, tps_hist, step_secs;
  std::vector<StepStats> recent;  // the last steps' metrics, for their timelines
  double optimizer_s = 0, comm_s = 0, copy_s = 0, io_s = 0, stall_s = 0, train_s = 0;
  uint64_t nvme_read = 0, nvme_written = 0, copied = 0;  // bytes moved per tier, all steps
  // Copies micro-step `micro`'s batch to the device and enqueues the
  // forward, each block fetched and released in turn; the embedding and the
  // final norm stay fetched for the head's backward (returned: their
  // parameters).
  // The model's work on the engine's timeline, unit by unit (Engine::Trace).
  auto compute = [&](const std::string& what, const std::function<Status()>& enqueue) {
    return engine->Trace(*stream, "compute", what, enqueue);
  };
  auto enqueue_forward = [&](const char* what) -> std::pair<const void*, const void*> {
    Must(feed->Feed(micro++, dtok, dtgt), "copy");
    const void* emb = Must(engine->Fetch(0, *stream), "fetch").data;
    Must(compute("forward embedding", [&] { return gpt->EnqueueEmbedForward(dtok, emb); }), what);
    for (int l = 0; l < L; ++l) {
      const void* block = Must(engine->Fetch(l + 1, *stream), "fetch").data;
      Must(compute("forward block " + std::to_string(l), [&] { return gpt->EnqueueBlockForward(l, block); }), what);
      Must(engine->Release(l + 1, *stream), "release");
    }
    const void* fin = Must(engine->Fetch(L + 1, *stream), "fetch").data;
    Must(compute("forward head", [&] { return gpt->EnqueueHeadForward(dtgt, fin, emb, dloss); }), what);
    return {emb, fin};
  };
  // Step s is looked at once step s + 1 is enqueued (its losses and
  // metrics wait only for step s, while the device has s + 1 queued); the
  // loop itself never waits for the device in steady state.
  const auto start = std::chrono::steady_clock::now();
  auto last_done = start;
  DeviceWaitStats waits_before = device->wait_stats();
  std::vector<std::vector<char>> poisoned(2, std::vector<char>(batch.gradient_accumulation_steps));
  auto finish = [&](int64_t step) {
    std::vector<float> micro_losses = Must(feed->Losses(step), "step " + std::to_string(step + 1));
    double loss_sum = 0;
    for (size_t k = 0; k < micro_losses.size(); ++k) {
      loss_sum += poisoned[step % 2][k] ? std::numeric_limits<double>::quiet_NaN() : micro_losses[k];
    }
    // Boundaries count steps from the start of training, checkpoints included.
    const StepStats st = Must(engine->Stats(step + 1), "stats");
    // The step's timeline, with the step before it (whose updates run
    // during this one's forward).
    recent.push_back(st);
    if (recent.size() > 3) recent.erase(recent.begin());
    std::optional<sched::StepTimeline> tl;
    for (sched::StepTimeline& t : sched::SummarizeTimeline(recent)) {
      if (t.boundary == st.boundary) tl = std::move(t);
    }
    const auto now = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(now - last_done).count();
    last_done = now;
    const DeviceWaitStats w = device->wait_stats();
    const uint64_t blocking = w.blocking - waits_before.blocking, draining = w.draining - waits_before.draining;
    waits_before = w;
    train_s += secs;
    step_secs.push_back(secs);
    const double loss = loss_sum / batch.gradient_accumulation_steps;
    const double tps = static_cast<double>(batch.train_batch_size * T) / secs;
    losses.push_back(loss);
    tps_hist.push_back(tps);
    optimizer_s += st.optimizer_seconds;
    comm_s += st.comm_seconds;
    copy_s += st.copy_seconds;
    io_s += st.io_seconds;
    stall_s += st.stall_seconds;
    nvme_read += st.nvme_bytes_read;
    nvme_written += st.nvme_bytes_written;
    copied += st.copy_bytes;
    if (!talk) return;
    const double elapsed = std::chrono::duration<double>(now - start).count();
    const double eta = elapsed / (step + 1 - first_step) * (steps - step - 1);
    if (tty || (step + 1) % std::max<int64_t>(1, steps / 10) == 0 || step + 1 == steps) {
      // The timeline's shares when the step has one; else the engine's
      // seconds over the host's step time.
      char busy[512];
      if (tl) {
        std::snprintf(busy, sizeof busy, "%s", sched::FormatStepTimeline(*tl).c_str());
      } else {
        std::snprintf(busy, sizeof busy, "optimizer %.0f%% | stall %.0f%%", 100 * st.optimizer_seconds / secs,
                      100 * st.stall_seconds / secs);
      }
      std::fprintf(stderr,
                   "%sstep %lld/%lld  loss %.4f  %s tokens/s  step %.0f ms  ETA %.0f s | %s | nvme %.2f GB/s  "
                   "copies %.2f GB/s%s",
                   tty ? "\r" : "", static_cast<long long>(step + 1), static_cast<long long>(steps), loss,
                   FormatCount(tps).c_str(), secs * 1e3, eta, busy,
                   static_cast<double>(st.nvme_bytes_read + st.nvme_bytes_written) / secs / 1e9,
                   static_cast<double>(st.copy_bytes) / secs / 1e9, tty ? "   " : "\n");
      if (tty && step + 1 == steps) std::fprintf(stderr, "\n");
    }
    if (metrics.is_open()) {
      nlohmann::json j = {{"step", step + 1}, {"loss", loss}, {"tokens_per_s", tps}, {"step_seconds", secs},
                          {"lr", st.lr}, {"grad_norm", st.grad_norm}, {"clip_coef", st.clip_coef},
                          {"skipped", st.skipped}, {"loss_scale", st.loss_scale},
                          {"optimizer_seconds", st.optimizer_seconds}, {"comm_seconds", st.comm_seconds},
                          {"copy_seconds", st.copy_seconds}, {"io_seconds", st.io_seconds},
                          {"stall_seconds", st.stall_seconds}, {"nvme_bytes_read", st.nvme_bytes_read},
                          {"nvme_bytes_written", st.nvme_bytes_written}, {"copy_bytes", st.copy_bytes},
                          {"device_bytes_in_use", st.device_bytes_in_use},
                          {"host_pinned_bytes", st.host_pinned_bytes},
                          {"host_waits", blocking}, {"host_waits_draining", draining}};
      if (tl) {
        std::map<std::string, double> share;
        for (const auto& [lane, seconds] : tl->busy) share[lane] = tl->share(lane);
        j["timeline"] = {{"period_seconds", tl->seconds()}, {"busy_share", share},
                         {"stall_seconds_by_cause", tl->stalls}};
      }
      metrics << j.dump() << "\n";
    }
  };
  for (int64_t step = first_step; step < steps; ++step) {
    for (int64_t k = 0; k < batch.gradient_accumulation_steps; ++k) {
      auto [tok, tgt] = Must(feed->Slot(micro), "step " + std::to_string(step + 1));
      for (int r = 0; r < world; ++r) {  // every rank its own windows
        if (r == rank) loader.Next(tok, tgt);
        else loader.Next(skip_tok.data(), skip_tgt.data());
      }
      const auto [emb, fin] = enqueue_forward("forward");
      const float scale = Must(engine->loss_scale(), "loss scale");
      {
        void* emb_grads = Must(engine->GradBuffers(0), "grads").data;
        void* head_grads = Must(engine->GradBuffers(L + 1), "grads").data;
        Must(compute("backward head",
                     [&] { return gpt->EnqueueHeadBackward(scale, fin, emb, head_grads, emb_grads); }),
             "backward");
      }
      Must(engine->GradsReady(L + 1, *stream), "grads ready");
      Must(engine->Release(L + 1, *stream), "release");
      for (int l = L - 1; l >= 0; --l) {
        void* grads = Must(engine->GradBuffers(l + 1), "grads").data;
        const void* block = Must(engine->Fetch(l + 1, *stream), "fetch").data;
        Must(compute("backward block " + std::to_string(l), [&] { return gpt->EnqueueBlockBackward(l, block, grads); }),
             "backward");
        Must(engine->GradsReady(l + 1, *stream), "grads ready");
        Must(engine->Release(l + 1, *stream), "release");
      }
      {
        void* emb_grads = Must(engine->GradBuffers(0), "grads").data;
        Must(compute("backward embedding", [&] { return gpt->EnqueueEmbedBackward(emb_grads); }), "backward");
      }
      Must(engine->GradsReady(0, *stream), "grads ready");
      Must(engine->Release(0, *stream), "release");
      Must(feed->KeepLoss(step, k, dloss), "copy");
      poisoned[step % 2][k] = fault::At(fault::Site::kLoss) != 0;
      if (loss_now) {  // the engine checks each loss before the update it would feed
        float loss = Must(feed->LossNow(step, k), "step " + std::to_string(step + 1));
        if (poisoned[step % 2][k]) loss = std::numeric_limits<float>::quiet_NaN();
        Must(engine->ReportLoss(loss), "step " + std::to_string(step + 1));
      }
      Must(engine->Step(), "step");
    }
    Must(feed->EndStep(step), "step " + std::to_string(step + 1));
    if (step > first_step) finish(step - 1);
    if (!opt.save_dir.empty() && opt.save_every > 0 && ((step + 1) % opt.save_every == 0 || step + 1 == steps)) {
      // A checkpoint waits for the device: its time and waits are not the next step's.
      const auto t = std::chrono::steady_clock::now();
      const DeviceWaitStats w = device->wait_stats();
      save(step + 1);
      last_done += std::chrono::steady_clock::now() - t;
      waits_before.blocking += device->wait_stats().blocking - w.blocking;
      waits_before.draining += device->wait_stats().draining - w.draining;
    }
  }
  Must(engine->Synchronize(), "synchronize");
  if (steps > first_step) finish(steps - 1);

  // ---- Validation: forward passes through the engine on the device (every
  // rank runs them: a stage-3 Fetch is collective); the mean over up to 16
  // windows of the validation split.
  data::BatchLoader valid =
      Must(data::BatchLoader::Create(split.valid, {B, T, 0, false}, split.valid_targets), "validation data");
  const int64_t windows = std::max<int64_t>(1, std::min<int64_t>(valid.NumWindows() / B, 16));
  double vloss = 0;
  for (int64_t w = 0; w < windows; ++w) {
    auto [tok, tgt] = Must(feed->Slot(micro), "validation");
    valid.Next(tok, tgt);
    enqueue_forward("validation");
    Must(engine->Release(L + 1, *stream), "release");
    Must(engine->Release(0, *stream), "release");
    Must(feed->KeepLoss(0, 0, dloss), "copy");
    vloss += Must(feed->LossNow(0, 0), "validation");
  }
  vloss /= static_cast<double>(windows);
  (void)device->Free(dtok, *stream);
  (void)device->Free(dtgt, *stream);
  (void)device->Free(dloss, *stream);

  // ---- The trained weights (the compute copy, widened) and a sample.
  std::vector<std::vector<float>> weights(units);
  if (opt.sample_tokens > 0) {
    for (int u = 0; u < units; ++u) {
      weights[u].resize(model::UnitNumParams(mc, u));
      Must(engine->ReadState(u, StateKind::kComputeParams, weights[u].data()), "read weights");
    }
  }
  std::vector<std::vector<float>> masters;
  if (!opt.export_path.empty() || !opt.export_dir.empty()) {
    masters.resize(units);
    for (int u = 0; u < units; ++u) {
      masters[u].resize(model::UnitNumParams(mc, u));
      Must(engine->ReadState(u, StateKind::kMaster, masters[u].data()), "read master weights");
    }
  }
  if (!talk) return 0;

  // A sample: sampled (temperature 0.8) continuation of the start of the
  // validation text, by the CPU model on the trained weights.
  std::string sample = "(none: --sample-tokens 0)";
  if (opt.sample_tokens > 0) {
    std::vector<const void*> ptrs(units);
    for (int u = 0; u < units; ++u) ptrs[u] = weights[u].data();
    model::GptRunOptions one = ro;
    one.param_dtype = DType::kFloat32;
    one.batch_size = 1;
    one.loss_chunk_rows = std::numeric_limits<int64_t>::max();  // every row's probabilities: the sample reads row n - 1
    auto gen = Must(model::GptModel::Create(mc, one), "sampling model");
    std::vector<char> a(gen->activation_bytes() + 64);
    gen->BindActivations(reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(a.data()) + 63) & ~uintptr_t{63}));
    // Chat rows: the first validation example's prompt (up to its first
    // trained target); text: the first half window.
    int64_t prompt_len = T / 2;
    if (chat) {
      const auto first = std::find_if(split.valid_targets.begin(), split.valid_targets.end(), [](int32_t t) { return t >= 0; });
      if (first != split.valid_targets.end()) prompt_len = (first - split.valid_targets.begin()) + 1;
    }
    std::vector<int32_t> ctx(split.valid.begin(), split.valid.begin() + prompt_len), window(T), none(T, -1), out;
    std::mt19937_64 rng(opt.seed);
    for (int i = 0; i < opt.sample_tokens; ++i) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(ctx.size()), T);
      std::fill(window.begin(), window.end(), 0);
      std::copy(ctx.end() - n, ctx.end(), window.begin());
      Must(gen->Forward(window.data(), none.data(), ptrs), "sampling");
      const float* p = gen->probabilities() + (n - 1) * mc.vocab_size;
      std::vector<double> w(mc.vocab_size);
      for (int64_t v = 0; v < mc.vocab_size; ++v) w[v] = std::pow(std::max<double>(p[v], 0), 1 / 0.8);
      std::discrete_distribution<int32_t> pick(w.begin(), w.end());
      const int32_t next = pick(rng);
      ctx.push_back(next);
      out.push_back(next);
    }
    auto prompt = tokenizer->Decode(std::span<const int32_t>(split.valid.data(), prompt_len));
    auto text = tokenizer->Decode(out);
    sample = (prompt.ok() ? *prompt : "") + "|" + (text.ok() ? *text : "<undecodable>");
    for (char& c : sample) if (c == '\n') c = ' ';
  }
  if (!opt.export_path.empty()) {
    auto naming = data::ParseWeightNaming(opt.export_names);
    auto dtype = ParseDType(opt.export_dtype);
    if (!naming.ok() || !dtype.ok()) throw Usage{"--export-names zinf|hf and --export-dtype fp32|bf16|fp16"};
    Must(data::ExportGptWeights([&](int u) -> Result<std::span<const float>> { return std::span<const float>(masters[u]); },
                                mc, *naming, *dtype, opt.export_path),
         "export");
  }
  if (!opt.export_dir.empty()) {
    data::HfExportOptions eo;
    auto dtype = ParseDType(opt.export_dtype);
    if (!dtype.ok()) throw Usage{"--export-dtype fp32|bf16|fp16"};
    eo.dtype = *dtype;
    if (hf) eo.config_json = hf->config_json;
    eo.tokenizer_dir = tokenizer_files;
    Must(data::ExportHfCheckpoint([&](int u) -> Result<std::span<const float>> { return std::span<const float>(masters[u]); },
                                  mc, opt.export_dir, eo),
         "export " + opt.export_dir);
  }
  const double tokens = static_cast<double>((steps - first_step) * batch.train_batch_size * T);
  std::printf("summary: validation loss %.4f nats/token", vloss);
  if (embedded && tokenizer->VocabSize() == 256) {
    std::printf(" (corpus entropy rate %.4f; target <= %.4f: %s)", data::EmbeddedCorpus::EntropyRateNats(),
                data::EmbeddedCorpus::EntropyRateNats() + 0.3,
                vloss <= data::EmbeddedCorpus::EntropyRateNats() + 0.3 ? "met" : "NOT met");
  }
  std::printf("\n");
  if (steps <= first_step) {
    // Resumed from the run's last checkpoint (or past it): nothing was
    // trained, so there is no rate, traffic or memory peak to report.
    std::printf("  no steps left: resumed at step %lld of %lld\n", static_cast<long long>(first_step),
                static_cast<long long>(steps));
  } else {
    std::printf("  %s tokens in %.1f s: %s tokens/s; time in optimizer %.0f%%, collectives %.0f%%, copies %.0f%%, nvme waits %.0f%%, compute stalled %.0f%%\n",
                FormatCount(tokens).c_str(), train_s, FormatCount(tokens / train_s).c_str(), 100 * optimizer_s / train_s,
                100 * comm_s / train_s, 100 * copy_s / train_s, 100 * io_s / train_s, 100 * stall_s / train_s);
    std::printf("  bytes moved: nvme read %s, written %s; host<->device copies %s (per step %s, %s, %s)\n",
                FormatBytes(nvme_read).c_str(), FormatBytes(nvme_written).c_str(), FormatBytes(copied).c_str(),
                FormatBytes(nvme_read / std::max<int64_t>(1, steps - first_step)).c_str(),
                FormatBytes(nvme_written / std::max<int64_t>(1, steps - first_step)).c_str(),
                FormatBytes(copied / std::max<int64_t>(1, steps - first_step)).c_str());
    const StepStats st = Must(engine->Stats(), "stats");
    const DeviceMemoryStats dm = device->memory_stats();
    const bool host_device = device->kind() == DeviceKind::kHost;
    // The plan's step time against this run's: the median step after the
    // first (which also records the stage-3 trace and warms the tiers).
    std::vector<double> steady(step_secs.size() > 1 ? step_secs.begin() + 1 : step_secs.begin(), step_secs.end());
    std::nth_element(steady.begin(), steady.begin() + steady.size() / 2, steady.end());
    const double median_step = steady[steady.size() / 2];
    std::printf("  step time: median %.3g s over %zu steps, plan %.3g s at %s rates (plan/measured %.2f)\n",
                median_step, steady.size(), plan_row.step_s, rates_measured ? "measured" : "default",
                plan_row.step_s / median_step);
    std::printf("  memory: device peak %s, pinned host peak %s (plan %s and %s); peak RSS %s%s\n",
                FormatBytes(dm.peak_in_use_bytes).c_str(), FormatBytes(st.host_peak_pinned_bytes).c_str(),
                FormatBytes(plan_row.device_bytes).c_str(), FormatBytes(plan_row.host_bytes).c_str(),
                FormatBytes(PeakRssBytes()).c_str(),
                host_device ? (" (HostDevice's " + FormatBytes(dm.budget_bytes) + " of device memory included)").c_str()
                            : "");
  }
  std::printf("  sample: %s\n", sample.c_str());
  if (!opt.export_path.empty()) std::printf("  exported to %s\n", opt.export_path.c_str());
  if (!opt.export_dir.empty()) std::printf("  exported a Hugging Face folder to %s\n", opt.export_dir.c_str());
  if (!opt.timeline.empty() && recent.size() >= 2) {
    const std::vector<sched::StepTimeline> shown = sched::SummarizeTimeline(recent);
    const double from = shown.size() >= 2 ? shown[shown.size() - 2].start : 0;
    const double to = shown.empty() ? 0 : shown.back().end;
    Must(sched::WriteTimelineSvg(opt.timeline, recent,
                                 "zinf train: the last two steps (" + std::string(device->name()) + ")", from, to),
         "--timeline");
    std::printf("  timeline: %s\n", opt.timeline.c_str());
  }
  if (!opt.plot.empty()) {
    std::ofstream svg(opt.plot);
    svg << TrainSvg(losses, tps_hist);
    std::printf("  plot: %s\n", opt.plot.c_str());
  }
  return 0;
}

}  // namespace

model::GptConfig DefaultTrainModel(int64_t vocab_size) {
  model::GptConfig mc;
  mc.name = "custom";
  mc.num_layers = 2;
  mc.embed_dim = 64;
  mc.num_heads = 4;
  mc.max_seq_len = 64;
  mc.vocab_size = vocab_size;
  return mc;
}

void RegisterTrain(CLI::App& app, int* exit_code) {
  auto opt = std::make_shared<TrainOptions>();
  CLI::App* cmd = app.add_subcommand("train", "Fine-tune the GPT reference model through the engine (no arguments: the embedded default)");
  cmd->add_option("--config", opt->config, "DeepSpeed-style JSON config (flags override it)");
  cmd->add_option("--model", opt->model, "A preset: tiny, gpt2, gpt2-medium, ..., gpt-13b");
  cmd->add_option("--layers", opt->layers, "Transformer blocks");
  cmd->add_option("--d-model", opt->d_model, "Embedding width");
  cmd->add_option("--heads", opt->heads, "Attention heads");
  cmd->add_option("--seq-len", opt->seq_len, "Context length (default: the model's; with RoPE at most 4096)");
  cmd->add_option("--vocab", opt->vocab, "Vocabulary size (>= the tokenizer's)");
  cmd->add_option("--data", opt->data,
                  "UTF-8 text to train on, or conversations as .jsonl (default: the embedded corpus)");
  cmd->add_option("--chat-template", opt->chat_template,
                  "For .jsonl data: llama3, chatml, qwen3, mistral or auto (from the tokenizer's markers)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", opt->tokenizer,
                  "A tokenizer.json (or a folder with one), or a folder with GPT-2's encoder.json and vocab.bpe "
                  "(default: --model-dir's tokenizer.json, else bytes)");
  cmd->add_option("--init", opt->init, "Initial weights, .safetensors (Hugging Face GPT-2 or zinf names)");
  cmd->add_option("--steps", opt->steps, "Optimizer steps (default 300)");
  cmd->add_option("--micro-batch", opt->micro_batch, "Sequences per micro-step per rank");
  cmd->add_option("--grad-accum", opt->grad_accum, "Micro-steps per optimizer step");
  cmd->add_option("--lr", opt->lr, "Peak learning rate");
  cmd->add_option("--device", opt->device, "auto (CUDA device 0 if there is one, else cpu), cpu, cuda or cuda:N; default: the config's zinf.device, auto");
  cmd->add_option("--device-memory", opt->device_memory, "Device memory budget, e.g. 2G");
  cmd->add_option("--matmul", opt->matmul,
                  "Matrix products: fp32, or bf16 operands with fp32 sums (tensor cores on CUDA); default: the "
                  "config's zinf.matmul, fp32")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--attention", opt->attention,
                  "auto, plain (T x T probabilities kept for backward) or flash (one value per row); default: the "
                  "config's zinf.attention, auto: flash with bf16 products and heads of 64 or 128")
      ->check(CLI::IsMember({"auto", "plain", "flash"}));
  cmd->add_flag("--checkpointing", opt->checkpointing,
               "Activation checkpointing: keep each block's input only and run its forward again in its backward "
               "(same results, less activation memory)");
  cmd->add_option("--seed", opt->seed, "Initialisation, data order and sampling")->capture_default_str();
  cmd->add_option("--threads", opt->threads, "CPU threads per rank for kernels and the optimizer (0: cores / ranks)");
  cmd->add_option("--sample-tokens", opt->sample_tokens, "Tokens to sample after training (CPU model; 0: none)")
      ->capture_default_str();
  cmd->add_option("--export", opt->export_path, "Write the trained weights as .safetensors");
  cmd->add_option("--model-dir", opt->model_dir,
                  "A Hugging Face folder (config.json, safetensors, tokenizer.json) of the Llama family to train");
  cmd->add_option("--export-dir", opt->export_dir,
                  "Write the trained model as a Hugging Face folder (config.json, safetensors shards, tokenizer)");
  cmd->add_option("--export-names", opt->export_names, "zinf or hf")->capture_default_str();
  cmd->add_option("--export-dtype", opt->export_dtype, "fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--metrics-json", opt->metrics_json, "One JSON line per step with the engine's metrics");
  cmd->add_option("--plot", opt->plot, "SVG of loss and tokens/s over steps");
  cmd->add_option("--timeline", opt->timeline,
                  "SVG of the last two steps' timeline: compute, stalls, optimizer, disk, copies, collectives");
  cmd->add_option("--save-dir", opt->save_dir, "Checkpoint directory (step-N/ and a latest pointer)");
  cmd->add_option("--save-every", opt->save_every, "Save every N steps (and after the last)");
  cmd->add_option("--keep", opt->keep, "Checkpoints kept under --save-dir")->capture_default_str();
  AddPlanRateOptions(cmd, opt->rates);
  cmd->add_option("--resume", opt->resume, "A step-N directory, a checkpoint directory, or latest (in --save-dir)");
  cmd->callback([opt, exit_code] {
    try {
      *exit_code = Run(*opt);
    } catch (const Usage& u) {
      std::fprintf(stderr, "zinf train: %s\n", u.message.c_str());
      *exit_code = 2;
    } catch (const Failure& f) {
      std::fprintf(stderr, "zinf train: %s\n", f.message.c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace zinf::tools
