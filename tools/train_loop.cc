// `zinf train`'s loop: resumed from a checkpoint when asked, every rank on
// its own windows of the data, each micro-step's forward and backward
// enqueued unit by unit through the engine, checkpoints every --save-every
// steps; then the validation passes. Step s is looked at once step s + 1 is
// enqueued (its losses and metrics wait only for step s, while the device
// has s + 1 queued): the loop never waits for the device in steady state.
// One thread (the command's).
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/fault_injection.h"
#include "common/units.h"
#include "sched/timeline.h"
#include "tools/train_run.h"

namespace zinf::tools {
namespace {

// --resume: the engine's state from the checkpoint, and the step and the
// loader's position from its client state.
Status Resume(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  const std::string from = opt.resume == "latest" ? opt.save_dir : opt.resume;
  if (from.empty()) return BadInput("--resume latest needs --save-dir");
  auto client = run.engine->Load(from);
  if (!client.ok()) return BadInput("--resume " + opt.resume + ": " + client.status().message());
  auto j = nlohmann::json::parse(*client, nullptr, false);
  // The client state comes from the checkpoint's manifest: check every
  // field's type before reading it (get<> would throw, and abort the run).
  auto loader_field = [&](const char* key) {
    return j.is_object() && j.contains("loader") && j["loader"].is_object() && j["loader"].contains(key) &&
           j["loader"][key].is_number_unsigned();
  };
  if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
      j["step"].get<int64_t>() < 0 || !loader_field("epoch") || !loader_field("window")) {
    return BadInput("--resume " + opt.resume + ": the checkpoint was not written by zinf train");
  }
  run.loop.first_step = j["step"].get<int64_t>();
  ZINF_RETURN_IF_ERROR(
      run.Check(run.loop.loader->Restore({j["loader"]["epoch"].get<uint64_t>(), j["loader"]["window"].get<uint64_t>()}),
                "resume"));
  if (run.talk)
    std::printf("  resumed from %s at step %lld\n", from.c_str(), static_cast<long long>(run.loop.first_step));
  return Status::Ok();
}

// The loader (resumed when asked), the feed, the device's batch and loss
// buffers and the metrics file.
Status PrepareLoop(TrainRun& run) {
  const TrainOptions& opt = run.opt;
  TrainLoopState& loop = run.loop;
  const int64_t B = run.B, T = run.T;
  ZINF_ASSIGN_OR_RETURN(
      loop.loader,
      run.Check(data::BatchLoader::Create(run.split.train, {B, T, opt.seed, true}, run.split.train_targets), "data"));
  loop.tty = isatty(2);
  if (!opt.resume.empty()) ZINF_RETURN_IF_ERROR(Resume(run));
  loop.skip_tok.resize(B * T);
  loop.skip_tgt.resize(B * T);
  ZINF_ASSIGN_OR_RETURN(
      loop.feed,
      run.Check(TrainFeed::Create(*run.device, *run.stream, B * T, run.batch.gradient_accumulation_steps), "set-up"));
  ZINF_ASSIGN_OR_RETURN(void* tok, run.Check(run.device->Allocate(B * T * 4, *run.stream), "tokens"));
  loop.dtok = static_cast<int32_t*>(tok);
  ZINF_ASSIGN_OR_RETURN(void* tgt, run.Check(run.device->Allocate(B * T * 4, *run.stream), "targets"));
  loop.dtgt = static_cast<int32_t*>(tgt);
  ZINF_ASSIGN_OR_RETURN(void* loss, run.Check(run.device->Allocate(4, *run.stream), "loss"));
  loop.dloss = static_cast<float*>(loss);
  if (run.talk && !opt.metrics_json.empty()) {
    loop.metrics.open(opt.metrics_json);
    if (!loop.metrics) return BadInput("--metrics-json: cannot write " + opt.metrics_json);
  }
  loop.loss_now = run.config.zinf.stop_on_nonfinite_loss;
  loop.poisoned.assign(2, std::vector<char>(run.batch.gradient_accumulation_steps));
  return Status::Ok();
}

// The device pointers of the units the head's backward needs.
struct HeadUnits {
  const void* emb = nullptr;  // the embedding (tied to the head)
  const void* fin = nullptr;  // the final norm
};

// Copies micro-step `micro`'s batch to the device and enqueues the forward,
// each block fetched and released in turn; the embedding and the final norm
// stay fetched for the head's backward.
Result<HeadUnits> EnqueueForward(TrainRun& run, const char* what) {
  TrainLoopState& loop = run.loop;
  Engine& engine = *run.engine;
  Stream& stream = *run.stream;
  exec::GptDevice& gpt = *run.gpt;
  const int L = static_cast<int>(run.mc.num_layers);
  ZINF_RETURN_IF_ERROR(run.Check(loop.feed->Feed(loop.micro++, loop.dtok, loop.dtgt), "copy"));
  HeadUnits head;
  ZINF_ASSIGN_OR_RETURN(const UnitPointers emb, run.Check(engine.Fetch(0, stream), "fetch"));
  head.emb = emb.data;
  ZINF_RETURN_IF_ERROR(
      run.Check(run.Compute("forward embedding", [&] { return gpt.EnqueueEmbedForward(loop.dtok, head.emb); }), what));
  for (int l = 0; l < L; ++l) {
    ZINF_ASSIGN_OR_RETURN(const UnitPointers block, run.Check(engine.Fetch(l + 1, stream), "fetch"));
    ZINF_RETURN_IF_ERROR(run.Check(
        run.Compute("forward block " + std::to_string(l), [&] { return gpt.EnqueueBlockForward(l, block.data); }),
        what));
    ZINF_RETURN_IF_ERROR(run.Check(engine.Release(l + 1, stream), "release"));
  }
  ZINF_ASSIGN_OR_RETURN(const UnitPointers fin, run.Check(engine.Fetch(L + 1, stream), "fetch"));
  head.fin = fin.data;
  ZINF_RETURN_IF_ERROR(run.Check(
      run.Compute("forward head", [&] { return gpt.EnqueueHeadForward(loop.dtgt, head.fin, head.emb, loop.dloss); }),
      what));
  return head;
}

// The backward of one micro-step: the head, the blocks in reverse, the
// embedding; each unit's gradients handed to the engine as they are ready.
Status EnqueueBackward(TrainRun& run, const HeadUnits& head) {
  Engine& engine = *run.engine;
  Stream& stream = *run.stream;
  exec::GptDevice& gpt = *run.gpt;
  const int L = static_cast<int>(run.mc.num_layers);
  ZINF_ASSIGN_OR_RETURN(const float scale, run.Check(engine.loss_scale(), "loss scale"));
  {
    ZINF_ASSIGN_OR_RETURN(const UnitPointers emb_grads, run.Check(engine.GradBuffers(0), "grads"));
    ZINF_ASSIGN_OR_RETURN(const UnitPointers head_grads, run.Check(engine.GradBuffers(L + 1), "grads"));
    ZINF_RETURN_IF_ERROR(run.Check(run.Compute("backward head",
                                               [&] {
                                                 return gpt.EnqueueHeadBackward(scale, head.fin, head.emb,
                                                                                head_grads.data, emb_grads.data);
                                               }),
                                   "backward"));
  }
  ZINF_RETURN_IF_ERROR(run.Check(engine.GradsReady(L + 1, stream), "grads ready"));
  ZINF_RETURN_IF_ERROR(run.Check(engine.Release(L + 1, stream), "release"));
  for (int l = L - 1; l >= 0; --l) {
    ZINF_ASSIGN_OR_RETURN(const UnitPointers grads, run.Check(engine.GradBuffers(l + 1), "grads"));
    ZINF_ASSIGN_OR_RETURN(const UnitPointers block, run.Check(engine.Fetch(l + 1, stream), "fetch"));
    ZINF_RETURN_IF_ERROR(run.Check(run.Compute("backward block " + std::to_string(l),
                                               [&] { return gpt.EnqueueBlockBackward(l, block.data, grads.data); }),
                                   "backward"));
    ZINF_RETURN_IF_ERROR(run.Check(engine.GradsReady(l + 1, stream), "grads ready"));
    ZINF_RETURN_IF_ERROR(run.Check(engine.Release(l + 1, stream), "release"));
  }
  {
    ZINF_ASSIGN_OR_RETURN(const UnitPointers emb_grads, run.Check(engine.GradBuffers(0), "grads"));
    ZINF_RETURN_IF_ERROR(run.Check(
        run.Compute("backward embedding", [&] { return gpt.EnqueueEmbedBackward(emb_grads.data); }), "backward"));
  }
  ZINF_RETURN_IF_ERROR(run.Check(engine.GradsReady(0, stream), "grads ready"));
  return run.Check(engine.Release(0, stream), "release");
}

// Micro-step k of step `step`: this rank's windows (the others' read past),
// forward, backward, the loss kept (and checked first when the config asks),
// and the engine's Step.
Status MicroStep(TrainRun& run, int64_t step, int64_t k) {
  TrainLoopState& loop = run.loop;
  const std::string step_name = "step " + std::to_string(step + 1);
  ZINF_ASSIGN_OR_RETURN(auto slot, run.Check(loop.feed->Slot(loop.micro), step_name));
  for (int r = 0; r < run.world; ++r) {  // every rank its own windows
    if (r == run.rank)
      loop.loader->Next(slot.first, slot.second);
    else
      loop.loader->Next(loop.skip_tok.data(), loop.skip_tgt.data());
  }
  ZINF_ASSIGN_OR_RETURN(const HeadUnits head, EnqueueForward(run, "forward"));
  ZINF_RETURN_IF_ERROR(EnqueueBackward(run, head));
  ZINF_RETURN_IF_ERROR(run.Check(loop.feed->KeepLoss(step, k, loop.dloss), "copy"));
  loop.poisoned[step % 2][k] = fault::At(fault::Site::kLoss) != 0;
  if (loop.loss_now) {  // the engine checks each loss before the update it would feed
    ZINF_ASSIGN_OR_RETURN(float loss, run.Check(loop.feed->LossNow(step, k), step_name));
    if (loop.poisoned[step % 2][k]) loss = std::numeric_limits<float>::quiet_NaN();
    ZINF_RETURN_IF_ERROR(run.Check(run.engine->ReportLoss(loss), step_name));
  }
  return run.Check(run.engine->Step(), "step").status();
}

// What one finished step measured.
struct StepReport {
  int64_t step = 0;  // counted from 0
  double loss = 0, tps = 0, secs = 0;
  uint64_t blocking = 0, draining = 0;  // host waits during the step
  StepStats stats;
  std::optional<sched::StepTimeline> timeline;
};

// The live progress line (stderr): each step on a terminal, else every
// tenth of the run and the last step.
void PrintProgress(const TrainRun& run, const StepReport& r, std::chrono::steady_clock::time_point now) {
  const TrainLoopState& loop = run.loop;
  const int64_t step = r.step, steps = run.steps;
  const bool tty = loop.tty;
  const double elapsed = std::chrono::duration<double>(now - loop.start).count();
  const double eta = elapsed / (step + 1 - loop.first_step) * (steps - step - 1);
  if (!(tty || (step + 1) % std::max<int64_t>(1, steps / 10) == 0 || step + 1 == steps)) return;
  // The timeline's shares when the step has one; else the engine's seconds
  // over the host's step time.
  const StepStats& st = r.stats;
  char busy[512];
  if (r.timeline) {
    std::snprintf(busy, sizeof busy, "%s", sched::FormatStepTimeline(*r.timeline).c_str());
  } else {
    std::snprintf(busy, sizeof busy, "optimizer %.0f%% | stall %.0f%%", 100 * st.optimizer_seconds / r.secs,
                  100 * st.stall_seconds / r.secs);
  }
  std::fprintf(stderr,
               "%sstep %lld/%lld  loss %.4f  %s tokens/s  step %.0f ms  ETA %.0f s | %s | nvme %.2f GB/s  "
               "copies %.2f GB/s%s",
               tty ? "\r" : "", static_cast<long long>(step + 1), static_cast<long long>(steps), r.loss,
               FormatCount(r.tps).c_str(), r.secs * 1e3, eta, busy,
               static_cast<double>(st.nvme_bytes_read + st.nvme_bytes_written) / r.secs / 1e9,
               static_cast<double>(st.copy_bytes) / r.secs / 1e9, tty ? "   " : "\n");
  if (tty && step + 1 == steps) std::fprintf(stderr, "\n");
}

// One --metrics-json line.
void WriteMetrics(TrainLoopState& loop, const StepReport& r) {
  const StepStats& st = r.stats;
  nlohmann::json j = {{"step", r.step + 1},
                      {"loss", r.loss},
                      {"tokens_per_s", r.tps},
                      {"step_seconds", r.secs},
                      {"lr", st.lr},
                      {"grad_norm", st.grad_norm},
                      {"clip_coef", st.clip_coef},
                      {"skipped", st.skipped},
                      {"loss_scale", st.loss_scale},
                      {"optimizer_seconds", st.optimizer_seconds},
                      {"comm_seconds", st.comm_seconds},
                      {"copy_seconds", st.copy_seconds},
                      {"io_seconds", st.io_seconds},
                      {"stall_seconds", st.stall_seconds},
                      {"nvme_bytes_read", st.nvme_bytes_read},
                      {"nvme_bytes_written", st.nvme_bytes_written},
                      {"copy_bytes", st.copy_bytes},
                      {"device_bytes_in_use", st.device_bytes_in_use},
                      {"host_pinned_bytes", st.host_pinned_bytes},
                      {"host_waits", r.blocking},
                      {"host_waits_draining", r.draining}};
  if (r.timeline) {
    const sched::StepTimeline& tl = *r.timeline;
    std::map<std::string, double> share;
    for (const auto& [lane, seconds] : tl.busy) share[lane] = tl.share(lane);
    j["timeline"] = {{"period_seconds", tl.seconds()}, {"busy_share", share}, {"stall_seconds_by_cause", tl.stalls}};
  }
  loop.metrics << j.dump() << "\n";
}

// Step `step`'s losses, metrics and timeline (once step + 1 is enqueued, or
// after the last): added to the totals; rank 0 prints and writes them.
Status FinishStep(TrainRun& run, int64_t step) {
  TrainLoopState& loop = run.loop;
  TrainTotals& totals = loop.totals;
  StepReport r;
  r.step = step;
  ZINF_ASSIGN_OR_RETURN(const std::vector<float> micro_losses,
                        run.Check(loop.feed->Losses(step), "step " + std::to_string(step + 1)));
  double loss_sum = 0;
  for (size_t k = 0; k < micro_losses.size(); ++k) {
    loss_sum += loop.poisoned[step % 2][k] ? std::numeric_limits<double>::quiet_NaN() : micro_losses[k];
  }
  // Boundaries count steps from the start of training, checkpoints included.
  ZINF_ASSIGN_OR_RETURN(r.stats, run.Check(run.engine->Stats(step + 1), "stats"));
  const StepStats& st = r.stats;
  // The step's timeline, with the step before it (whose updates run during
  // this one's forward).
  totals.recent.push_back(st);
  if (totals.recent.size() > 3) totals.recent.erase(totals.recent.begin());
  for (sched::StepTimeline& t : sched::SummarizeTimeline(totals.recent)) {
    if (t.boundary == st.boundary) r.timeline = std::move(t);
  }
  const auto now = std::chrono::steady_clock::now();
  r.secs = std::chrono::duration<double>(now - loop.last_done).count();
  loop.last_done = now;
  const DeviceWaitStats w = run.device->wait_stats();
  r.blocking = w.blocking - loop.waits_before.blocking;
  r.draining = w.draining - loop.waits_before.draining;
  loop.waits_before = w;
  r.loss = loss_sum / run.batch.gradient_accumulation_steps;
  r.tps = static_cast<double>(run.batch.train_batch_size * run.T) / r.secs;
  totals.train_s += r.secs;
  totals.step_secs.push_back(r.secs);
  totals.losses.push_back(r.loss);
  totals.tps.push_back(r.tps);
  totals.optimizer_s += st.optimizer_seconds;
  totals.comm_s += st.comm_seconds;
  totals.copy_s += st.copy_seconds;
  totals.io_s += st.io_seconds;
  totals.stall_s += st.stall_seconds;
  totals.nvme_read += st.nvme_bytes_read;
  totals.nvme_written += st.nvme_bytes_written;
  totals.copied += st.copy_bytes;
  if (!run.talk) return Status::Ok();
  PrintProgress(run, r, now);
  if (loop.metrics.is_open()) WriteMetrics(loop, r);
  return Status::Ok();
}

// Saves step-N under --save-dir and keeps the newest --keep of them.
Status Save(TrainRun& run, int64_t done) {
  const TrainOptions& opt = run.opt;
  const model::GptConfig& mc = run.mc;
  const data::LoaderPosition at = run.loop.loader->Position();
  nlohmann::json client = {{"step", done},
                           {"loader", {{"epoch", at.epoch}, {"window", at.window}}},
                           {"model",
                            {{"name", mc.name},
                             {"vocab_size", mc.vocab_size},
                             {"max_seq_len", mc.max_seq_len},
                             {"embed_dim", mc.embed_dim},
                             {"num_layers", mc.num_layers},
                             {"num_heads", mc.num_heads}}}};
  // The Llama family's whole shape, for `zinf export --hf-dir`.
  if (!mc.IsGpt2Family()) {
    client["hf_config"] = run.hf ? run.hf->config_json : data::HfConfigJson(mc);
    client["tokenizer_dir"] = run.tokenizer_files;
  }
  ZINF_ASSIGN_OR_RETURN(const std::string path, run.Check(run.engine->Save(opt.save_dir, client.dump()), "save"));
  if (!run.talk) return Status::Ok();
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
  if (!run.loop.tty) std::fprintf(stderr, "saved %s\n", path.c_str());
  return Status::Ok();
}

// A checkpoint waits for the device: its time and waits are not the next
// step's.
Status SaveUntimed(TrainRun& run, int64_t done) {
  TrainLoopState& loop = run.loop;
  const auto t = std::chrono::steady_clock::now();
  const DeviceWaitStats w = run.device->wait_stats();
  ZINF_RETURN_IF_ERROR(Save(run, done));
  loop.last_done += std::chrono::steady_clock::now() - t;
  loop.waits_before.blocking += run.device->wait_stats().blocking - w.blocking;
  loop.waits_before.draining += run.device->wait_stats().draining - w.draining;
  return Status::Ok();
}

}  // namespace

