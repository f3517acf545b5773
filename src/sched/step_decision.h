// The step decision: from a boundary's gradient norm partials to what every
// update of that boundary does (skip or apply, the clipping coefficient, the
// loss scale and its next value, the learning rate and the Adam options of
// the step). Every rank holds the same partials after their all-gather and
// the same scaler and step count, so every rank decides the same.
//
// Owns the loss scaler and the count of applied steps. Runs where the
// engine's boundary runs it: a task on the engine stream (HostDevice) or the
// host after the partials were read back (CUDA). Waits for nothing.
// Thread-safety: none; the engine calls it under its own lock.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/adam.h"
#include "sched/loss_scaler.h"
#include "sched/lr_schedule.h"

namespace zinf::sched {

// The decision of one boundary, read by the update tasks after it.
struct Decision {
  bool skip = false;
  cpu::AdamOptions adam{};  // with the step's lr
  double grad_scale = 1;    // clipping, 1/loss_scale and the mean, folded
  double loss_scale = 1, next_loss_scale = 1, lr = 0, grad_norm = 0, clip_coef = 1;
};

// Where each unit's norm partials sit: rank-major regions of
// blocks_per_rank doubles, unit i's blocks at unit_block_offset[i] of each
// region, unit_blocks[i] of them (its owned blocks).
struct NormPartialsLayout {
  int regions = 1;  // stage 0: one (each rank holds the whole unit); else the world size
  int64_t blocks_per_rank = 0;
  std::vector<int64_t> unit_block_offset, unit_blocks;
};

// The sum of the partials in the global block order: unit by unit, inside a
// unit rank by rank (the shards' order), block by block — the order of the
// unsharded unit, so any world size sums the same doubles in the same order.
double SumNormPartials(const double* partials, const NormPartialsLayout& layout);

class StepDecision {
 public:
  // gradient_clipping <= 0: none. The mean divides by world × accumulation.
  StepDecision(LrSchedule schedule, LossScaler scaler, cpu::AdamOptions adam, double gradient_clipping, int world,
               int64_t accumulation);

  // One boundary: `sum_of_squares` of the summed (scaled) gradients over
  // every element. A non-finite sum skips the step; the loss scaler takes
  // the verdict; an applied step counts.
  Decision Decide(double sum_of_squares);
  // What Decide will answer for the next boundary when nothing depends on
  // its norm (no clipping, a constant loss scale of 1) and the norm is
  // finite: the updates of zinf.active_offload start with it. Changes
  // nothing.
  Decision Predecide() const;

  const LrSchedule& schedule() const { return schedule_; }
  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }
  int64_t steps_applied() const { return steps_applied_; }
  void set_steps_applied(int64_t steps) { steps_applied_ = steps; }  // a checkpoint's

 private:
  const LrSchedule schedule_;
  LossScaler scaler_;
  const cpu::AdamOptions adam_;
  const double clipping_;
  const double world_, accumulation_;  // the mean's divisors
  int64_t steps_applied_ = 0;
};

}  // namespace zinf::sched
