// Runs the built `zinf` binary as a user would and checks what it prints and
// its exit codes.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

zinf::test::CommandResult RunZinf(const std::string& args) {
  return zinf::test::RunCommand(zinf::test::BinaryDir() + "/zinf " + args + " 2>&1");
}

std::string Data(const std::string& name) { return zinf::test::SourceDir() + "/tests/fixtures/" + name; }

std::string ScratchFile(const std::string& name, const std::string& content) {
  std::string path = zinf::test::TestDir() + "/" + name;
  std::ofstream(path) << content;
  return path;
}

TEST(ZinfCliTest, VersionReportsEveryBackend) {
  auto r = RunZinf("--version");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("zinf ", 0), 0u) << r.output;
  for (const char* backend : {" cuda ", " nccl ", " io_uring ", " oneTBB ", " hwloc ", " simd ", " mpi ", " openblas "})
    EXPECT_NE(r.output.find(backend), std::string::npos) << backend << " missing from:\n" << r.output;
  EXPECT_NE(r.output.find("NUMA node"), std::string::npos) << r.output;
}

TEST(ZinfCliTest, ConfigCheckAcceptsARealConfig) {
  auto r = RunZinf("config check " + Data("ds_zero3_nvme.json") + " --world-size 2 --params 1.5G");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ZeRO stage 3, optimizer nvme (/local_nvme)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("batch: 16 = micro 1 x accumulation 8 x world 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model state per rank"), std::string::npos) << r.output;
}

TEST(ZinfCliTest, ConfigCheckResolvesAutoWithHiddenSize) {
  auto r = RunZinf("config check " + Data("ds_zero3_hf.json") + " --hidden-size 1024 --print");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("zero_optimization.reduce_bucket_size = 1048576"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"stage3_param_persistence_threshold\": 10240"), std::string::npos) << r.output;
}

TEST(ZinfCliTest, BadConfigExitsTwoWithThePath) {
  std::string path = ScratchFile("bad_stage.json", R"({"zero_optimization": {"stage": 7}})");
  auto r = RunZinf("config check " + path);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(path + ": zero_optimization.stage: 7 is out of range"), std::string::npos) << r.output;
}

// Input files that aborted (134) or crashed (139) zinf: one line naming the
// file (and the key), exit code 2, from config check, train and plan alike.
TEST(ZinfCliTest, HostileConfigsExitTwoWithOneLine) {
  const std::string overflow = ScratchFile("overflow.json", R"({"train_micro_batch_size_per_gpu": 4e308})");
  const std::string deep = ScratchFile("deep.json", std::string(200000, '[') + std::string(200000, ']'));
  for (const std::string& path : {overflow, deep}) {
    for (const std::string& command :
         {"config check " + path, "train --steps 1 --config " + path, "plan --params 1M --config " + path}) {
      auto r = zinf::test::RunCommand(zinf::test::BinaryDir() + "/zinf " + command + " 2>&1 >/dev/null");
      EXPECT_EQ(r.exit_code, 2) << command << ": " << r.output;
      EXPECT_NE(r.output.find(path + ":1:"), std::string::npos) << command << ": " << r.output;
      EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << command << ": " << r.output;
    }
  }
  auto r = RunZinf("config check " + overflow);
  EXPECT_NE(r.output.find("(at train_micro_batch_size_per_gpu)"), std::string::npos) << r.output;
}

// Hostile tokenizer, model folder and chat data files given to zinf train:
// exit code 2 and one line naming the file, before any training starts.
TEST(ZinfCliTest, HostileInputFilesExitTwoWithOneLine) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string tokenizer = ScratchFile("deep_tokenizer.json", "{\"model\": " + deep + "}");
  const std::string model_dir = zinf::test::TestDir() + "/hostile_model";
  std::filesystem::create_directories(model_dir);
  ScratchFile("hostile_model/config.json", R"({"model_type": "llama", "rms_norm_eps": 1e999})");
  // A tokenizer with the chat markers, and a data line nested too deep.
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 33; b < 127; ++b) vocab[std::string(1, static_cast<char>(b))] = b;
  nlohmann::json added = nlohmann::json::array();
  for (const char* m : {"<|im_start|>", "<|im_end|>"}) added.push_back({{"id", 200 + added.size()}, {"content", m}});
  const nlohmann::json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}};
  const std::string chat_tokenizer =
      ScratchFile("chat_tokenizer.json", nlohmann::json{{"added_tokens", added}, {"model", model}}.dump());
  const std::string data = ScratchFile("deep.jsonl", R"({"messages": )" + deep + "}\n");
  const struct {
    std::string args, names;
  } cases[] = {
      {"--tokenizer " + tokenizer, "deep_tokenizer.json:1:74: JSON nests deeper than 64 levels"},
      {"--model-dir " + model_dir, "config.json:1:"},
      {"--tokenizer " + chat_tokenizer + " --chat-template chatml --data " + data, "deep.jsonl:1"},
  };
  for (const auto& c : cases) {
    auto r = zinf::test::RunCommand(zinf::test::BinaryDir() + "/zinf train --steps 1 " + c.args + " 2>&1 >/dev/null");
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.output;
    EXPECT_NE(r.output.find(c.names), std::string::npos) << c.args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << c.args << ": " << r.output;
  }
}

