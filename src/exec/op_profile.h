// The op profile of stages that only enqueue their work (the CUDA model):
// each mark records a timing event on the stream, and an op's time is the
// time between its event and the next one, read once the stream has run
// them (Take, after the caller waited for the stream).
#pragma once

#include <memory>
#include <vector>

#include "model/op_profile.h"
#include "zinf/device.h"

namespace zinf::exec {

using model::OpProfile;

class EventOpProfile final : public OpProfile {
 public:
  EventOpProfile(Device& device, Stream& stream) : device_(device), stream_(stream) {}
  void Mark(const char* op) override;
  void End() override;
  std::map<std::string, double> Take(int* lost = nullptr) override;

 private:
  struct Point {
    const char* op;                // the op starting here (null: the stage's end)
    std::unique_ptr<Event> event;  // null: it could not be recorded
  };
  void Record(const char* op);
  Device& device_;
  Stream& stream_;
  std::vector<Point> points_;
  std::vector<std::unique_ptr<Event>> spare_;
};

// The profile that fits where the model's stages run: HostOpProfile on the
// host device, EventOpProfile on a CUDA device.
std::unique_ptr<OpProfile> CreateOpProfile(Device& device, Stream& stream);

}  // namespace zinf::exec
