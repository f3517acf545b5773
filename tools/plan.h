// `zinf plan`: bytes per tier per rank and the predicted step time for every
// ZeRO stage × offload combination (tools/plan.cc over src/sched/plan.h).
#pragma once

#include <string>
#include <vector>

#include "sched/plan.h"
#include "zinf/status.h"

namespace CLI {
class App;
}

namespace zinf::tools {

// The plan's rates as `zinf plan` and `zinf train` take them: files that
// zinf's benchmarks printed, and two bandwidths.
struct PlanRateFlags {
  std::string adam_json, model_json;
  std::vector<std::string> aio_json;
  double copy_gbps = 0, comm_gbps = 0;
  bool any() const {
    return !adam_json.empty() || !model_json.empty() || !aio_json.empty() || copy_gbps > 0 || comm_gbps > 0;
  }
};
void AddPlanRateOptions(CLI::App* cmd, PlanRateFlags& flags);
// Sets `rates` from the flags; an unreadable or malformed file or a negative
// bandwidth is InvalidArgument naming the flag.
Status ApplyPlanRateFlags(const PlanRateFlags& flags, sched::PlanRates& rates);

// Adds `plan` to `app`; when it runs it stores its exit code in *exit_code
// (0 done, 2 bad input).
void RegisterPlan(CLI::App& app, int* exit_code);

}  // namespace zinf::tools