Status Train(TrainRun& run) {
  ZINF_RETURN_IF_ERROR(PrepareLoop(run));
  TrainLoopState& loop = run.loop;
  const TrainOptions& opt = run.opt;
  const int64_t steps = run.steps;
  loop.start = std::chrono::steady_clock::now();
  loop.last_done = loop.start;
  loop.waits_before = run.device->wait_stats();
  for (int64_t step = loop.first_step; step < steps; ++step) {
    for (int64_t k = 0; k < run.batch.gradient_accumulation_steps; ++k) ZINF_RETURN_IF_ERROR(MicroStep(run, step, k));
    ZINF_RETURN_IF_ERROR(run.Check(loop.feed->EndStep(step), "step " + std::to_string(step + 1)));
    if (step > loop.first_step) ZINF_RETURN_IF_ERROR(FinishStep(run, step - 1));
    if (!opt.save_dir.empty() && opt.save_every > 0 && ((step + 1) % opt.save_every == 0 || step + 1 == steps)) {
      ZINF_RETURN_IF_ERROR(SaveUntimed(run, step + 1));
    }
  }
  ZINF_RETURN_IF_ERROR(run.Check(run.engine->Synchronize(), "synchronize"));
  if (steps > loop.first_step) ZINF_RETURN_IF_ERROR(FinishStep(run, steps - 1));
  return Status::Ok();
}

