#include "zinf/config.h"

#include <gtest/gtest.h>

#include <cctype>

#include <string>

#include "test_util.h"

namespace zinf {
namespace {

std::string DataPath(const std::string& name) { return test::SourceDir() + "/tests/fixtures/" + name; }

Config MustParse(const std::string& text) {
  auto r = ParseConfig(text, "test.json");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : Config{};
}

// Parses text expecting failure; returns the message.
std::string ErrorOf(const std::string& text) {
  auto r = ParseConfig(text, "test.json");
  EXPECT_FALSE(r.ok()) << "accepted: " << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(ConfigTest, EmptyObjectGivesDeepSpeedDefaults) {
  Config c = MustParse("{}");
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_TRUE(c.zero.reduce_scatter);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 500000000);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.sub_group_size, 1000000000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(c.zero.stage3_model_persistence_threshold, INT64_MAX);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 1000000000);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero.offload_param.buffer_size, 100000000);
  EXPECT_EQ(c.zero.offload_param.max_in_cpu, 1000000000);
  EXPECT_EQ(c.aio.block_size, 1048576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.fp16.hysteresis, 2);
  EXPECT_EQ(c.fp16.min_loss_scale, 1.0);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_FALSE(c.optimizer.present);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kNone);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(ConfigTest, OverlapCommDefaultsToTrueAtStage3Only) {
  EXPECT_TRUE(MustParse(R"({"zero_optimization": {"stage": 3}})").zero.overlap_comm);
  EXPECT_FALSE(MustParse(R"({"zero_optimization": {"stage": 2}})").zero.overlap_comm);
  EXPECT_FALSE(MustParse(R"({"zero_optimization": {"stage": 3, "overlap_comm": false}})").zero.overlap_comm);
  EXPECT_TRUE(MustParse(R"({"zero_optimization": {"stage": 3, "overlap_comm": null}})").zero.overlap_comm);
}

TEST(ConfigTest, RealHuggingFaceZero2LoadsUnchanged) {
  auto r = LoadConfigFile(DataPath("ds_zero2_hf.json"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Config c = std::move(r).value();
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero.reduce_bucket_size, 200000000);  // written as 2e8
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  // steps_per_print is warned about, not an error; wall_clock_breakdown is false, so silent.
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("steps_per_print"), std::string::npos);
  EXPECT_GE(c.auto_keys.size(), 10u);

  AutoContext ctx;
  ctx.lr = 2e-5;
  ctx.micro_batch_size = 4;
  ctx.gradient_accumulation_steps = 2;
  ctx.gradient_clipping = 1.0;
  auto lines = ResolveAuto(c, ctx);
  ASSERT_TRUE(lines.ok()) << lines.status().ToString();
  EXPECT_TRUE(c.auto_keys.empty());
  EXPECT_EQ(c.optimizer.lr, 2e-5);
  EXPECT_EQ(c.scheduler.warmup_max_lr, 2e-5);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  auto batch = ResolveBatchSizes(c, 2);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(batch->train_batch_size, 16);
  bool printed_lr = false;
  for (const auto& l : *lines) printed_lr |= l.rfind("optimizer.params.lr = 2e-05", 0) == 0;
  EXPECT_TRUE(printed_lr);
}

TEST(ConfigTest, RealZero3ResolvesAutoFromHiddenSize) {
  auto r = LoadConfigFile(DataPath("ds_zero3_hf.json"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Config c = std::move(r).value();
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kWarmupDecayLR);
  EXPECT_EQ(c.scheduler.total_num_steps, 10000);
  EXPECT_EQ(c.optimizer.beta2, 0.95);

  // Without the hidden size the model-dependent keys cannot resolve.
  Config copy = c;
  auto missing = ResolveAuto(copy, AutoContext{});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("zero_optimization.reduce_bucket_size is \"auto\""), std::string::npos);

  AutoContext ctx;
  ctx.hidden_size = 4096;
  ASSERT_TRUE(ResolveAuto(c, ctx).ok());
  EXPECT_EQ(c.zero.reduce_bucket_size, 4096LL * 4096);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 4096LL * 4096 * 9 / 10);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 40960);
  auto batch = ResolveBatchSizes(c, 4);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->train_batch_size, 2 * 4 * 4);
}

