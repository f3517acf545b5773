// DeepSpeed's lr schedules (deepspeed/runtime/lr_schedules.py), restated:
//  - Every warmup clamps warmup_num_steps W to at least 2 (log(1) = 0 would
//    divide by zero) and, for step s < W, uses gamma = log(s + 1) / log(W)
//    ("log") or s / W ("linear"); from s = W on the warmup is over.
//  - WarmupLR: min + (max - min) * gamma, then max.
//  - WarmupDecayLR: after warmup gamma = max(0, (T - s) / max(1, T - W)), so
//    max at s = W falling linearly to min at s = T.
//  - WarmupCosineLR scales the optimizer's own lr by a ratio: warmup_min_ratio
//    + (1 - warmup_min_ratio) * gamma while warming up; afterwards, with
//    p = min(1, (s - W + 1) / max(1, T - W)), max(0, cos_min + (1 - cos_min) *
//    (1 + cos(pi p)) / 2). The "+ 1" means the first post-warmup step is
//    already one cosine step in; the ratio reaches cos_min_ratio at s = T - 1
//    and stays there.
#include "sched/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <sstream>

#include "common/check.h"

namespace zinf::sched {
namespace {

bool IsWarmup(SchedulerType t) { return t != SchedulerType::kNone; }
bool Decays(SchedulerType t) { return t == SchedulerType::kWarmupDecayLR || t == SchedulerType::kWarmupCosineLR; }

Status Bad(const std::string& key, const std::string& why) { return InvalidArgument(key + ": " + why); }

std::string Num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

Result<LrSchedule> LrSchedule::Create(const SchedulerConfig& config, double optimizer_lr) {
  const std::string p = "scheduler.params.";
  if (!std::isfinite(optimizer_lr) || optimizer_lr < 0) {
    return Bad("optimizer.params.lr", "must be a finite value >= 0, got " + Num(optimizer_lr));
  }
  if (!IsWarmup(config.type)) return LrSchedule(config, optimizer_lr, 0);
  if (config.warmup_num_steps < 0) {
    return Bad(p + "warmup_num_steps", "must be >= 0, got " + std::to_string(config.warmup_num_steps));
  }
  const int64_t warmup = std::max<int64_t>(2, config.warmup_num_steps);
  if (config.type == SchedulerType::kWarmupCosineLR) {
    for (auto [key, v] :
         {std::pair{"warmup_min_ratio", config.warmup_min_ratio}, std::pair{"cos_min_ratio", config.cos_min_ratio}}) {
      if (!(v >= 0 && v <= 1)) return Bad(p + key, "must be in [0, 1], got " + Num(v));
    }
  } else {
    for (auto [key, v] :
         {std::pair{"warmup_min_lr", config.warmup_min_lr}, std::pair{"warmup_max_lr", config.warmup_max_lr}}) {
      if (!std::isfinite(v) || v < 0) return Bad(p + key, "must be a finite value >= 0, got " + Num(v));
    }
  }
  if (Decays(config.type) && config.total_num_steps <= warmup) {
    return Bad(p + "total_num_steps", "must be greater than the warmup length " + std::to_string(warmup) +
                                          " (warmup_num_steps, at least 2), got " +
                                          std::to_string(config.total_num_steps));
  }
  return LrSchedule(config, optimizer_lr, warmup);
}

double LrSchedule::WarmupGamma(int64_t step) const {
  const double s = static_cast<double>(step), w = static_cast<double>(warmup_steps_);
  return config_.warmup_type == WarmupType::kLog ? std::log(s + 1) / std::log(w) : s / w;
}

double LrSchedule::LrAt(int64_t completed_steps) const {
  ZINF_CHECK(completed_steps >= 0);
  // DeepSpeed's last_batch_iteration for this step: its engine steps the
  // scheduler after each optimizer step, from -1 (see the header).
  const int64_t s = completed_steps - 1;
  const double min = config_.warmup_min_lr, max = config_.warmup_max_lr;
  const double w = static_cast<double>(warmup_steps_), t = static_cast<double>(config_.total_num_steps);
  if (config_.type != SchedulerType::kNone && s < 0) {
    // What the constructor put in the optimizer: get_lr() at -1, the
    // warmup's min lr, or ratio 0 for the cosine schedule.
    return config_.type == SchedulerType::kWarmupCosineLR ? 0.0 : min;
  }
  switch (config_.type) {
    case SchedulerType::kNone:
      return optimizer_lr_;
    case SchedulerType::kWarmupLR:
      return s < warmup_steps_ ? min + (max - min) * WarmupGamma(s) : max;
    case SchedulerType::kWarmupDecayLR: {
      if (s < warmup_steps_) return min + (max - min) * WarmupGamma(s);
      const double gamma = std::max(0.0, (t - static_cast<double>(s)) / std::max(1.0, t - w));
      return min + (max - min) * gamma;
    }
    case SchedulerType::kWarmupCosineLR: {
      double ratio;
      if (s < warmup_steps_) {
        ratio = config_.warmup_min_ratio + (1 - config_.warmup_min_ratio) * WarmupGamma(s);
      } else {
        const double progress = std::min(1.0, (static_cast<double>(s) - w + 1) / std::max(1.0, t - w));
        const double cosine = (1 + std::cos(std::numbers::pi * progress)) / 2;
        ratio = std::max(0.0, config_.cos_min_ratio + (1 - config_.cos_min_ratio) * cosine);
      }
      return optimizer_lr_ * ratio;
    }
  }
  ZINF_CHECK(false);
  return 0;
}

std::string LrSchedule::Describe() const {
  const std::string name(SchedulerTypeName(config_.type));
  if (config_.type == SchedulerType::kNone) return "constant lr " + Num(optimizer_lr_);
  const std::string kind = config_.warmup_type == WarmupType::kLog ? "log" : "linear";
  const std::string over = " over " + std::to_string(warmup_steps_) + " steps";
  if (config_.type == SchedulerType::kWarmupCosineLR) {
    return name + " lr " + Num(optimizer_lr_) + " x ratio " + kind + " " + Num(config_.warmup_min_ratio) + " -> 1" +
           over + ", cosine to " + Num(config_.cos_min_ratio) + " at step " + std::to_string(config_.total_num_steps);
  }
  std::string out = name + " " + kind + " " + Num(config_.warmup_min_lr) + " -> " + Num(config_.warmup_max_lr) + over;
  if (config_.type == SchedulerType::kWarmupDecayLR) {
    out += ", linear decay to " + Num(config_.warmup_min_lr) + " at step " + std::to_string(config_.total_num_steps);
  }
  return out;
}

}  // namespace zinf::sched