// Forward passes through the engine on the device (every rank runs them: a
// stage-3 Fetch is collective); the mean over up to 16 windows of the
// validation split.
Result<double> Validate(TrainRun& run) {
  TrainLoopState& loop = run.loop;
  Engine& engine = *run.engine;
  Stream& stream = *run.stream;
  const int64_t B = run.B, T = run.T;
  const int L = static_cast<int>(run.mc.num_layers);
  ZINF_ASSIGN_OR_RETURN(data::BatchLoader valid,
                        run.Check(data::BatchLoader::Create(run.split.valid, {B, T, 0, false}, run.split.valid_targets),
                                  "validation data"));
  const int64_t windows = std::max<int64_t>(1, std::min<int64_t>(valid.NumWindows() / B, 16));
  double vloss = 0;
  for (int64_t w = 0; w < windows; ++w) {
    ZINF_ASSIGN_OR_RETURN(auto slot, run.Check(loop.feed->Slot(loop.micro), "validation"));
    valid.Next(slot.first, slot.second);
    ZINF_RETURN_IF_ERROR(EnqueueForward(run, "validation").status());
    ZINF_RETURN_IF_ERROR(run.Check(engine.Release(L + 1, stream), "release"));
    ZINF_RETURN_IF_ERROR(run.Check(engine.Release(0, stream), "release"));
    ZINF_RETURN_IF_ERROR(run.Check(loop.feed->KeepLoss(0, 0, loop.dloss), "copy"));
    ZINF_ASSIGN_OR_RETURN(const float loss, run.Check(loop.feed->LossNow(0, 0), "validation"));
    vloss += loss;
  }
  vloss /= static_cast<double>(windows);
  (void)run.device->Free(loop.dtok, stream);
  (void)run.device->Free(loop.dtgt, stream);
  (void)run.device->Free(loop.dloss, stream);
  return vloss;
}

}  // namespace zinf::tools
