// How a `zinf train` run ends: the trained weights read back on every rank
// (the compute copy, widened, for the sample; the fp32 master for the
// exports), then on rank 0 a sampled continuation by the CPU model, the
// exports (.safetensors, a Hugging Face folder), the summary, the timeline
// and the plot. One thread (the command's).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/runtime_info.h"
#include "common/units.h"
#include "data/embedded_corpus.h"
#include "data/gpt_weights.h"
#include "sched/timeline.h"
#include "tools/train_plot.h"
#include "tools/train_run.h"

namespace zinf::tools {
namespace {

// A sampled (temperature 0.8) continuation of the start of the validation
// text, by the CPU model on the trained weights; newlines shown as spaces.
Result<std::string> Sample(TrainRun& run, const std::vector<std::vector<float>>& weights) {
  const model::GptConfig& mc = run.mc;
  const int64_t T = run.T;
  const data::DataSplit& split = run.split;
  std::vector<const void*> ptrs(run.units);
  for (int u = 0; u < run.units; ++u) ptrs[u] = weights[u].data();
  model::GptRunOptions one = run.ro;
  one.param_dtype = DType::kFloat32;
  one.batch_size = 1;
  one.loss_chunk_rows = std::numeric_limits<int64_t>::max();  // every row's probabilities: the sample reads row n - 1
  ZINF_ASSIGN_OR_RETURN(auto gen, run.Check(model::GptModel::Create(mc, one), "sampling model"));
  std::vector<char> a(gen->activation_bytes() + 64);
  gen->BindActivations(reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(a.data()) + 63) & ~uintptr_t{63}));
  // Chat rows: the first validation example's prompt (up to its first
  // trained target); text: the first half window.
  int64_t prompt_len = T / 2;
  if (run.chat) {
    const auto first =
        std::find_if(split.valid_targets.begin(), split.valid_targets.end(), [](int32_t t) { return t >= 0; });
    if (first != split.valid_targets.end()) prompt_len = (first - split.valid_targets.begin()) + 1;
  }
  std::vector<int32_t> ctx(split.valid.begin(), split.valid.begin() + prompt_len), window(T), none(T, -1), out;
  std::mt19937_64 rng(run.opt.seed);
  for (int i = 0; i < run.opt.sample_tokens; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(ctx.size()), T);
    std::fill(window.begin(), window.end(), 0);
    std::copy(ctx.end() - n, ctx.end(), window.begin());
    ZINF_RETURN_IF_ERROR(run.Check(gen->Forward(window.data(), none.data(), ptrs), "sampling").status());
    const float* p = gen->probabilities() + (n - 1) * mc.vocab_size;
    std::vector<double> w(mc.vocab_size);
    for (int64_t v = 0; v < mc.vocab_size; ++v) w[v] = std::pow(std::max<double>(p[v], 0), 1 / 0.8);
    std::discrete_distribution<int32_t> pick(w.begin(), w.end());
    const int32_t next = pick(rng);
    ctx.push_back(next);
    out.push_back(next);
  }
  auto prompt = run.tokenizer->Decode(std::span<const int32_t>(split.valid.data(), prompt_len));
  auto text = run.tokenizer->Decode(out);
  std::string sample = (prompt.ok() ? *prompt : "") + "|" + (text.ok() ? *text : "<undecodable>");
  for (char& c : sample)
    if (c == '\n') c = ' ';
  return sample;
}

