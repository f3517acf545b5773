#include "model/op_profile.h"

#include <utility>

namespace zinf::model {

void HostOpProfile::Close(Clock::time_point now) {
  if (op_) seconds_[op_] += std::chrono::duration<double>(now - since_).count();
  op_ = nullptr;
}

void HostOpProfile::Mark(const char* op) {
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mu_);
  Close(now);
  op_ = op;
  since_ = now;
}

void HostOpProfile::End() {
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mu_);
  Close(now);
}

std::map<std::string, double> HostOpProfile::Take(int* lost) {
  if (lost) *lost = 0;
  std::lock_guard lock(mu_);
  return std::exchange(seconds_, {});
}

}  // namespace zinf::model
