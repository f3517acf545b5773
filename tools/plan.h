// `zinf plan`: bytes per tier per rank and the predicted step time for every
// ZeRO stage × offload combination (tools/plan.cc over src/sched/plan.h).
#pragma once

namespace CLI {
class App;
}

namespace zinf::tools {

// Adds `plan` to `app`; when it runs it stores its exit code in *exit_code
// (0 done, 2 bad input).
void RegisterPlan(CLI::App& app, int* exit_code);

}  // namespace zinf::tools