// --export (.safetensors) and --export-dir (a Hugging Face folder), from
// the fp32 master weights.
Status Export(TrainRun& run, const std::vector<std::vector<float>>& masters) {
  const TrainOptions& opt = run.opt;
  auto master = [&](int u) -> Result<std::span<const float>> { return std::span<const float>(masters[u]); };
  if (!opt.export_path.empty()) {
    auto naming = data::ParseWeightNaming(opt.export_names);
    auto dtype = ParseDType(opt.export_dtype);
    if (!naming.ok() || !dtype.ok()) return BadInput("--export-names zinf|hf and --export-dtype fp32|bf16|fp16");
    ZINF_RETURN_IF_ERROR(run.Check(data::ExportGptWeights(master, run.mc, *naming, *dtype, opt.export_path), "export"));
  }
  if (!opt.export_dir.empty()) {
    data::HfExportOptions eo;
    auto dtype = ParseDType(opt.export_dtype);
    if (!dtype.ok()) return BadInput("--export-dtype fp32|bf16|fp16");
    eo.dtype = *dtype;
    if (run.hf) eo.config_json = run.hf->config_json;
    eo.tokenizer_dir = run.tokenizer_files;
    ZINF_RETURN_IF_ERROR(
        run.Check(data::ExportHfCheckpoint(master, run.mc, opt.export_dir, eo), "export " + opt.export_dir));
  }
  return Status::Ok();
}

// Where the time and the bytes went, the step time against the plan's, and
// the memory peaks against the plan's.
Status PrintTrainedSummary(TrainRun& run) {
  const TrainTotals& t = run.loop.totals;
  const int64_t trained = run.steps - run.loop.first_step;
  const double tokens = static_cast<double>(trained * run.batch.train_batch_size * run.T);
  std::printf(
      "  %s tokens in %.1f s: %s tokens/s; time in optimizer %.0f%%, collectives %.0f%%, copies %.0f%%, nvme waits "
      "%.0f%%, compute stalled %.0f%%\n",
      FormatCount(tokens).c_str(), t.train_s, FormatCount(tokens / t.train_s).c_str(), 100 * t.optimizer_s / t.train_s,
      100 * t.comm_s / t.train_s, 100 * t.copy_s / t.train_s, 100 * t.io_s / t.train_s, 100 * t.stall_s / t.train_s);
  std::printf("  bytes moved: nvme read %s, written %s; host<->device copies %s (per step %s, %s, %s)\n",
              FormatBytes(t.nvme_read).c_str(), FormatBytes(t.nvme_written).c_str(), FormatBytes(t.copied).c_str(),
              FormatBytes(t.nvme_read / std::max<int64_t>(1, trained)).c_str(),
              FormatBytes(t.nvme_written / std::max<int64_t>(1, trained)).c_str(),
              FormatBytes(t.copied / std::max<int64_t>(1, trained)).c_str());
  ZINF_ASSIGN_OR_RETURN(const StepStats st, run.Check(run.engine->Stats(), "stats"));
  const DeviceMemoryStats dm = run.device->memory_stats();
  const bool host_device = run.device->kind() == DeviceKind::kHost;
  const sched::PlanRow& plan = run.plan_row;
  // The plan's step time against this run's: the median step after the
  // first (which also records the stage-3 trace and warms the tiers).
  std::vector<double> steady(t.step_secs.size() > 1 ? t.step_secs.begin() + 1 : t.step_secs.begin(), t.step_secs.end());
  std::nth_element(steady.begin(), steady.begin() + steady.size() / 2, steady.end());
  const double median_step = steady[steady.size() / 2];
  std::printf("  step time: median %.3g s over %zu steps, plan %.3g s at %s rates (plan/measured %.2f)\n", median_step,
              steady.size(), plan.step_s, run.rates_measured ? "measured" : "default", plan.step_s / median_step);
  std::printf(
      "  memory: device peak %s, pinned host peak %s (plan %s and %s); peak RSS %s%s\n",
      FormatBytes(dm.peak_in_use_bytes).c_str(), FormatBytes(st.host_peak_pinned_bytes).c_str(),
      FormatBytes(plan.device_bytes).c_str(), FormatBytes(plan.host_bytes).c_str(), FormatBytes(PeakRssBytes()).c_str(),
      host_device ? (" (HostDevice's " + FormatBytes(dm.budget_bytes) + " of device memory included)").c_str() : "");
  return Status::Ok();
}

