// Where a model stage's time goes, op by op (`zinf bench model
// --breakdown`). A stage marks the start of each op it runs ("matmul",
// "attention", "norm", ...); an op lasts until the next mark or the stage's
// end. Ops of one name add up. Off (no cost but a null check) unless
// GptRunOptions::profile is set.
//
// The CPU model's stages run inside a stream task, so their profile reads
// the host's clock (HostOpProfile); the CUDA stages only enqueue, so theirs
// records timing events on the stream between the ops (exec/op_profile.h).
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>

namespace zinf::model {

class OpProfile {
 public:
  virtual ~OpProfile() = default;
  // The op that starts now.
  virtual void Mark(const char* op) = 0;
  // The stage ends (and the op in progress with it).
  virtual void End() = 0;
  // Seconds per op since the last call, once the marked work has run (the
  // caller waits for the stream first); a mark that could not be timed is
  // left out and counted in `lost`.
  virtual std::map<std::string, double> Take(int* lost = nullptr) = 0;
};

// The op every stage starts in, until its first named op: a stage's time
// outside its named ops shows as this one, not between the stages.
inline constexpr const char* kStageOther = "other";

inline void MarkOp(OpProfile* p, const char* op) {
  if (p) p->Mark(op);
}
inline void EndOps(OpProfile* p) {
  if (p) p->End();
}

// The host's steady clock: for stages that run their ops on the calling
// thread.
class HostOpProfile final : public OpProfile {
 public:
  void Mark(const char* op) override;
  void End() override;
  std::map<std::string, double> Take(int* lost = nullptr) override;

 private:
  using Clock = std::chrono::steady_clock;
  void Close(Clock::time_point now);  // mu_ held
  std::mutex mu_;
  const char* op_ = nullptr;  // in progress
  Clock::time_point since_;
  std::map<std::string, double> seconds_;
};

}  // namespace zinf::model
