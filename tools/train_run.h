// One `zinf train` run: the state its phases build up, and the phases.
// tools/train.cc runs them in order: resolve the configuration, open the
// data, resolve the model, build (device, engine, the plan's check, the
// model and its registered weights), train, validate, then sample and
// export. Each phase returns a Status (tools/tool_status.h): bad input is
// one line and exit code 2, a failure while running exit code 1. A failure
// is told to every other rank where it happens (TrainRun::Fail), so none of
// them waits in a collective this rank will never join.
//
// One thread (the command's) uses a TrainRun.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/communicator.h"
#include "data/chat_data.h"
#include "data/hf_checkpoint.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "exec/gpt_device.h"
#include "model/gpt.h"
#include "model/gpt_config.h"
#include "sched/plan.h"
#include "tools/plan.h"
#include "tools/tool_status.h"
#include "tools/train_feed.h"
#include "zinf/config.h"
#include "zinf/device.h"
#include "zinf/engine.h"

namespace zinf::tools {

struct TrainOptions {
  std::string config;
  std::string model;  // a preset; empty: the flags below (or the default's shape)
  int64_t layers = 0, d_model = 0, heads = 0, seq_len = 0, vocab = 0;
  std::string data, tokenizer, init, export_path, export_names = "zinf", export_dtype = "bf16";
  std::string model_dir, export_dir;   // Hugging Face folders in and out
  std::string chat_template = "auto";  // for .jsonl data
  int64_t steps = 0, micro_batch = 0, grad_accum = 0;
  double lr = 0;
  std::string device;  // empty: the config's zinf.device (auto by default)
  std::string device_memory;
  std::string matmul;          // empty: the config's zinf.matmul (fp32 by default)
  std::string attention;       // empty: the config's zinf.attention (auto by default)
  bool checkpointing = false;  // activation checkpointing: each block's forward again in its backward
  uint64_t seed = 1;
  int threads = 0;
  int sample_tokens = 120;
  std::string metrics_json, plot, timeline;
  std::string save_dir, resume;
  int64_t save_every = 0, keep = 2;
  PlanRateFlags rates;  // measured rates for the plan's step time (zinf plan's flags)
};

// The embedded default's shape and schedule: small enough to finish in well
// under 90 s on two cores, large enough to learn the corpus's structure.
constexpr int64_t kDefaultSteps = 300, kDefaultMicroBatch = 8;
constexpr double kDefaultLr = 3e-3;
constexpr uint64_t kDefaultCorpusBytes = 2'000'000;

// A directory removed with its contents when the run ends, if `remove`.
struct ScratchDir {
  std::string path;
  bool remove = false;
  ScratchDir() = default;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir();
};

// What the training loop adds up over its steps, for the summary.
struct TrainTotals {
  std::vector<double> losses, tps, step_secs;
  std::vector<StepStats> recent;  // the last steps' metrics, for their timelines
  double optimizer_s = 0, comm_s = 0, copy_s = 0, io_s = 0, stall_s = 0, train_s = 0;
  uint64_t nvme_read = 0, nvme_written = 0, copied = 0;  // bytes moved per tier, all steps
};

// The training loop's state (tools/train_loop.cc).
struct TrainLoopState {
  std::optional<data::BatchLoader> loader;
  int64_t first_step = 0;                   // resumed at this step
  bool tty = false;                         // stderr is a terminal: one live progress line
  std::vector<int32_t> skip_tok, skip_tgt;  // the other ranks' windows, read past
  std::unique_ptr<TrainFeed> feed;
  int64_t micro = 0;  // micro-steps fed, validation included
  int32_t* dtok = nullptr;
  int32_t* dtgt = nullptr;
  float* dloss = nullptr;
  std::ofstream metrics;
  bool loss_now = false;  // each loss before its Step: a wait per micro-step
  // Micro-step k of step s had its loss poisoned (fault injection): [s % 2][k].
  std::vector<std::vector<char>> poisoned;
  std::chrono::steady_clock::time_point start, last_done;
  DeviceWaitStats waits_before;
  TrainTotals totals;
};

// Members are destroyed in reverse order: the loop's feed (which drains the
// stream) before the model and the engine, those before the device, and the
// optimizer's scratch directory after all of them.
struct TrainRun {
  explicit TrainRun(const TrainOptions& options) : opt(options) {}

  // A failure while running, "what: <cause>": told to every other rank
  // first (the engine does the same for its own calls; this covers the
  // model's and the loop's).
  Status Fail(const Status& cause, const std::string& what);
  // OK, or Fail(s, what).
  Status Check(const Status& s, const std::string& what);
  template <class T>
  Result<T> Check(Result<T> r, const std::string& what) {
    if (!r.ok()) return Fail(r.status(), what);
    return r;
  }
  // The ranks' closing agreement (tools/train.cc): OK once every rank got
  // here; a rank that stopped before is named with its cause.
  Status Finish();
  // Engine::Trace on the compute lane of the run's stream.
  Status Compute(const std::string& what, const std::function<Status()>& enqueue);

  const TrainOptions& opt;
  bool embedded = false;  // no --data: the embedded corpus
  bool defaults = false;  // no --config: the embedded default's configuration

  // ResolveConfig.
  Config config;
  ScratchDir tmp;  // the default's NVMe directory
  std::unique_ptr<Communicator> comm;
  int rank = 0, world = 1;
  bool talk = false;  // rank 0 prints
  int64_t steps = 0;
  BatchSizes batch;

  // OpenData and ResolveModel.
  std::string tokenizer_files;  // where an exported Hugging Face folder copies its tokenizer files from
  std::unique_ptr<data::Tokenizer> tokenizer;
  bool chat = false;  // conversations (.jsonl), packed into rows of T tokens
  std::unique_ptr<data::TokenDataset> dataset;
  model::GptConfig mc;
  std::optional<data::HfModel> hf;
  int64_t T = 0, B = 0;  // context and micro-batch
  std::unique_ptr<data::ChatDataset> chat_data;
  data::DataSplit split;
  int threads = 1;

  // Build.
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Engine> engine;
  DType matmul_dtype = DType::kFloat32;
  model::AttentionKernel attention = model::AttentionKernel::kAuto;
  bool rates_measured = false;  // any rate from a file, not the stated defaults
  sched::PlanRow plan_row;
  model::GptRunOptions ro;
  std::unique_ptr<exec::GptDevice> gpt;
  int units = 0;
  int64_t params = 0;

  // Train and Validate.
  TrainLoopState loop;
};

// The phases, in order; each stops the run with a non-OK Status.
Status ResolveConfig(TrainRun& run);  // tools/train_setup.cc
Status OpenData(TrainRun& run);
Status ResolveModel(TrainRun& run);
Status Build(TrainRun& run);
void PrintRunHeader(const TrainRun& run);
Status Train(TrainRun& run);             // tools/train_loop.cc
Result<double> Validate(TrainRun& run);  // the mean validation loss
// What the run ends with (tools/train_report.cc), on every rank: the
// compute copy for the sample, the fp32 master for the exports.
struct TrainedWeights {
  std::vector<std::vector<float>> compute, masters;
};
Result<TrainedWeights> ReadTrainedWeights(TrainRun& run);
// Rank 0 only: the sample, the exports and the summary.
Status Report(TrainRun& run, double validation_loss, const TrainedWeights& weights);

}  // namespace zinf::tools
