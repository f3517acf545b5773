#include "exec/op_profile.h"

#include <utility>

namespace zinf::exec {

using model::HostOpProfile;
using model::OpProfile;

void EventOpProfile::Record(const char* op) {
  std::unique_ptr<Event> e;
  if (!spare_.empty()) {
    e = std::move(spare_.back());
    spare_.pop_back();
  } else if (auto created = device_.CreateTimingEvent(); created.ok()) {
    e = std::move(*created);
  }
  if (e && !e->Record(stream_).ok()) e.reset();
  points_.push_back(Point{op, std::move(e)});
}

void EventOpProfile::Mark(const char* op) { Record(op); }

void EventOpProfile::End() { Record(nullptr); }

std::map<std::string, double> EventOpProfile::Take(int* lost) {
  std::map<std::string, double> seconds;
  int missed = 0;
  for (size_t i = 0; i + 1 < points_.size(); ++i) {
    if (!points_[i].op) continue;
    const Point& a = points_[i];
    const Point& b = points_[i + 1];
    Result<double> t = a.event && b.event ? b.event->SecondsSince(*a.event) : Result<double>(Unavailable("no event"));
    if (t.ok()) {
      seconds[a.op] += *t;
    } else {
      ++missed;
    }
  }
  if (!points_.empty() && points_.back().op) ++missed;  // an op never ended
  for (Point& p : points_) {
    if (p.event) spare_.push_back(std::move(p.event));
  }
  points_.clear();
  if (lost) *lost = missed;
  return seconds;
}

std::unique_ptr<OpProfile> CreateOpProfile(Device& device, Stream& stream) {
  if (device.kind() == DeviceKind::kHost) return std::make_unique<HostOpProfile>();
  return std::make_unique<EventOpProfile>(device, stream);
}

}  // namespace zinf::exec