TEST(ConfigTest, RealNvmeOffloadLoadsUnchanged) {
  auto r = LoadConfigFile(DataPath("ds_zero3_nvme.json"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Config& c = *r;
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, std::vector<std::string>{"/local_nvme"});
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero.sub_group_size, 100000000);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);  // from the alias thread_count
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  EXPECT_TRUE(c.optimizer.decoupled_weight_decay());  // DeepSpeed: Adam means AdamW unless adam_w_mode is false
  auto batch = ResolveBatchSizes(c, 2);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->gradient_accumulation_steps, 8);
}

TEST(ConfigTest, AdamWModeFalseGivesL2WeightDecay) {
  Config c = MustParse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})");
  EXPECT_FALSE(c.optimizer.decoupled_weight_decay());
}

TEST(ConfigTest, AliasesAndDeprecatedForms) {
  Config c = MustParse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 123, "max_live_parameters": 7,
                           "cpu_offload": true, "stage3_gather_fp16_weights_on_model_save": true},
                           "bfloat16": {"enabled": true}})");
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 123);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 7);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_TRUE(c.bf16.enabled);
  EXPECT_EQ(c.warnings.size(), 2u);  // cpu_offload and the fp16 spelling are deprecated

  Config legacy = MustParse(R"({"zero_optimization": true})");
  EXPECT_EQ(legacy.zero.stage, 1);
}

TEST(ConfigTest, NvmePathMayBeAListForStriping) {
  Config c = MustParse(R"({"zero_optimization": {"stage": 2, "offload_optimizer":
                           {"device": "nvme", "nvme_path": ["/nvme0/zinf", "/nvme1/zinf"]}}})");
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path.size(), 2u);
}

TEST(ConfigTest, ZinfBlock) {
  Config c = MustParse(R"({"zinf": {"device": "cuda:1", "device_memory": "2G", "host_memory": 1073741824,
                           "optimizer_threads": 2, "gradients": "nvme", "checksums": true, "matmul": "bf16",
                           "stop_on_nonfinite_loss": true, "active_offload": true, "offload_zero_copy": false,
                           "attention": "flash", "aio": {"rings": 2, "sqpoll": true, "phased_swaps": false}}})");
  EXPECT_EQ(c.zinf.device, "cuda:1");
  EXPECT_EQ(c.zinf.device_memory, 2ull << 30);
  EXPECT_EQ(c.zinf.host_memory, 1ull << 30);
  EXPECT_EQ(c.zinf.optimizer_threads, 2);
  EXPECT_EQ(c.zinf.gradients, GradientHome::kNvme);
  EXPECT_EQ(MustParse("{}").zinf.gradients, GradientHome::kAuto);
  EXPECT_TRUE(c.zinf.checksums);
  EXPECT_TRUE(c.zinf.stop_on_nonfinite_loss);
  EXPECT_FALSE(MustParse("{}").zinf.stop_on_nonfinite_loss);
  EXPECT_TRUE(c.zinf.active_offload);
  EXPECT_FALSE(MustParse("{}").zinf.active_offload);
  EXPECT_FALSE(c.zinf.offload_zero_copy);
  EXPECT_TRUE(MustParse("{}").zinf.offload_zero_copy);
  EXPECT_NE(c.ToJson().find("\"offload_zero_copy\": false"), std::string::npos) << c.ToJson();
  EXPECT_EQ(c.zinf.aio.rings, 2);
  EXPECT_TRUE(c.zinf.aio.sqpoll);
  EXPECT_FALSE(c.zinf.aio.phased_swaps);
  EXPECT_TRUE(MustParse("{}").zinf.aio.phased_swaps);
  EXPECT_NE(c.ToJson().find("\"phased_swaps\": false"), std::string::npos) << c.ToJson();
  EXPECT_EQ(c.zinf.matmul, DType::kBFloat16);
  EXPECT_EQ(MustParse("{}").zinf.matmul, DType::kFloat32);
  EXPECT_NE(c.ToJson().find("\"matmul\": \"bf16\""), std::string::npos) << c.ToJson();
  EXPECT_EQ(c.zinf.attention, AttentionChoice::kFlash);
  EXPECT_EQ(MustParse("{}").zinf.attention, AttentionChoice::kAuto);
  EXPECT_NE(c.ToJson().find("\"attention\": \"flash\""), std::string::npos) << c.ToJson();
}

