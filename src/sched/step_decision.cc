#include "sched/step_decision.h"

#include <cmath>
#include <utility>

#include "common/logging.h"

namespace zinf::sched {

double SumNormPartials(const double* partials, const NormPartialsLayout& layout) {
  double total = 0;
  for (size_t i = 0; i < layout.unit_blocks.size(); ++i) {
    for (int r = 0; r < layout.regions; ++r) {
      const double* p = partials + r * layout.blocks_per_rank + layout.unit_block_offset[i];
      for (int64_t b = 0; b < layout.unit_blocks[i]; ++b) total += p[b];
    }
  }
  return total;
}

StepDecision::StepDecision(LrSchedule schedule, LossScaler scaler, cpu::AdamOptions adam, double gradient_clipping,
                           int world, int64_t accumulation)
    : schedule_(std::move(schedule)),
      scaler_(std::move(scaler)),
      adam_(adam),
      clipping_(gradient_clipping),
      world_(static_cast<double>(world)),
      accumulation_(static_cast<double>(accumulation)) {}

Decision StepDecision::Predecide() const {
  Decision d;
  d.loss_scale = d.next_loss_scale = scaler_.scale();
  const double mean_div = d.loss_scale * world_ * accumulation_;
  d.lr = schedule_.LrAt(steps_applied_);
  d.adam = adam_;
  d.adam.lr = d.lr;
  d.grad_scale = d.clip_coef / mean_div;
  return d;
}

Decision StepDecision::Decide(double sum_of_squares) {
  Decision d;
  d.loss_scale = scaler_.scale();
  const double mean_div = d.loss_scale * world_ * accumulation_;
  d.grad_norm = std::sqrt(sum_of_squares) / mean_div;
  d.skip = !std::isfinite(sum_of_squares);
  if (!d.skip && clipping_ > 0) {
    const double c = clipping_ / (d.grad_norm + 1e-6);
    if (c < 1) d.clip_coef = c;
  }
  d.lr = schedule_.LrAt(steps_applied_);
  d.adam = adam_;
  d.adam.lr = d.lr;
  d.grad_scale = d.clip_coef / mean_div;
  if (!d.skip) {
    // Options were validated at the engine's Create; a schedule's lr cannot be bad.
    if (auto c = cpu::MakeAdamStepConstants(d.adam, steps_applied_ + 1, d.grad_scale); !c.ok()) {
      ZINF_LOG_ERROR("engine: {}", c.status().ToString());
      d.skip = true;
    }
  }
  scaler_.Update(d.skip);
  d.next_loss_scale = scaler_.scale();
  if (!d.skip) ++steps_applied_;
  return d;
}

}  // namespace zinf::sched
