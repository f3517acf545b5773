#include "tools/train_feed.h"

#include <cstring>

#include "sched/device_kernels.h"

namespace zinf::tools {

Result<std::unique_ptr<TrainFeed>> TrainFeed::Create(Device& device, Stream& stream, int64_t tokens,
                                                     int64_t accumulation) {
  if (tokens <= 0 || accumulation <= 0) return InvalidArgument("TrainFeed: tokens and accumulation must be positive");
  std::unique_ptr<TrainFeed> f(new TrainFeed(device, stream, tokens, accumulation));
  // Two slots of tokens and targets, then two steps of losses.
  const uint64_t bytes = 2 * 2 * static_cast<uint64_t>(tokens) * 4 + 2 * static_cast<uint64_t>(accumulation) * 4;
  if (device.kind() == DeviceKind::kCuda) {
    ZINF_ASSIGN_OR_RETURN(f->registrar_, sched::CreateHostRegistrarFor(device));
    cpu::PinnedPoolOptions o;
    o.budget_bytes = cpu::PinnedPool::SizeClassBytes(bytes);
    o.registrars.push_back(f->registrar_.get());
    ZINF_ASSIGN_OR_RETURN(o.gpu_pci_bus_id, sched::DevicePciBusId(device));
    ZINF_ASSIGN_OR_RETURN(f->pool_, cpu::PinnedPool::Create(std::move(o)));
    auto b = f->pool_->Acquire(bytes);
    if (!b.ok()) return b.status().WithContext("zinf train: pinned token and loss slots");
    f->pinned_ = std::move(*b);
    f->base_ = static_cast<uint8_t*>(f->pinned_.data());
  } else {
    f->plain_.resize(bytes);
    f->base_ = f->plain_.data();
  }
  std::memset(f->base_, 0, bytes);
  for (int i = 0; i < 2; ++i) {
    ZINF_ASSIGN_OR_RETURN(f->fed_[i], device.CreateEvent());
    ZINF_ASSIGN_OR_RETURN(f->lost_[i], device.CreateEvent());
  }
  return f;
}

TrainFeed::~TrainFeed() { (void)stream_.Synchronize(); }

int32_t* TrainFeed::slot_base(int64_t m) const { return reinterpret_cast<int32_t*>(base_) + (m % 2) * 2 * tokens_; }

float* TrainFeed::loss_slot(int64_t step) const {
  return reinterpret_cast<float*>(base_ + 2 * 2 * tokens_ * 4) + (step % 2) * accumulation_;
}

Result<std::pair<int32_t*, int32_t*>> TrainFeed::Slot(int64_t m) {
  ZINF_RETURN_IF_ERROR(fed_[m % 2]->Synchronize());
  int32_t* s = slot_base(m);
  return std::make_pair(s, s + tokens_);
}

Status TrainFeed::Feed(int64_t m, int32_t* device_tokens, int32_t* device_targets) {
  int32_t* s = slot_base(m);
  ZINF_RETURN_IF_ERROR(device_.CopyToDevice(device_tokens, s, tokens_ * 4, stream_));
  ZINF_RETURN_IF_ERROR(device_.CopyToDevice(device_targets, s + tokens_, tokens_ * 4, stream_));
  return fed_[m % 2]->Record(stream_);
}

Status TrainFeed::KeepLoss(int64_t step, int64_t k, const float* device_loss) {
  if (k < 0 || k >= accumulation_) return InvalidArgument("TrainFeed::KeepLoss: micro-step out of range");
  return device_.CopyToHost(loss_slot(step) + k, device_loss, 4, stream_);
}

Status TrainFeed::EndStep(int64_t step) { return lost_[step % 2]->Record(stream_); }

Result<std::vector<float>> TrainFeed::Losses(int64_t step) {
  ZINF_RETURN_IF_ERROR(lost_[step % 2]->Synchronize());
  ZINF_RETURN_IF_ERROR(stream_.sticky_error());  // a failed forward or backward left no loss
  const float* l = loss_slot(step);
  return std::vector<float>(l, l + accumulation_);
}

Result<float> TrainFeed::LossNow(int64_t step, int64_t k) {
  ZINF_RETURN_IF_ERROR(stream_.Synchronize());
  return loss_slot(step)[k];
}

}  // namespace zinf::tools