TEST(ConfigTest, HarmlessValuesOfUnimplementedKeysAreAccepted) {
  Config c = MustParse(R"({"prescale_gradients": false, "gradient_predivide_factor": 1.0,
                           "communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"},
                           "zero_optimization": {"zero_quantized_weights": false, "mics_shard_size": -1}})");
  EXPECT_TRUE(c.warnings.empty());
}

TEST(ConfigTest, ToJsonRoundTrips) {
  for (const char* file : {"ds_zero2_hf.json", "ds_zero3_hf.json", "ds_zero3_nvme.json"}) {
    auto r = LoadConfigFile(DataPath(file));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::string once = r->ToJson();
    auto again = ParseConfig(once, "roundtrip");
    ASSERT_TRUE(again.ok()) << file << ": " << again.status().ToString() << "\n" << once;
    EXPECT_EQ(again->ToJson(), once) << file;
    EXPECT_EQ(again->auto_keys, r->auto_keys) << file;
  }
}

// Each bad input gets its own precise message: the JSON path, what was
// found, what is accepted.
struct BadCase {
  const char* json;
  const char* expected;  // substring of the message
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.json; }

// "zero_optimization.stage: 4 is ..." -> "zero_optimization_stage_3" (index keeps names unique).
std::string CaseName(const ::testing::TestParamInfo<BadCase>& info) {
  std::string name;
  for (const char* p = info.param.expected; *p && *p != ':' && *p != ' '; ++p)
    name += std::isalnum(static_cast<unsigned char>(*p)) ? *p : '_';
  return name + "_" + std::to_string(info.index);
}

class ConfigBadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ConfigBadInputTest, PreciseMessage) {
  std::string msg = ErrorOf(GetParam().json);
  EXPECT_NE(msg.find(GetParam().expected), std::string::npos) << "message: " << msg;
  EXPECT_EQ(msg.rfind("test.json", 0), 0u) << "message should start with the source: " << msg;
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, ConfigBadInputTest,
    ::testing::Values(
        BadCase{R"({"zero_optimization": {"stage": 4}})",
                "zero_optimization.stage: 4 is out of range; accepted: an integer 0..3"},
        BadCase{R"({"zero_optimization": {"stage": "two"}})",
                "zero_optimization.stage: expected an integer 0..3, found the string \"two\""},
        BadCase{R"({"zero_optimization": {"stage": 2.5}})",
                "zero_optimization.stage: expected an integer 0..3, found the number 2.5"},
        BadCase{R"({"zero_optimization": {"stage3_prefetch_bucket": 5}})",
                "zero_optimization.stage3_prefetch_bucket: unknown key; did you mean \"stage3_prefetch_bucket_size\"?"},
        BadCase{R"({"zero_optimizaton": {}})", "zero_optimizaton: unknown key; did you mean \"zero_optimization\"?"},
        BadCase{R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})",
                "zero_optimization.offload_optimizer.device: expected one of \"none\", \"cpu\", \"nvme\", found the "
                "string \"gpu\""},
        BadCase{R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})",
                "zero_optimization.offload_optimizer.nvme_path: required when offload_optimizer.device is \"nvme\""},
        BadCase{R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
                "zero_optimization.offload_param: parameter offload needs stage 3 (stage is 2)"},
        BadCase{R"({"zero_optimization": {"overlap_comm": "yes"}})",
                "zero_optimization.overlap_comm: expected true, false or null, found the string \"yes\""},
        BadCase{R"({"zero_optimization": {"reduce_bucket_size": -1}})",
                "zero_optimization.reduce_bucket_size: -1 is out of range; accepted: an integer >= 0"},
        BadCase{R"({"zero_optimization": {"stage3_prefetch_bucket_size": 1, "prefetch_bucket_size": 2}})",
                "zero_optimization.prefetch_bucket_size: same setting as \"stage3_prefetch_bucket_size\""},
        BadCase{R"({"zero_optimization": {"zero_quantized_gradients": true}})",
                "zero_optimization.zero_quantized_gradients: zinf does not implement quantized gradient communication"},
        BadCase{R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})",
                "fp16.enabled and bf16.enabled are both true"},
        BadCase{R"({"fp16": {"min_loss_scale": 0}})",
                "fp16.min_loss_scale: 0 is out of range; accepted: a number in (0, "},
        BadCase{R"({"optimizer": {"type": "Lamb", "params": {"lr": 0.1}}})",
                "optimizer.type: zinf implements \"Adam\" and \"AdamW\"; the string \"Lamb\" would train differently"},
        BadCase{R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})",
                "optimizer.params.betas: expected [beta1, beta2] with each in [0, 1), found the array [0.9]"},
        BadCase{R"({"optimizer": {"type": "AdamW", "params": {"lr": "fast"}}})",
                "optimizer.params.lr: expected a number in [0, inf], found the string \"fast\""},
        BadCase{R"({"scheduler": {"type": "OneCycle", "params": {}}})",
                "scheduler.type: expected one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\", found the string "
                "\"OneCycle\""},
        BadCase{R"({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10}}})",
                "scheduler.params.total_num_steps: required by WarmupCosineLR"},
        BadCase{R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})",
                "scheduler.params.cos_min_ratio: unknown key"},
        BadCase{R"({"aio": {"block_size": 1000000}})", "aio.block_size: 1000000 is not a multiple of 4096"},
        BadCase{R"({"aio": {"queue_depth": 0}})", "aio.queue_depth: 0 is out of range; accepted: an integer 1..32768"},
        BadCase{R"({"aio": {"block_size": "auto"}})", "aio.block_size: \"auto\" is not accepted here"},
        BadCase{R"({"prescale_gradients": true})",
                "prescale_gradients: zinf does not implement gradient pre-scaling, and ignoring it would change the "
                "result; remove it or set false"},
        BadCase{R"({"communication_data_type": "fp16"})",
                "communication_data_type: zinf does not implement reduced-precision"},
        BadCase{R"({"gradient_clipping": -1})", "gradient_clipping: -1 is out of range"},
        BadCase{R"({"train_micro_batch_size_per_gpu": 0})",
                "train_micro_batch_size_per_gpu: 0 is out of range; accepted: an integer >= 1"},
        BadCase{R"({"zinf": {"device": "tpu"}})",
                "zinf.device: expected \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", found the string \"tpu\""},
        BadCase{R"({"zinf": {"device_memory": "4Q"}})", "zinf.device_memory: invalid size '4Q'"},
        BadCase{R"({"zinf": {"gradients": "disk"}})",
                "zinf.gradients: expected one of \"auto\", \"host\", \"nvme\", found the string \"disk\""},
        BadCase{R"({"zinf": {"matmul": "fp16"}})",
                "zinf.matmul: expected one of \"fp32\", \"bf16\", found the string \"fp16\""},
        BadCase{R"({"zinf": {"attention": "sparse"}})",
                "zinf.attention: expected one of \"auto\", \"plain\", \"flash\", found the string \"sparse\""},
        BadCase{R"({"zinf": {"frobnicate": 1}})",
                "zinf.frobnicate: unknown key; accepted keys here: active_offload, aio, attention, checksums, "
                "comm_timeout_s, device"},
        BadCase{R"({"zero_optimization": {"stage": 1, "stage": 2}})",
                "zero_optimization.stage: key appears more than once"},
        BadCase{R"([1, 2])", "the top level must be a JSON object, found the array [1,2]"},
        BadCase{"{\n  \"zero_optimization\": {\n    \"stage\": 2,\n  }\n}", "test.json:4:3: malformed JSON"},
        BadCase{"{\"a\": tru}", "test.json:1:10: malformed JSON: syntax error while parsing value - invalid literal"}),
    CaseName);

TEST(ConfigTest, SeveralProblemsAreReportedTogether) {
  std::string msg = ErrorOf(R"({"zero_optimization": {"stage": 9, "reduce_bucket_size": "big"}, "fp17": {}})");
  EXPECT_NE(msg.find("3 problems"), std::string::npos) << msg;
  EXPECT_NE(msg.find("zero_optimization.stage"), std::string::npos);
  EXPECT_NE(msg.find("zero_optimization.reduce_bucket_size"), std::string::npos);
  EXPECT_NE(msg.find("fp17: unknown key; did you mean \"fp16\"?"), std::string::npos);
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line, as every tool error";
}

TEST(ConfigTest, MissingFileIsNotFoundNamingThePath) {
  auto r = LoadConfigFile("/nonexistent/ds.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/ds.json"), std::string::npos);
}

