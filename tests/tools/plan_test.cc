// `zinf plan` as a user runs it: the table, --json, rate files and bad input
// (one line, exit code 2).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

struct RunResult {
  int exit_code;
  std::string out;  // stdout
  std::string err;  // stderr
};

RunResult RunZinf(const std::string& args) {
  const std::string err_path = zinf::test::TestDir() + "/plan_cli_stderr.txt";
  const auto r = zinf::test::RunCommand(zinf::test::BinaryDir() + "/zinf " + args + " 2>" + err_path);
  std::ifstream e(err_path);
  std::string err((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  return {r.exit_code, r.output, err};
}

std::string Scratch(const std::string& name, const std::string& content) {
  std::string path = zinf::test::TestDir() + "/" + name;
  std::ofstream(path) << content;
  return path;
}

TEST(PlanCliTest, TableHasEveryCombinationAndStatesDefaults) {
  auto r =
      RunZinf("plan --model tiny --micro-batch 2 --dtype bf16 --device-memory 1G --host-memory 2G --nvme-free 10G");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("default: 2 GB/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("default: 40 GFLOP/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("max(compute, parameter shard reads)"), std::string::npos) << r.out;
  int rows = 0;
  size_t pos = 0;
  while ((pos = r.out.find("\n", pos)) != std::string::npos) {
    ++pos;
    if (r.out.compare(pos, 2, "0 ") == 0 || r.out.compare(pos, 2, "1 ") == 0 || r.out.compare(pos, 2, "2 ") == 0 ||
        r.out.compare(pos, 2, "3 ") == 0)
      ++rows;
  }
  EXPECT_EQ(rows, 18) << r.out;
}

TEST(PlanCliTest, JsonWithRateFiles) {
  const std::string adam =
      Scratch("plan_adam.json", R"({"bench":"adam","bytes_per_param":28,"rows":[{"threads":2,"params_per_s":1e9}]})");
  const std::string aio = Scratch(
      "plan_aio.json",
      R"({"command":"aio sweep","points":[{"threads":1,"block_size":262144,"queue_depth":32,"read_gb_per_s":1.5,"write_gb_per_s":2.5}],"recommended":{"aio":{"block_size":262144,"queue_depth":32,"intra_op_parallelism":1}}})");
  auto r = RunZinf("plan --params 100M --ranks 2 --json --adam-json " + adam + " --aio-json " + aio +
                   " --device-memory 4G --host-memory 8G --nvme-free 100G");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["command"], "plan");
  EXPECT_EQ(j["ranks"], 2);
  EXPECT_EQ(j["rows"].size(), 18u);
  EXPECT_DOUBLE_EQ(j["rates"]["adam_params_per_s"]["value"].get<double>(), 1e9);
  EXPECT_DOUBLE_EQ(j["rates"]["nvme_read_gb_per_s"]["value"].get<double>(), 1.5);
  EXPECT_NE(j["model"]["activations"].get<std::string>().find("not counted"), std::string::npos);
  for (const auto& row : j["rows"]) {
    EXPECT_GT(row["device_bytes"].get<double>(), 0);
    EXPECT_GT(row["seconds"]["step"].get<double>(), 0);
    if (row["offload_optimizer"] == "nvme") {
      EXPECT_GT(row["nvme_bytes"].get<double>(), 0);
    }
    EXPECT_TRUE(row["runnable"].get<bool>()) << row.dump();
    // offload_param nvme with the default max_in_cpu (1e9 elements): every
    // shard of 100M parameters stays in host memory, no shard reads.
    EXPECT_EQ(row["seconds"]["param_read"].get<double>(), 0.0) << row.dump();
  }
  // Stage 2, optimizer on the host: master/m/v and the accumulator are off
  // the device; compute copy, gradients and the reduce bucket stay (12 of 24 B).
  const auto& s0 = j["rows"][0];
  const auto& s2cpu = j["rows"][7];
  EXPECT_EQ(s2cpu["stage"], 2);
  EXPECT_EQ(s2cpu["offload_optimizer"], "cpu");
  EXPECT_LT(s2cpu["device_bytes"].get<double>(), s0["device_bytes"].get<double>() * 0.6);
}

TEST(PlanCliTest, BadInputIsOneLineExitTwo) {
  for (const std::string args :
       {"plan", "plan --model nope", "plan --model tiny --params 1M", "plan --params 12Q",
        "plan --model tiny --device-memory lots", "plan --params 1M --adam-json /nonexistent.json",
        "plan --model tiny --seq-len 100000", "plan --params 1M --ranks 0"}) {
    auto r = RunZinf(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out << r.err;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  // The file `zinf aio sweep --output` writes holds settings, not throughput.
  const std::string cfg = Scratch("plan_aio_config.json", R"({"aio":{"block_size":262144}})");
  auto r = RunZinf("plan --params 1M --aio-json " + cfg);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--json"), std::string::npos) << r.err;
}

// The config Hugging Face's DeepSpeed integration documents for ZeRO-3,
// "auto" nearly everywhere: plan resolves the model-dependent values from the
// preset's hidden size and total_num_steps from --steps.
TEST(PlanCliTest, ResolvesHuggingFaceAutoValuesFromTheModel) {
  const std::string cfg = zinf::test::SourceDir() + "/tests/fixtures/ds_zero3_hf_auto.json";
  auto r = RunZinf("plan --config " + cfg +
                   " --model gpt2 --steps 1000 --device-memory 8G --host-memory 16G --nvme-free 100G");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // gpt2: hidden size 768.
  EXPECT_NE(r.out.find("auto: zero_optimization.reduce_bucket_size = 589824 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("auto: zero_optimization.stage3_prefetch_bucket_size = 530841 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("auto: zero_optimization.stage3_param_persistence_threshold = 7680 "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("auto: scheduler.params.total_num_steps = 1000 "), std::string::npos) << r.out;
  // A shape instead of a preset: the hidden size is --d-model's.
  r = RunZinf("plan --config " + cfg + " --layers 2 --d-model 512 --heads 8 --vocab 256 --seq-len 64 --steps 10");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("auto: zero_optimization.reduce_bucket_size = 262144 "), std::string::npos) << r.out;
  // Below one norm block (64 Ki elements) the bucket is raised to it: the
  // engine takes no smaller bucket.
  r = RunZinf("plan --config " + cfg + " --layers 2 --d-model 128 --heads 4 --vocab 256 --seq-len 64 --steps 10");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("auto: zero_optimization.reduce_bucket_size = 65536 (\"auto\": hidden_size^2, raised"),
            std::string::npos)
      << r.out;

  // What plan cannot know is one error line naming the key and the flag that
  // gives it (the config's own warnings, e.g. steps_per_print ignored, are
  // log lines before it).
  auto error_line = [](const std::string& err) {
    std::vector<std::string> lines;
    for (size_t pos = 0, next; (next = err.find('\n', pos)) != std::string::npos; pos = next + 1) {
      if (err.compare(pos, 11, "zinf plan: ") == 0) lines.push_back(err.substr(pos, next - pos));
    }
    EXPECT_EQ(lines.size(), 1u) << err;
    return lines.empty() ? std::string() : lines.back();
  };
  r = RunZinf("plan --config " + cfg + " --model gpt2");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  std::string line = error_line(r.err);
  EXPECT_NE(line.find("scheduler.params.total_num_steps"), std::string::npos) << r.err;
  EXPECT_NE(line.find("--steps"), std::string::npos) << r.err;
  r = RunZinf("plan --config " + cfg + " --params 1B --steps 10");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  line = error_line(r.err);
  EXPECT_NE(line.find("zero_optimization.reduce_bucket_size"), std::string::npos) << r.err;
  EXPECT_NE(line.find("--d-model"), std::string::npos) << r.err;
}

}  // namespace
