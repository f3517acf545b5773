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
// data; rank 0 prints. Run() is the list of phases (tools/train_run.h):
// train_setup.cc resolves and builds, train_loop.cc trains and validates,
// train_report.cc samples, exports and sums up.
#include "tools/train.h"

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "common/logging.h"
#include "tools/tool_status.h"
#include "tools/train_run.h"

namespace zinf::tools {

ScratchDir::~ScratchDir() {
  std::error_code ec;
  if (remove) std::filesystem::remove_all(path, ec);
}

Status TrainRun::Fail(const Status& cause, const std::string& what) {
  if (comm && comm->size() > 1) comm->Abort(cause.WithContext(what));
  return RunFailed(cause, what);
}

Status TrainRun::Check(const Status& s, const std::string& what) { return s.ok() ? Status::Ok() : Fail(s, what); }

// Every rank reaches this barrier after its last phase that the ranks share,
// and leaves only when all have: a rank that failed after the last
// collective (reading the trained weights, say) has told the others
// (Fail), and they stop with its cause instead of ending well. Rank 0's own
// report (the sample, the exports) comes after, on rank 0 alone: the others
// need not wait for it against the collectives' deadline.
Status TrainRun::Finish() {
  if (!comm || comm->size() <= 1) return Status::Ok();
  ZINF_RETURN_IF_ERROR(Check(comm->Barrier(*stream), "the closing barrier"));
  return Check(stream->Synchronize(), "the closing barrier");
}

Status TrainRun::Compute(const std::string& what, const std::function<Status()>& enqueue) {
  return engine->Trace(*stream, "compute", what, enqueue);
}

namespace {

Status Run(const TrainOptions& opt) {
  // The progress line is the display; the engine's per-step info lines go to
  // --metrics-json. ZINF_LOG_LEVEL (or --log-level debug) brings them back.
  if (!std::getenv("ZINF_LOG_LEVEL") && Log().level() == spdlog::level::info) SetLogLevel("warn");
  TrainRun run(opt);
  ZINF_RETURN_IF_ERROR(ResolveConfig(run));
  ZINF_RETURN_IF_ERROR(OpenData(run));
  ZINF_RETURN_IF_ERROR(ResolveModel(run));
  ZINF_RETURN_IF_ERROR(Build(run));
  PrintRunHeader(run);
  ZINF_RETURN_IF_ERROR(Train(run));
  ZINF_ASSIGN_OR_RETURN(const double validation_loss, Validate(run));
  ZINF_ASSIGN_OR_RETURN(const TrainedWeights weights, ReadTrainedWeights(run));
  ZINF_RETURN_IF_ERROR(run.Finish());
  if (!run.talk) return Status::Ok();
  return Report(run, validation_loss, weights);
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
  CLI::App* cmd = app.add_subcommand(
      "train", "Fine-tune the GPT reference model through the engine (no arguments: the embedded default)");
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
  cmd->add_option(
      "--device", opt->device,
      "auto (CUDA device 0 if there is one, else cpu), cpu, cuda or cuda:N; default: the config's zinf.device, auto");
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
  cmd->callback([opt, exit_code] { *exit_code = ReportToolStatus("train", Run(*opt)); });
}

}  // namespace zinf::tools