TEST(BatchSizesTest, DeepSpeedTriangle) {
  Config c;
  c.train_batch_size = 32;
  c.train_micro_batch_size_per_gpu = 4;
  auto b = ResolveBatchSizes(c, 2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->gradient_accumulation_steps, 4);

  c.gradient_accumulation_steps = 3;  // 4 * 3 * 2 = 24 != 32
  auto bad = ResolveBatchSizes(c, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("train_batch_size 32 != train_micro_batch_size_per_gpu 4 x "
                                        "gradient_accumulation_steps 3 x world size 2 = 24"),
            std::string::npos)
      << bad.status().message();

  Config only_total;
  only_total.train_batch_size = 30;
  EXPECT_FALSE(ResolveBatchSizes(only_total, 4).ok());  // 30 is not divisible by 4 ranks
  auto ok = ResolveBatchSizes(only_total, 3);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->micro_batch_size, 10);

  Config none;
  auto defaults = ResolveBatchSizes(none, 4);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->train_batch_size, 4);
  EXPECT_FALSE(ResolveBatchSizes(none, 0).ok());
}

}  // namespace
}  // namespace zinf

namespace zinf {
namespace {

// Inputs that crashed the reader (the issue "Inputs that never crash"): each
// is now an InvalidArgument naming the file and the key.
TEST(ConfigInputTest, NumberBeyondDoubleNamesTheKey) {
  const std::string msg = ErrorOf(R"({"train_micro_batch_size_per_gpu": 4e308})");
  EXPECT_EQ(msg.rfind("test.json:1:", 0), 0u) << msg;
  EXPECT_NE(msg.find("number overflow parsing '4e308' (at train_micro_batch_size_per_gpu)"), std::string::npos) << msg;
}

TEST(ConfigInputTest, DeepNestingIsRejected) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_EQ(ErrorOf(deep), "test.json:1:65: JSON nests deeper than 64 levels");
  // Within the limit, but deep: the message's rendering of the value is cut.
  const std::string msg = ErrorOf("{\"zinf\": " + std::string(60, '[') + std::string(60, ']') + "}");
  EXPECT_NE(msg.find("zinf: expected an object, found the array [[[[["), std::string::npos) << msg;
}

TEST(ConfigInputTest, ManyProblemsAreCountedNotAllListed) {
  std::string text = "{";
  for (int i = 0; i < 5000; ++i) text += (i ? ",\"" : "\"") + std::string(300, 'k') + std::to_string(i) + "\": 1";
  text += "}";
  const std::string msg = ErrorOf(text);
  EXPECT_NE(msg.find("5000 problems:"), std::string::npos) << msg.substr(0, 200);
  EXPECT_NE(msg.find("; and 4980 more"), std::string::npos);
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_LT(msg.size(), 200000u);
}

TEST(ConfigInputTest, ManyDuplicateKeysAreOneProblemEach) {
  std::string text = "{\"zero_optimization\": {";
  for (int i = 0; i < 100000; ++i) text += std::string(i ? "," : "") + "\"stage\": 1";
  text += "}}";
  const std::string msg = ErrorOf(text);
  EXPECT_NE(msg.find("zero_optimization.stage: key appears more than once"), std::string::npos) << msg.substr(0, 300);
}

TEST(ConfigInputTest, AutoFromAHugeHiddenSizeIsAnErrorNotAnOverflow) {
  Config c =
      MustParse(R"({"zero_optimization": {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}})");
  AutoContext ctx;
  ctx.hidden_size = int64_t{3037000500};  // its square overflows int64
  auto r = ResolveAuto(c, ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("a hidden size of 3037000500 is above"), std::string::npos)
      << r.status().message();
}

TEST(BatchSizesTest, ProductsBeyondInt64AreAnError) {
  Config c = MustParse(R"({"train_micro_batch_size_per_gpu": 9000000000000000000, "gradient_accumulation_steps": 4})");
  auto r = ResolveBatchSizes(c, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("multiply beyond 2^63"), std::string::npos) << r.status().message();
  c = MustParse(R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4611686018427387904})");
  EXPECT_FALSE(ResolveBatchSizes(c, 4).ok());
  // Values set in code are checked too (no division by zero).
  c = Config{};
  c.train_batch_size = 8;
  c.train_micro_batch_size_per_gpu = 0;
  EXPECT_FALSE(ResolveBatchSizes(c, 1).ok());
}

}  // namespace
}  // namespace zinf
