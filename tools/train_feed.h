// What zinf train hands the device each micro-step and reads back, without
// waiting for the device in steady state. Two token slots: the loader fills
// one while the device may still be copying the other. Each step's losses
// land in their own slot and are read a step later, while the device works
// on the next step. On CUDA the slots are pinned (a copy into pageable
// memory would block the host until the stream reached it).
//
// One thread (the training loop) uses it, with one stream.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "cpu/pinned_pool.h"
#include "zinf/device.h"
#include "zinf/status.h"

namespace zinf::tools {

class TrainFeed {
 public:
  // `tokens`: a micro-batch's tokens (B x T); `accumulation`: micro-steps per step.
  static Result<std::unique_ptr<TrainFeed>> Create(Device& device, Stream& stream, int64_t tokens,
                                                   int64_t accumulation);
  ~TrainFeed();  // synchronizes the stream: no copy is left reading or writing a slot

  // Micro-step m's host slot (tokens, targets), m counted over the run.
  // Waits only for micro-step m - 2's copies, so the device keeps m - 1's
  // work queued meanwhile.
  Result<std::pair<int32_t*, int32_t*>> Slot(int64_t m);
  // Copies micro-step m's slot to the device.
  Status Feed(int64_t m, int32_t* device_tokens, int32_t* device_targets);
  // The loss at `device_loss` (one float), for micro-step k of step s.
  Status KeepLoss(int64_t step, int64_t k, const float* device_loss);
  // After step s's last KeepLoss.
  Status EndStep(int64_t step);
  // Step s's losses: waits for them (call it once step s + 1 is enqueued;
  // step s + 2's losses reuse the slot), or the stream's error.
  Result<std::vector<float>> Losses(int64_t step);
  // Micro-step k of step s's loss now: waits for the stream (it drains).
  Result<float> LossNow(int64_t step, int64_t k);

 private:
  TrainFeed(Device& device, Stream& stream, int64_t tokens, int64_t accumulation)
      : device_(device), stream_(stream), tokens_(tokens), accumulation_(accumulation) {}
  int32_t* slot_base(int64_t m) const;
  float* loss_slot(int64_t step) const;

  Device& device_;
  Stream& stream_;
  const int64_t tokens_, accumulation_;
  // The host memory: pinned through this pool on CUDA, else a vector.
  std::unique_ptr<MemoryRegistrar> registrar_;
  std::unique_ptr<cpu::PinnedPool> pool_;
  cpu::PinnedBuffer pinned_;
  std::vector<uint8_t> plain_;
  uint8_t* base_ = nullptr;
  std::unique_ptr<Event> fed_[2];   // after micro-step m's copies, m % 2
  std::unique_ptr<Event> lost_[2];  // after step s's last loss copy, s % 2
};

}  // namespace zinf::tools