TEST(ZinfCliTest, ParamCountsBeyondInt64ExitTwo) {
  auto r = RunZinf("config check " + Data("ds_zero3_nvme.json") + " --params 1e19");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--params: invalid count '1e19'"), std::string::npos) << r.output;
  r = RunZinf("plan --params 1e19");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--params: invalid count '1e19'"), std::string::npos) << r.output;
}

TEST(ZinfCliTest, BadUsageExitsTwo) {
  EXPECT_EQ(RunZinf("").exit_code, 2);
  EXPECT_EQ(RunZinf("frobnicate").exit_code, 2);
  EXPECT_EQ(RunZinf("config check").exit_code, 2);
  EXPECT_EQ(RunZinf("bench membw --size 4Q").exit_code, 2);
  EXPECT_EQ(RunZinf("bench offload --params 1M --device tpu").exit_code, 2);
  EXPECT_EQ(RunZinf("bench stage3 --params 1M --offload-param nvme").exit_code, 2);  // no --path
  EXPECT_EQ(RunZinf("bench stage3 --params 1M --offload-param disk --path /tmp").exit_code, 2);
  EXPECT_EQ(RunZinf("bench stage3 --params 1M --device-memory 0 --path /tmp").exit_code, 2);
  EXPECT_EQ(RunZinf("bench stage3 --params 1M --buffer-count 0 --path /tmp").exit_code, 2);
  EXPECT_EQ(RunZinf("--log-level loud config check " + Data("ds_zero3_nvme.json")).exit_code, 2);
}

