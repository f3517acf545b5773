// The learning rate of every optimizer step, from the config's "scheduler"
// block and the optimizer's lr, with the semantics of DeepSpeed's
// deepspeed/runtime/lr_schedules.py (WarmupLR, WarmupDecayLR, WarmupCosineLR).
//
// Step index: as DeepSpeed's engine applies its schedulers (DeepSpeed
// 0.19.8). The scheduler's constructor sets the lr of its
// last_batch_iteration -1 (WarmupLR and WarmupDecayLR: warmup_min_lr;
// WarmupCosineLR: ratio 0, so lr 0), the first optimizer step runs with it,
// and the engine steps the scheduler after every successful (non-overflow)
// optimizer step. So the step that follows `completed_steps` successful steps
// runs at index completed_steps - 1: steps 1 and 2 both at the warmup's start
// (min lr) for WarmupLR, and at lr 0 then warmup_min_ratio for
// WarmupCosineLR. A script run with DeepSpeed and with zinf sees the same lr
// at every step.
//
// Differences from DeepSpeed, all on inputs it only warns about or crashes
// on: Create rejects total_num_steps <= the effective warmup length for the
// decaying schedules, negative steps, negative or non-finite rates and ratios
// outside [0, 1]. Past total_num_steps WarmupDecayLR stays at warmup_min_lr
// and WarmupCosineLR at cos_min_ratio, as DeepSpeed's do.
//
// Thread-safety: immutable after Create; LrAt is pure.
#pragma once

#include <cstdint>
#include <string>

#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::sched {

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

}  // namespace zinf::sched