// The summary, then what was written: exports, the timeline, the plot.
Status PrintSummary(TrainRun& run, double vloss, const std::string& sample) {
  const TrainOptions& opt = run.opt;
  std::printf("summary: validation loss %.4f nats/token", vloss);
  if (run.embedded && run.tokenizer->VocabSize() == 256) {
    std::printf(" (corpus entropy rate %.4f; target <= %.4f: %s)", data::EmbeddedCorpus::EntropyRateNats(),
                data::EmbeddedCorpus::EntropyRateNats() + 0.3,
                vloss <= data::EmbeddedCorpus::EntropyRateNats() + 0.3 ? "met" : "NOT met");
  }
  std::printf("\n");
  if (run.steps <= run.loop.first_step) {
    // Resumed from the run's last checkpoint (or past it): nothing was
    // trained, so there is no rate, traffic or memory peak to report.
    std::printf("  no steps left: resumed at step %lld of %lld\n", static_cast<long long>(run.loop.first_step),
                static_cast<long long>(run.steps));
  } else {
    ZINF_RETURN_IF_ERROR(PrintTrainedSummary(run));
  }
  std::printf("  sample: %s\n", sample.c_str());
  if (!opt.export_path.empty()) std::printf("  exported to %s\n", opt.export_path.c_str());
  if (!opt.export_dir.empty()) std::printf("  exported a Hugging Face folder to %s\n", opt.export_dir.c_str());
  const std::vector<StepStats>& recent = run.loop.totals.recent;
  if (!opt.timeline.empty() && recent.size() >= 2) {
    const std::vector<sched::StepTimeline> shown = sched::SummarizeTimeline(recent);
    const double from = shown.size() >= 2 ? shown[shown.size() - 2].start : 0;
    const double to = shown.empty() ? 0 : shown.back().end;
    ZINF_RETURN_IF_ERROR(run.Check(
        sched::WriteTimelineSvg(opt.timeline, recent,
                                "zinf train: the last two steps (" + std::string(run.device->name()) + ")", from, to),
        "--timeline"));
    std::printf("  timeline: %s\n", opt.timeline.c_str());
  }
  if (!opt.plot.empty()) {
    std::ofstream svg(opt.plot);
    svg << TrainSvg(run.loop.totals.losses, run.loop.totals.tps);
    std::printf("  plot: %s\n", opt.plot.c_str());
  }
  return Status::Ok();
}

}  // namespace

Result<TrainedWeights> ReadTrainedWeights(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  TrainedWeights w;
  w.compute.resize(run.units);
  if (opt.sample_tokens > 0) {
    for (int u = 0; u < run.units; ++u) {
      w.compute[u].resize(model::UnitNumParams(run.mc, u));
      ZINF_RETURN_IF_ERROR(
          run.Check(run.engine->ReadState(u, StateKind::kComputeParams, w.compute[u].data()), "read weights"));
    }
  }
  if (!opt.export_path.empty() || !opt.export_dir.empty()) {
    w.masters.resize(run.units);
    for (int u = 0; u < run.units; ++u) {
      w.masters[u].resize(model::UnitNumParams(run.mc, u));
      ZINF_RETURN_IF_ERROR(
          run.Check(run.engine->ReadState(u, StateKind::kMaster, w.masters[u].data()), "read master weights"));
    }
  }
  return w;
}

Status Report(TrainRun& run, double validation_loss, const TrainedWeights& weights) {
  std::string sample = "(none: --sample-tokens 0)";
  if (run.opt.sample_tokens > 0) {
    ZINF_ASSIGN_OR_RETURN(sample, Sample(run, weights.compute));
  }
  ZINF_RETURN_IF_ERROR(Export(run, weights.masters));
  return PrintSummary(run, validation_loss, sample);
}

}  // namespace zinf::tools
