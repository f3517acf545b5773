// A DeepSpeed config (config.cc): any text is a Config or an
// InvalidArgument naming the file; a Config then goes through everything a
// tool does with one: "auto" resolved from contexts up to absurd hidden
// sizes, the batch triangle for several world sizes, and ToJson, whose
// output must load again.
#include <cstdint>
#include <limits>

#include "fuzz_util.h"
#include "zinf/config.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zinf::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zinf;
  auto parsed = ParseConfig(fuzz::AsText(data, size), "fuzz.json");
  if (!parsed.ok()) {
    fuzz::CheckRejection(parsed.status(), "fuzz.json");
    return 0;
  }
  // What the file says, written back, must load again.
  auto again = ParseConfig(parsed->ToJson(), "tojson.json");
  ZINF_FUZZ_CHECK(again.ok(), again.status().message());
  for (int64_t hidden :
       {int64_t{0}, int64_t{64}, int64_t{8192}, int64_t{3037000500}, std::numeric_limits<int64_t>::max()}) {
    Config c = *parsed;
    AutoContext ctx;
    if (hidden > 0) ctx.hidden_size = hidden;
    ctx.micro_batch_size = hidden > 64 ? std::optional<int64_t>(hidden) : std::nullopt;
    ctx.total_num_steps = hidden > 0 ? std::optional<int64_t>(hidden) : std::nullopt;
    ctx.lr = 1e-3;
    ctx.min_reduce_bucket_elems = 65536;
    auto resolved = ResolveAuto(c, ctx);
    if (!resolved.ok()) fuzz::CheckRejection(resolved.status(), "fuzz.json");
    for (int64_t world : {int64_t{1}, int64_t{3}, int64_t{1} << 20, std::numeric_limits<int64_t>::max()}) {
      auto batch = ResolveBatchSizes(c, world);
      if (batch.ok()) {
        ZINF_FUZZ_CHECK(batch->micro_batch_size >= 1 && batch->gradient_accumulation_steps >= 1, "batch sizes < 1");
      }
    }
    (void)c.ToJson(2);
  }
  return 0;
}
