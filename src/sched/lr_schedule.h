// The learning rate of every optimizer step, from the config's "scheduler"
// block and the optimizer's lr, with the semantics of DeepSpeed's
// deepspeed/runtime/lr_schedules.py (WarmupLR, WarmupDecayLR, WarmupCosineLR).
//
// Step index. DeepSpeed evaluates its formulas at `last_batch_iteration` and
// advances it once per successful (non-overflow) optimizer step, after that
// step. zinf evaluates the same formulas at `completed_steps`, the number of
// successful steps before the one being taken, so the first optimizer step
// uses index 0 (the warmup start: warmup_min_lr, or optimizer lr *
// warmup_min_ratio). DeepSpeed's engine lags one step behind this, because it
// steps the scheduler after the optimizer: its step k uses index k - 1, and
// its first step runs with whatever lr the scheduler left at construction
// (0 where the constructor applies get_lr() at index -1, as WarmupCosineLR
// does; the optimizer's own lr where it applies nothing).
//
// Differences from DeepSpeed, all on inputs it only warns about or crashes
// on: Create rejects total_num_steps <= the effective warmup length for the
// decaying schedules, negative steps, negative or non-finite rates and ratios
// outside [0, 1]. Past total_num_steps WarmupDecayLR stays at warmup_min_lr,
// while WarmupCosineLR, like DeepSpeed's, follows the cosine back up.
//
// Thread-safety: immutable after Create; LrAt is pure.
#pragma once

#include <cstdint>
#include <string>

#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf {

class LrSchedule {
 public:
  // kInvalidArgument naming the key ("scheduler.params.total_num_steps",
  // "optimizer.params.lr", ...) for values the schedule cannot use.
  static Result<LrSchedule> Create(const SchedulerConfig& config, double optimizer_lr);

  // lr for the optimizer step that follows `completed_steps` (>= 0) successful
  // steps; 0 for the first step.
  double LrAt(int64_t completed_steps) const;

  // One line, e.g. "WarmupLR log 0 -> 0.001 over 1000 steps".
  std::string Describe() const;

 private:
  LrSchedule(const SchedulerConfig& config, double optimizer_lr, int64_t warmup_steps)
      : config_(config), optimizer_lr_(optimizer_lr), warmup_steps_(warmup_steps) {}

  // DeepSpeed's warmup fraction in [0, 1) for step < warmup_steps_.
  double WarmupGamma(int64_t step) const;

  SchedulerConfig config_;
  double optimizer_lr_;
  int64_t warmup_steps_;  // warmup_num_steps clamped to >= 2, as DeepSpeed does
};

}  // namespace zinf
