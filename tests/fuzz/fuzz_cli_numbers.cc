// The size and count arguments of the CLI (units.cc): --size 4G,
// --device-memory 1.5GiB, --params 1.5B, --sub-group-size 1e9. Any text is a
// number or an InvalidArgument quoting it; a number prints and parses back;
// a parameter count goes through what zinf config check --params does with
// it (the model state per rank of every stage and offload).
#include <string>

#include "common/units.h"
#include "fuzz_util.h"
#include "sched/state_bytes.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zinf;
  const std::string_view text = fuzz::AsText(data, size);
  auto bytes = ParseSize(text);
  if (bytes.ok()) {
    (void)FormatBytes(*bytes);
    auto back = ParseSize(std::to_string(*bytes));
    ZINF_FUZZ_CHECK(back.ok() && *back == *bytes, std::to_string(*bytes) + " does not parse back");
  } else {
    ZINF_FUZZ_CHECK(bytes.status().message().rfind("invalid size '", 0) == 0, bytes.status().message());
  }
  auto count = ParseCount(text);
  if (count.ok()) {
    (void)FormatCount(static_cast<double>(*count));
    auto back = ParseCount(std::to_string(*count));
    ZINF_FUZZ_CHECK(back.ok() && *back == *count, std::to_string(*count) + " does not parse back");
  } else {
    ZINF_FUZZ_CHECK(count.status().message().rfind("invalid count '", 0) == 0, count.status().message());
  }
  auto params = ParseParamCount(text);
  if (!params.ok()) return 0;
  ZINF_FUZZ_CHECK(count.ok() && *params >= 1 && *params <= kMaxParamCount, "ParseParamCount beyond its bounds");
  for (int64_t world : {int64_t{1}, int64_t{7}, int64_t{1} << 20}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (OffloadDevice opt : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
        for (OffloadDevice param : {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
          const sched::StateBytes s = sched::ModelStateBytes(*params, world, stage, opt, param);
          // zinf config check prints these as uint64 byte counts.
          for (double b : {s.device, s.host, s.nvme}) {
            ZINF_FUZZ_CHECK(b >= 0 && b < 18446744073709551616.0, "state bytes beyond uint64");
            (void)FormatBytes(static_cast<uint64_t>(b));
          }
        }
      }
    }
  }
  return 0;
}
