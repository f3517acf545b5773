// `zinf train` run as a user would: a short run on the embedded corpus learns
// and writes its metrics, plot and export; bad input is one line and exit
// code 2 with nothing written.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dataset/data_test_util.h"
#include "test_util.h"

namespace {

// Runs `zinf args` in `dir` (default: the test directory).
zinf::test::CommandResult RunZinf(const std::string& args, const std::string& dir = zinf::test::TestDir()) {
  return zinf::test::RunCommand("cd " + dir + " && ZINF_LOG_LEVEL=warn " + zinf::test::BinaryDir() + "/zinf " + args +
                                " 2>&1");
}

std::string Scratch(const std::string& name) { return zinf::test::TestDir() + "/" + name; }

// Each step's loss and draining host waits from a --metrics-json file.
std::pair<std::vector<double>, std::vector<uint64_t>> ReadLossesAndDrainingWaits(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<double> loss;
  std::vector<uint64_t> draining;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    loss.push_back(j.at("loss").get<double>());
    draining.push_back(j.at("host_waits_draining").get<uint64_t>());
  }
  return {loss, draining};
}

TEST(TrainTest, ShortEmbeddedRunLearnsAndWritesItsFiles) {
  const std::string metrics = Scratch("train_metrics.jsonl"), plot = Scratch("train_plot.svg"),
                    weights = Scratch("train_export.safetensors"), timeline = Scratch("train_timeline.svg");
  for (const auto& f : {metrics, plot, weights, timeline}) std::filesystem::remove(f);
  // In a directory of its own: other tests' runs make their own state directories.
  const std::string cwd = Scratch("train_short_cwd");
  std::filesystem::remove_all(cwd);
  std::filesystem::create_directories(cwd);
  auto r = RunZinf("train --steps 40 --layers 1 --d-model 32 --seq-len 32 --micro-batch 4 --metrics-json " + metrics +
                       " --plot " + plot + " --export " + weights + " --export-names hf --timeline " + timeline,
                   cwd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("config: ZeRO stage 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("plan per rank"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("summary: validation loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sample: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step time: median"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("at default rates (plan/measured"), std::string::npos) << r.output;
  // The optimizer state went to a directory under the working directory, removed afterwards.
  for (const auto& e : std::filesystem::directory_iterator(cwd)) {
    EXPECT_EQ(e.path().filename().string().rfind("zinf-train-", 0), std::string::npos) << e.path();
  }
  const auto [loss, draining] = ReadLossesAndDrainingWaits(metrics);
  ASSERT_EQ(loss.size(), 40u);
  // The loop never lets the device run dry: no host wait leaves it idle
  // between the first step (set-up) and the last (the run's final
  // synchronize).
  for (size_t i = 1; i + 1 < draining.size(); ++i) EXPECT_EQ(draining[i], 0u) << "step " << i + 1;
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += loss[i], last += loss[loss.size() - 1 - i];
  EXPECT_LT(last, 0.8 * first) << "the loss did not fall";
  std::ifstream svg(plot);
  std::stringstream svg_text;
  svg_text << svg.rdbuf();
  EXPECT_NE(svg_text.str().find("<polyline"), std::string::npos);
  EXPECT_GT(std::filesystem::file_size(weights), 1000u);

  // The per-step timeline: in the progress lines, in the metrics, and the
  // last two steps as a picture. The default keeps the optimizer on NVMe,
  // so the disk is busy in every step.
  EXPECT_NE(r.output.find("step 40/40"), std::string::npos) << r.output;
  const size_t last_line = r.output.find("step 40/40");
  for (const char* lane : {"| compute ", "| optimizer ", "| disk ", "| copy ", "| stalled "}) {
    EXPECT_NE(r.output.find(lane, last_line), std::string::npos) << lane << "\n" << r.output;
  }
  std::ifstream metrics_in(metrics);
  std::string line;
  int with_timeline = 0;
  while (std::getline(metrics_in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("timeline")) continue;
    ++with_timeline;
    const auto& share = j.at("timeline").at("busy_share");
    EXPECT_GT(share.at("compute").get<double>(), 0.0) << line;
    EXPECT_LE(share.at("compute").get<double>(), 1.0 + 1e-9) << line;
    EXPECT_GT(j.at("timeline").at("period_seconds").get<double>(), 0.0) << line;
  }
  EXPECT_EQ(with_timeline, 40);
  std::ifstream tl(timeline);
  std::stringstream tl_text;
  tl_text << tl.rdbuf();
  for (const char* row : {">compute<", ">optimizer<", ">disk<", "<rect x="}) {
    EXPECT_NE(tl_text.str().find(row), std::string::npos) << row;
  }

  // The export loads back (Hugging Face names) as the initial weights.
  r = RunZinf("train --steps 1 --layers 1 --d-model 32 --seq-len 32 --micro-batch 4 --sample-tokens 0 --init " +
              weights);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sample: (none: --sample-tokens 0)"), std::string::npos) << r.output;
}

// --checkpointing: every block's forward runs again in its backward, so the
// losses are the same bit for bit and the plan's activations shrink (one
// block's saved tensors instead of every block's).
TEST(TrainTest, CheckpointingGivesTheSameLossesInLessActivationMemory) {
  auto run = [](const std::string& name, const std::string& flags) {
    const std::string metrics = Scratch(name);
    std::filesystem::remove(metrics);
    auto r = RunZinf(
        "train --steps 4 --layers 3 --d-model 32 --seq-len 32 --micro-batch 4 --sample-tokens 0 "
        "--metrics-json " +
        metrics + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(metrics);
    std::string line;
    std::vector<double> loss;
    while (std::getline(in, line)) loss.push_back(nlohmann::json::parse(line).at("loss").get<double>());
    const size_t at = r.output.find("; activations ");
    EXPECT_NE(at, std::string::npos) << r.output;
    double amount = 0;
    char unit[8] = {};
    EXPECT_EQ(std::sscanf(r.output.c_str() + at, "; activations %lf %7[A-Za-z]", &amount, unit), 2) << r.output;
    const double scale = std::string(unit) == "KiB" ? 1024.0 : std::string(unit) == "MiB" ? 1048576.0 : 1.0;
    return std::make_pair(loss, amount * scale);
  };
  const auto [plain_loss, plain_bytes] = run("train_no_checkpointing.jsonl", "");
  const auto [ckpt_loss, ckpt_bytes] = run("train_checkpointing.jsonl", "--checkpointing");
  ASSERT_EQ(plain_loss.size(), 4u);
  EXPECT_EQ(ckpt_loss, plain_loss);
  EXPECT_LT(ckpt_bytes, 0.8 * plain_bytes) << ckpt_bytes << " vs " << plain_bytes;
}

// With the host device running the tasks of all streams one at a time
// (ZINF_SERIALIZE_TASKS=1, as CUDA may run host functions), zinf train's
// default schedule (stage 3, parameters in host memory, optimizer on NVMe)
// neither hangs nor lets the device run dry between steps, and it trains to
// the same losses bit for bit.
TEST(TrainTest, SerializedTasksNeitherHangNorStallNorChangeTheLosses) {
  auto run = [](const std::string& name, const std::string& env) {
    const std::string metrics = Scratch(name);
    std::filesystem::remove(metrics);
    auto r = zinf::test::RunCommand("cd " + zinf::test::TestDir() + " && ZINF_LOG_LEVEL=warn " + env + " " +
                                    zinf::test::BinaryDir() +
                                    "/zinf train --steps 6 --layers 2 --d-model 32 --seq-len 32 --micro-batch 4 "
                                    "--sample-tokens 0 --metrics-json " +
                                    metrics + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return ReadLossesAndDrainingWaits(metrics);
  };
  const auto [plain_loss, plain_draining] = run("train_tasks_concurrent.jsonl", "");
  const auto [serial_loss, serial_draining] = run("train_tasks_serialized.jsonl", "ZINF_SERIALIZE_TASKS=1");
  ASSERT_EQ(plain_loss.size(), 6u);
  EXPECT_EQ(serial_loss, plain_loss);
  ASSERT_EQ(serial_draining.size(), 6u);
  for (size_t i = 1; i + 1 < serial_draining.size(); ++i) EXPECT_EQ(serial_draining[i], 0u) << "step " << i + 1;
}

// A rate file reaches the plan's step time: at an Adam rate of 1000
// parameters per second the optimizer alone takes minutes.
TEST(TrainTest, MeasuredRatesDriveThePlansStepTime) {
  const std::string adam = Scratch("train_slow_adam.json");
  std::ofstream(adam) << R"({"bench": "adam", "bytes_per_param": 28, "rows": [{"threads": 2, "params_per_s": 1000}]})";
  auto r = RunZinf(
      "train --steps 2 --layers 1 --d-model 32 --seq-len 32 --micro-batch 4 --sample-tokens 0 --adam-json " + adam);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.find("step time: median");
  ASSERT_NE(at, std::string::npos) << r.output;
  double median = 0, plan = 0;
  size_t steps = 0;
  ASSERT_EQ(std::sscanf(r.output.c_str() + at, "step time: median %lf s over %zu steps, plan %lf s at measured rates",
                        &median, &steps, &plan),
            3)
      << r.output.substr(at);
  EXPECT_EQ(steps, 1u);
  EXPECT_GT(plan, 10.0) << r.output.substr(at);
  EXPECT_GT(plan, 100 * median) << r.output.substr(at);
}

// Hugging Face's ZeRO-3 config, "auto" nearly everywhere, trains: the bucket
// sizes come from the model's hidden size (raised to one norm block for a
// model this small), total_num_steps from --steps.
TEST(TrainTest, HuggingFaceAutoConfigResolvesFromTheModel) {
  const std::string cfg = zinf::test::SourceDir() + "/tests/fixtures/ds_zero3_hf_auto.json";
  auto r = zinf::test::RunCommand(
      "cd " + zinf::test::TestDir() + " && ZINF_LOG_LEVEL=info " + zinf::test::BinaryDir() + "/zinf train --config " +
      cfg + " --steps 3 --layers 1 --d-model 32 --seq-len 32 --micro-batch 4 --sample-tokens 0 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("auto: zero_optimization.reduce_bucket_size = 65536 "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("auto: zero_optimization.stage3_param_persistence_threshold = 320 "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("auto: scheduler.params.total_num_steps = 1002 "), std::string::npos) << r.output;
}

// The embedded default (no arguments) reaches the corpus's entropy rate +
// 0.3 nats on validation, with stage 3 and the optimizer state on NVMe.
TEST(TrainTest, EmbeddedDefaultReachesTheEntropyBound) {
  auto r = RunZinf("train");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("optimizer Adam"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on nvme"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(": met)"), std::string::npos) << r.output;
}

std::vector<nlohmann::json> Lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Stopping at step 6 and resuming from its checkpoint gives the losses and
// gradient norms of the run that never stopped, bit for bit.
TEST(TrainTest, ResumeContinuesBitExactly) {
  const std::string shape = " --steps 12 --layers 1 --d-model 32 --seq-len 32 --micro-batch 4";
  const std::string ck = Scratch("train_ckpt"), m1 = Scratch("train_m1.jsonl"), m2 = Scratch("train_m2.jsonl");
  std::filesystem::remove_all(ck);
  auto r = RunZinf("train" + shape + " --metrics-json " + m1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string trained = Scratch("train_final.safetensors"), exported = Scratch("train_ckpt_export.safetensors");
  r = RunZinf("train" + shape + " --save-dir " + ck + " --save-every 6 --keep 2 --export " + trained +
              " --export-dtype fp32 --export-names hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(ck + "/step-6/manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(ck + "/latest"));
  // `zinf export` of the last checkpoint writes the same file, byte for
  // byte, as the run's own export of its final weights.
  r = RunZinf("export " + ck + " " + exported + " --dtype fp32 --names hf");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step-12"), std::string::npos) << r.output;
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_GT(bytes(exported).size(), 1000u);
  EXPECT_TRUE(bytes(exported) == bytes(trained)) << "zinf export differs from train --export";
  r = RunZinf("export " + ck + " " + exported + " --dtype fp8");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = RunZinf("export " + Scratch("no-such-checkpoint") + " " + exported);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no checkpoint at"), std::string::npos) << r.output;
  r = RunZinf("train" + shape + " --resume " + ck + "/step-6 --metrics-json " + m2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  const auto straight = Lines(m1), resumed = Lines(m2);
  ASSERT_EQ(straight.size(), 12u);
  ASSERT_EQ(resumed.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(resumed[i].at("step"), straight[6 + i].at("step"));
    EXPECT_EQ(resumed[i].at("loss").get<double>(), straight[6 + i].at("loss").get<double>()) << "step " << 7 + i;
    EXPECT_EQ(resumed[i].at("grad_norm").get<double>(), straight[6 + i].at("grad_norm").get<double>());
  }
  // Resuming from the run's last checkpoint has no step left to take: it
  // loads, validates and reports that, and succeeds (a run killed right after
  // its final save is resumed this way).
  r = RunZinf("train" + shape + " --resume " + ck + "/step-12");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("no steps left"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("nan"), std::string::npos) << r.output;
}

// A Llama-shaped model out to a Hugging Face folder and back in: the folder
// trained again starts where the first run ended (its first loss is below
// the untrained model's), carries its config and tokenizer over, and a
// folder zinf cannot honour is one line and exit code 2.
TEST(TrainTest, HuggingFaceFolderOutAndBackIn) {
  const std::string shape = " --steps 12 --seq-len 16 --micro-batch 4 --sample-tokens 0";
  const std::string first = Scratch("train_hf_first"), second = Scratch("train_hf_second");
  const std::string m1 = Scratch("train_hf_m1.jsonl"), m2 = Scratch("train_hf_m2.jsonl");
  std::filesystem::remove_all(first);
  std::filesystem::remove_all(second);
  auto r = RunZinf("train --model tiny-llama --vocab 256" + shape + " --export-dir " + first +
                   " --export-dtype fp32 --metrics-json " + m1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(first + "/config.json"));
  EXPECT_TRUE(std::filesystem::exists(first + "/model.safetensors"));
  r = RunZinf("train --model-dir " + first + shape + " --export-dir " + second + " --metrics-json " + m2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rmsnorm rope swiglu untied"), std::string::npos) << r.output;
  const auto a = Lines(m1), b = Lines(m2);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  EXPECT_LT(b.front().at("loss").get<double>(), a.front().at("loss").get<double>() - 0.1)
      << "the second run did not start from the exported weights";
  EXPECT_TRUE(std::filesystem::exists(second + "/config.json"));
  std::ofstream(first + "/config.json") << R"({"model_type": "falcon", "hidden_size": 32})";
  r = RunZinf("train --model-dir " + first + shape);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("\"model_type\" is 'falcon'"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

// Conversations whose prompts are random letters and whose answers are all
// "ok": with the loss on the answers only, the loss falls near zero; had the
// prompts' letters been targets, it would stay near their entropy (ln 26 per
// letter over most of the targets).
TEST(TrainTest, ChatDataTrainsOnTheAnswersOnly) {
  const std::string dir = Scratch("train_chat");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << zinf::data::test::ByteTokenizerJsonWithMarkers();
  {
    std::ofstream out(dir + "/d.jsonl");
    uint64_t x = 12345;
    for (int i = 0; i < 400; ++i) {
      std::string prompt;
      for (int k = 0; k < 12; ++k) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        prompt += static_cast<char>('a' + (x >> 33) % 26);
      }
      out << nlohmann::json{{"prompt", prompt}, {"response", "ok"}}.dump() << "\n";
    }
  }
  const std::string metrics = dir + "/m.jsonl";
  auto r = RunZinf("train --model tiny-llama --vocab 264 --tokenizer " + dir + "/tokenizer.json --data " + dir +
                   "/d.jsonl --seq-len 64 --steps 40 --micro-batch 4 --lr 1e-2 --sample-tokens 4 --device cpu "
                   "--metrics-json " +
                   metrics);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("chat data: 400 examples (llama3 template)"), std::string::npos) << r.output;
  const auto lines = Lines(metrics);
  ASSERT_EQ(lines.size(), 40u);
  EXPECT_GT(lines.front().at("loss").get<double>(), 3.0);
  EXPECT_LT(lines.back().at("loss").get<double>(), 0.3) << r.output;
  // The sample continues the first validation prompt (its header included).
  EXPECT_NE(r.output.find("<|start_header_id|>assistant<|end_header_id|>"), std::string::npos) << r.output;

  r = RunZinf("train --model tiny-llama --vocab 264 --data " + dir + "/d.jsonl --steps 1 --device cpu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--chat-template: the byte tokenizer has none of the chat templates' markers"),
            std::string::npos)
      << r.output;
}

// A Llama-family checkpoint leaves as a Hugging Face folder through
// `zinf export --hf-dir`, equal to the one `zinf train --export-dir` wrote
// from the same weights.
TEST(TrainTest, LlamaCheckpointExportsAsAHuggingFaceFolder) {
  const std::string dir = Scratch("train_export_hf");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << zinf::data::test::ByteTokenizerJsonWithMarkers();
  auto r = RunZinf("train --model tiny-qwen3 --vocab 264 --tokenizer " + dir +
                   "/tokenizer.json --steps 3 --seq-len 16 "
                   "--micro-batch 2 --sample-tokens 0 --device cpu --save-every 3 --save-dir " +
                   dir + "/ck --export-dir " + dir + "/direct --export-dtype fp32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunZinf("export " + dir + "/ck --hf-dir " + dir + "/exported --dtype fp32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer files copied"), std::string::npos) << r.output;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    EXPECT_EQ(zinf::data::test::ReadFile(dir + "/exported/" + f), zinf::data::test::ReadFile(dir + "/direct/" + f))
        << f;
  }
  r = RunZinf("export " + dir + "/ck " + dir + "/x.safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("write it with --hf-dir DIR"), std::string::npos) << r.output;
  r = RunZinf("export " + dir + "/ck");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

TEST(TrainTest, BadInputIsOneLineAndExitCodeTwo) {
  struct Case {
    std::string args, expect;
  };
  const std::string empty = Scratch("train_empty.txt");
  std::ofstream(empty).close();
  const std::string tiny = Scratch("train_tiny.txt");
  std::ofstream(tiny) << "just a few words of text";
  const std::string config = Scratch("train_config.json");
  std::ofstream(config) << R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}})";
  const Case cases[] = {
      {"train --data /nonexistent/corpus.txt", "/nonexistent/corpus.txt"},
      {"train --data " + empty, "too few"},
      {"train --data " + tiny + " --seq-len 64", "too few for a context of 64"},
      {"train --steps many", "--steps"},
      {"train --config " + config + " --micro-batch 8", "contradicts train_micro_batch_size_per_gpu = 4"},
      {"train --vocab 100", "smaller than the tokenizer's"},
      {"train --model gpt-99b", "gpt-99b"},
      {"train --sample-tokens -1", "--sample-tokens must be >= 0"},
      {"train --device tpu", "expected auto, cpu, cuda or cuda:N"},
      {"train --adam-json /nonexistent/adam.json", "--adam-json: cannot read /nonexistent/adam.json"},
      {"train --aio-json " + tiny, "--aio-json: "},
      // The plan's row decides before the initial state is written anywhere.
      {"train --device cpu --device-memory 1M",
       "the model does not fit (zinf plan's row for this configuration): device needs"},
  };
  for (const Case& c : cases) {
    auto r = RunZinf(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_LE(std::count(r.output.begin(), r.output.end(), '\n'), 3) << c.args << "\n" << r.output;
  }
}

}  // namespace
