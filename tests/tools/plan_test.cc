// `zinf plan` as a user runs it: the table, --json, rate files and bad input
// (one line, exit code 2).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

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
  auto r = RunZinf("plan --model tiny --micro-batch 2 --dtype bf16 --device-memory 1G --host-memory 2G --nvme-free 10G");
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
  const std::string adam = Scratch("plan_adam.json", R"({"bench":"adam","bytes_per_param":28,"rows":[{"threads":2,"params_per_s":1e9}]})");
  const std::string aio = Scratch("plan_aio.json", R"({"command":"aio sweep","points":[{"threads":1,"block_size":262144,"queue_depth":32,"read_gb_per_s":1.5,"write_gb_per_s":2.5}],"recommended":{"aio":{"block_size":262144,"queue_depth":32,"intra_op_parallelism":1}}})");
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
  for (const std::string args : {"plan", "plan --model nope", "plan --model tiny --params 1M", "plan --params 12Q",
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

}  // namespace