// cuBLAS (and the cuBLASLt it pulls in, 0.13 s of CPU and 210 MB at load)
// and OpenBLAS (whose threads start, and spin, at load) are opened only when
// a model needs them: a command that runs no model never loads them, one
// that does loads OpenBLAS. The loader's own trace lists every library it maps.
TEST(ZinfCliTest, LibrariesOnlyAModelNeedsAreOpenedWhenItRuns) {
  auto r = zinf::test::RunCommand("LD_DEBUG=files " + zinf::test::BinaryDir() + "/zinf config check " +
                                  Data("ds_zero3_nvme.json") + " --world-size 2 --params 1.5G 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("file=libtbb"), std::string::npos) << "the trace lists no libraries:\n" << r.output;
  EXPECT_EQ(r.output.find("libcublas"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("libopenblas"), std::string::npos) << r.output;
  r = zinf::test::RunCommand("LD_DEBUG=files " + zinf::test::BinaryDir() +
                             "/zinf bench model --preset tiny --seq-len 16 --micro-batch 1 --steps 1 --threads 1 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("libopenblas"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("libcublas"), std::string::npos) << r.output;
}

TEST(ZinfCliTest, LibraryLogsGoToStderrNotStdout) {
  std::string cmd = zinf::test::BinaryDir() + "/zinf config check " + Data("ds_zero2_hf.json") + " 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  pclose(pipe);
  // The warnings about steps_per_print are logged; none may reach stdout.
  EXPECT_EQ(out.find("steps_per_print"), std::string::npos) << out;
  EXPECT_EQ(out.find("[zinf]"), std::string::npos) << out;
}

TEST(ZinfCliTest, MembwBenchPrintsRatioJson) {
  auto r = RunZinf("bench membw --size 16M --threads 1 --loops 2 --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"ratio_to_copy\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"kernel\": \"update\""), std::string::npos) << r.output;
}

// bench model measures a reshaped preset (the very model zinf train would
// build), and its JSON is a rate file zinf plan takes.
TEST(ZinfCliTest, ModelBenchTakesAShapeAndFeedsThePlan) {
  const std::string json = zinf::test::TestDir() + "/model_bench_custom.json";
  auto r = zinf::test::RunCommand(zinf::test::BinaryDir() +
                                  "/zinf bench model --preset tiny --layers 1 --d-model 32 --heads 4 --vocab 64 "
                                  "--seq-len 24 --micro-batch 2 --steps 1 --json > " +
                                  json + " 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0);
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("preset"), "custom");
  bool step = false;
  for (const auto& p : j.at("phases"))
    step = step || (p.at("phase") == "step" && p.at("gflop_per_s").get<double>() > 0);
  EXPECT_TRUE(step) << j.dump();
  // On the host the reference is OpenBLAS's sgemm of the LM head's shape,
  // and there is no MFU without a peak.
  EXPECT_EQ(j.at("reference").at("kind"), "cblas_sgemm");
  EXPECT_EQ(j.at("reference").at("m"), 48);
  EXPECT_EQ(j.at("reference").at("n"), 64);
  EXPECT_EQ(j.at("reference").at("k"), 32);
  EXPECT_GT(j.at("reference").at("gflop_per_s").get<double>(), 0.0);
  EXPECT_EQ(j.at("mfu").get<double>(), 0.0);
  EXPECT_NEAR(
      j.at("tflop_per_s").get<double>() * 1e3,
      j.at("flops_per_step").get<double>() /
          [&] {
            for (const auto& p : j.at("phases")) {
              if (p.at("phase") == "step") return p.at("seconds").get<double>();
            }
            return 0.0;
          }() /
          1e9,
      1e-6 * j.at("tflop_per_s").get<double>() * 1e3);
  // With a peak given, MFU is the step's rate over it.
  r = zinf::test::RunCommand(zinf::test::BinaryDir() +
                             "/zinf bench model --preset tiny --layers 1 --d-model 32 --heads 4 --vocab 64 "
                             "--seq-len 24 --micro-batch 2 --steps 1 --peak-tflops 0.5 --json 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json with_peak = nlohmann::json::parse(r.output);
  EXPECT_NEAR(with_peak.at("mfu").get<double>(), with_peak.at("tflop_per_s").get<double>() / 0.5, 1e-12);
  // --breakdown: each op's time per step; the ops fill the stages.
  r = zinf::test::RunCommand(zinf::test::BinaryDir() +
                             "/zinf bench model --preset tiny --layers 2 --d-model 128 --heads 4 --vocab 1024 "
                             "--seq-len 64 --micro-batch 2 --steps 5 --breakdown --json 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json ops = nlohmann::json::parse(r.output);
  double step_seconds = 0, op_total = 0, other = 0;
  for (const auto& p : ops.at("phases")) {
    if (p.at("phase") == "step") step_seconds = p.at("seconds").get<double>();
  }
  std::set<std::string> names;
  for (const auto& op : ops.at("ops")) {
    names.insert(op.at("op").get<std::string>());
    EXPECT_GE(op.at("seconds").get<double>(), 0.0) << op.dump();
    op_total += op.at("seconds").get<double>();
    if (op.at("op") == "other") other = op.at("seconds").get<double>();
  }
  for (const char* op : {"matmul", "attention", "norm", "loss", "embedding", "activation", "residual"}) {
    EXPECT_TRUE(names.count(op)) << op << ": " << ops.at("ops").dump();
  }
  EXPECT_EQ(ops.at("ops_lost_marks"), 0);
  // Inside the stages the named ops hold the time: a stage's work before
  // its first mark would show as "other". (Between the stages, handing
  // each to the stream's worker, is the machine's: not checked.)
  EXPECT_GT(op_total, 0.0) << ops.dump();
  EXPECT_LT(other, 0.05 * op_total) << ops.dump();
  EXPECT_LT(op_total, 1.05 * step_seconds) << ops.dump();
  // A device it cannot use: one line, exit 2. CUDA: on a GPU the reference
  // is cuBLAS's product; without one, a failure naming CUDA.
  r = RunZinf("bench model --preset tiny --seq-len 16 --steps 1 --device tpu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--device must be cpu, cuda or cuda:N"), std::string::npos) << r.output;
  r = RunZinf("bench model --preset tiny --seq-len 16 --steps 1 --device cuda");
  if (r.exit_code == 0) {
    EXPECT_NE(r.output.find("cublas ref"), std::string::npos) << r.output;
  } else {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("CUDA"), std::string::npos) << r.output;
  }
  r = RunZinf("plan --params 1M --model-json " + json);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model_bench_custom.json (custom, step phase)"), std::string::npos) << r.output;
  // A shape the model cannot take: one line, exit 2.
  r = RunZinf("bench model --preset tiny --d-model 30 --heads 4 --steps 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// bench attention: on a GPU both ways of taking the operands, their ratio,
// the forward's 64-query blocks at head_dim 64, and the same bits; without one, exit 1 naming CUDA. A shape the kernels
// cannot take is refused first, with exit 2.
TEST(ZinfCliTest, AttentionBenchComparesBothWaysOrNamesCuda) {
  auto r =
      RunZinf("bench attention --preset tiny --heads 4 --head-dim 64 --seq-len 130 --micro-batch 1 --reps 2 --json");
  if (r.exit_code == 0) {
    const nlohmann::json j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
    EXPECT_TRUE(j.at("same_bits").get<bool>()) << r.output;
    EXPECT_GT(j.at("speedup").get<double>(), 0.0) << r.output;
    EXPECT_EQ(j.at("kv_heads").get<int>(), 4) << r.output;
    EXPECT_GT(j.at("bf16_copies_64_query_blocks").at("forward_ms").get<double>(), 0.0) << r.output;  // head_dim 64
  } else {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("CUDA"), std::string::npos) << r.output;
  }
  r = RunZinf("bench attention --preset tiny --head-dim 32");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("head_dim 32"), std::string::npos) << r.output;
  r = RunZinf("bench attention --heads 6 --kv-heads 4");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("does not divide"), std::string::npos) << r.output;
  r = RunZinf("bench attention --preset no-such-model");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// bench offload with the optimizer on NVMe: the bytes per step it reports are
// the state's (and, under a short host budget, swapped gradients too), and
// the bound is timed for those bytes.
TEST(ZinfCliTest, OffloadBenchBoundsTheBytesTheEngineMoved) {
  const std::string dir = zinf::test::TestDir() + "/bench_offload";
  std::filesystem::create_directories(dir);
  const double padded = 8.0 * 1048576, state = padded * 12;
  auto run = [&](const std::string& extra) {
    auto r = zinf::test::RunCommand(zinf::test::BinaryDir() +
                                    "/zinf bench offload --params 8M --units 8 --offload nvme "
                                    "--sub-group-size 1100000 --steps 2 --json --path " +
                                    dir + " " + extra + " 2>/dev/null");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
  };
  auto j = run("");
  ASSERT_FALSE(j.empty());
  EXPECT_EQ(j["nvme_bytes_read_per_step"].get<double>(), state) << j.dump();
  EXPECT_EQ(j["nvme_bytes_written_per_step"].get<double>(), state) << j.dump();
  EXPECT_GT(j["io_bound_seconds"].get<double>(), 0) << j.dump();
  EXPECT_TRUE(j["peak_rss_engine_only"].get<bool>()) << j.dump();
  EXPECT_LE(j["peak_rss_outside_device_bytes"].get<double>(), j["peak_rss_bytes"].get<double>()) << j.dump();
  // A budget that holds the swap buffers but not every unit's gradients:
  // the swapped gradients are written and read back each step, on top.
  j = run("--host-memory 80M");
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(j.empty());
  EXPECT_GT(j["nvme_bytes_read_per_step"].get<double>(), state) << j.dump();
  EXPECT_GT(j["nvme_bytes_written_per_step"].get<double>(), state) << j.dump();
  EXPECT_LE(j["host_peak_pinned_bytes"].get<double>(), 80.0 * 1048576) << j.dump();
}

// A small stage-3 run with parameters and optimizer on NVMe: the engine's
// bytes, the bound, the plan's peaks against the measured ones.
TEST(ZinfCliTest, Stage3BenchReportsBytesAndTheBound) {
  const std::string dir = zinf::test::TestDir() + "/bench_stage3";
  std::filesystem::create_directories(dir);
  auto r = zinf::test::RunCommand(
      zinf::test::BinaryDir() +
      "/zinf bench stage3 --params 4M --units 4 "
      "--device-memory 64M --sub-group-size 2M --buffer-count 3 --steps 2 --compute-ms-per-unit 1 --json "
      "--path " +
      dir + " 2>/dev/null");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  // Per step: each 1M-parameter unit (padded to 1,048,576 elements) has its
  // bf16 shard read in forward (and in backward unless kept) and written
  // once; 12 B/element of state both ways.
  const double padded = 4.0 * 1048576, state = padded * 12, shards = padded * 2;
  EXPECT_GE(j["nvme_bytes_read"].get<double>(), state + shards) << r.output;
  EXPECT_LE(j["nvme_bytes_read"].get<double>(), state + 2 * shards) << r.output;
  EXPECT_GE(j["nvme_bytes_written"].get<double>(), state + shards) << r.output;
  EXPECT_GT(j["io_bound_seconds"].get<double>(), 0) << r.output;
  EXPECT_EQ(j["device_peak_bytes"], j["plan_device_bytes"]) << r.output;
  EXPECT_EQ(j["host_peak_pinned_bytes"], j["plan_host_bytes"]) << r.output;
  EXPECT_EQ(j["fetches"].get<int>(), 8) << r.output;
  EXPECT_EQ(j["buffer_count"].get<int>(), 3) << r.output;
  // The steady-state step holds a forward and a backward of compute.
  EXPECT_GE(j["step_seconds"].get<double>(), j["compute_alone_seconds"].get<double>()) << r.output;
}

}  // namespace
