// The fp16 loss scale, with the semantics of DeepSpeed's DynamicLossScaler
// (deepspeed/runtime/fp16/loss_scaler.py). The loss is multiplied by scale()
// before backward; after the step's overflow check every rank calls Update
// with the same (all-reduced) verdict, so the scale stays identical on all ranks.
//
// Dynamic mode: the scale starts at 2^initial_scale_power. An overflow step
// is skipped; it halves the scale (never below min_loss_scale) only once
// `hysteresis` overflows have used up the hysteresis budget, otherwise it
// spends one unit of it. A step without overflow restores the budget when
// consecutive_hysteresis is set, and doubles the scale when the number of
// Update calls since the last overflow (or since the start) is a multiple of
// loss_scale_window, restoring the budget then as well. DeepSpeed by default
// raises when an overflow hits a scale already at min_loss_scale; zinf keeps
// the scale there and leaves that policy to the caller.
//
// Thread-safety: none; one owner calls Update.
#pragma once

#include <cstdint>
#include <string>

#include "zinf/config.h"
#include "zinf/status.h"

namespace zinf::sched {

class LossScaler {
 public:
  // fp16 disabled: static scale 1. fp16.loss_scale > 0: that static scale.
  // loss_scale 0: dynamic, factor 2. kInvalidArgument naming the key for
  // values outside: loss_scale >= 0, initial_scale_power in [0, 64],
  // loss_scale_window >= 1, hysteresis >= 1, min_loss_scale > 0.
  static Result<LossScaler> Create(const Fp16Config& config);

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }

  // Records one step's overflow verdict. Returns true when the scale changed.
  // A static scaler only counts overflows.
  bool Update(bool overflow);

  int64_t overflows() const { return overflows_; }  // total overflow steps seen

  // What a checkpoint keeps: everything that changes after Create.
  struct State {
    double scale = 1;
    int64_t cur_hysteresis = 1, iter = 0, last_overflow_iter = -1, overflows = 0;
  };
  State state() const { return {scale_, cur_hysteresis_, iter_, last_overflow_iter_, overflows_}; }
  void Restore(const State& s) {
    scale_ = s.scale;
    cur_hysteresis_ = s.cur_hysteresis;
    iter_ = s.iter;
    last_overflow_iter_ = s.last_overflow_iter;
    overflows_ = s.overflows;
  }

  // One line, e.g. "dynamic loss scale 65536 (initial 2^16), window 1000, hysteresis 2, min 1".
  std::string Describe() const;

 private:
  LossScaler() = default;

  bool dynamic_ = false;
  double scale_ = 1;
  int64_t initial_scale_power_ = 0;
  int64_t window_ = 1;
  int64_t hysteresis_ = 1;      // DeepSpeed's delayed_shift
  int64_t cur_hysteresis_ = 1;  // overflows left before the next halving
  bool consecutive_hysteresis_ = false;
  double min_scale_ = 1;
  int64_t iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int64_t overflows_ = 0;
};

}  // namespace zinf::sched
