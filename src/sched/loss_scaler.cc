// DeepSpeed's DynamicLossScaler.update_scale, restated. It keeps cur_iter
// (incremented on every call, overflow or not) and last_overflow_iter
// (initially -1). On overflow: if delayed_shift == 1 or the hysteresis
// counter is 1, scale = max(scale / 2, min_scale); otherwise the counter
// drops by one; either way last_overflow_iter = cur_iter. Without overflow:
// consecutive_hysteresis resets the counter; if (cur_iter -
// last_overflow_iter) % window == 0 the scale doubles, and without
// consecutive_hysteresis the counter resets there. Note that with
// last_overflow_iter = -1 the first doubling comes on call number `window`.
#include "sched/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace zinf::sched {
namespace {

std::string Num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

Result<LossScaler> LossScaler::Create(const Fp16Config& config) {
  LossScaler s;
  if (!config.enabled) return s;
  if (!std::isfinite(config.loss_scale) || config.loss_scale < 0) {
    return InvalidArgument("fp16.loss_scale: must be 0 (dynamic) or a finite value > 0, got " + Num(config.loss_scale));
  }
  if (config.loss_scale > 0) {
    s.scale_ = config.loss_scale;
    return s;
  }
  if (config.initial_scale_power < 0 || config.initial_scale_power > 64) {
    return InvalidArgument("fp16.initial_scale_power: must be in [0, 64], got " +
                           std::to_string(config.initial_scale_power));
  }
  if (config.loss_scale_window < 1) {
    return InvalidArgument("fp16.loss_scale_window: must be >= 1, got " + std::to_string(config.loss_scale_window));
  }
  if (config.hysteresis < 1) {
    return InvalidArgument("fp16.hysteresis: must be >= 1, got " + std::to_string(config.hysteresis));
  }
  if (!std::isfinite(config.min_loss_scale) || config.min_loss_scale <= 0) {
    return InvalidArgument("fp16.min_loss_scale: must be a finite value > 0, got " + Num(config.min_loss_scale));
  }
  s.dynamic_ = true;
  s.initial_scale_power_ = config.initial_scale_power;
  s.scale_ = std::ldexp(1.0, static_cast<int>(config.initial_scale_power));
  s.window_ = config.loss_scale_window;
  s.hysteresis_ = s.cur_hysteresis_ = config.hysteresis;
  s.consecutive_hysteresis_ = config.consecutive_hysteresis;
  s.min_scale_ = config.min_loss_scale;
  return s;
}

bool LossScaler::Update(bool overflow) {
  if (overflow) ++overflows_;
  if (!dynamic_) return false;
  const double before = scale_;
  if (overflow) {
    if (hysteresis_ == 1 || cur_hysteresis_ == 1) {
      scale_ = std::max(scale_ / 2, min_scale_);
    } else {
      --cur_hysteresis_;
    }
    last_overflow_iter_ = iter_;
  } else {
    if (consecutive_hysteresis_) cur_hysteresis_ = hysteresis_;
    if ((iter_ - last_overflow_iter_) % window_ == 0) {
      if (!consecutive_hysteresis_) cur_hysteresis_ = hysteresis_;
      scale_ *= 2;
    }
  }
  ++iter_;
  return scale_ != before;
}

std::string LossScaler::Describe() const {
  if (!dynamic_) return "static loss scale " + Num(scale_);
  std::string out = "dynamic loss scale " + Num(scale_) + " (initial 2^" + std::to_string(initial_scale_power_) +
                    "), window " + std::to_string(window_) + ", hysteresis " + std::to_string(hysteresis_);
  if (consecutive_hysteresis_) out += " (consecutive)";
  return out + ", min " + Num(min_scale_);
}

}  // namespace zinf::sched
