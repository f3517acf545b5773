// OptimizerSwapper: the optimizer state's NVMe home (offload_optimizer nvme)
// and its pipelined swapper.
//
// Owns: the swap store; the sub-groups (consecutive whole units, each
// sub-group one swap tensor holding [master | m | v] of every unit's owned
// range); the buffer_count pinned buffers a boundary cycles the sub-groups
// through (SwapSchedule decides the order; each buffer fits the largest
// sub-group it holds); and the swapped gradients: which
// units keep their accumulated gradient in the store (PlaceGradients), the
// gradient buffer beside each swap buffer they are read back into, and
// those reads.
//
// Runs on one thread at a time: registration (AddUnit, Finish) on the
// client's, the boundary (IssueReads, ReadGroup, IssueWrites, Drain) in the
// engine stream's task order. Waits only for its own I/O requests: a read
// into a buffer is issued once the write out of it (its sub-group
// predecessor's) has finished, and, with phased swaps, a batch's reads once
// the previous batch's writes have. Every transfer completes before its
// buffer is reused or freed.
//
// A failed transfer goes through `on_failure` (the engine records that the
// state on disk is now mixed and refuses further steps) and is returned.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zinf/status.h"
#include "cpu/pinned_pool.h"
#include "nvme/io_engine.h"
#include "nvme/swap_store.h"
#include "sched/swap_schedule.h"
#include "zinf/config.h"

namespace zinf::sched {

class OptimizerSwapper {
 public:
  enum class FailureKind { kState, kGradients };
  struct Options {
    std::vector<std::string> dirs;  // offload_optimizer.nvme_path
    bool checksums = false;
    bool direct = true;
    int64_t sub_group_size = 1'000'000'000;  // elements; capped at kSubGroupPackElems
    int64_t buffer_count = 4;
    bool phased = true;  // zinf.aio.phased_swaps
    GradientHome gradients = GradientHome::kAuto;
    // How swap files are opened (default: the I/O engine's).
    std::function<Result<std::shared_ptr<nvme::File>>(const std::string&, const nvme::FileOptions&)> open_file;
    // Pinned host buffers (the engine's pool, within its budget).
    std::function<Result<cpu::PinnedBuffer>(uint64_t bytes, const std::string& what)> pinned;
    // Told of every failed transfer; returns the status to report (default:
    // the failure itself).
    std::function<Status(Status, FailureKind)> on_failure;
  };

  OptimizerSwapper(nvme::IoEngine& io, Options options);
  ~OptimizerSwapper();  // waits for every transfer in flight
  OptimizerSwapper(const OptimizerSwapper&) = delete;
  OptimizerSwapper& operator=(const OptimizerSwapper&) = delete;

  // Registration, units in order 0, 1, ...: the unit's owned range of
  // `owned` elements joins the open sub-group (a new one when it would
  // exceed the sub-group size; a unit larger than that is a sub-group of its
  // own) with the initial state [master | 0 | 0] (`valid` elements of
  // `master`, zeros after). A sub-group is written to the store, grown for
  // it, when the next one opens. Host memory: one sub-group.
  Status AddUnit(const std::string& name, int64_t owned, const float* master, int64_t valid);
  // At the end of registration: the last sub-group written, where each
  // unit's gradient accumulates (host memory while `host_available` pinned
  // bytes allow, else the store: its space reserved now), and the buffers.
  // `host_budget` is only for the message when the buffers do not fit.
  Status Finish(uint64_t host_available, uint64_t host_budget);

  // The boundary, in sub-group order. IssueReads issues the reads of g and
  // of the sub-groups the schedule reads ahead with it (the state alone when
  // `has_grad` is null: during the last backward; with it, each unit's
  // swapped gradient too when it has one this window). ReadGroup issues and
  // waits for g's. IssueWrites after g's update; Drain at the boundary's end
  // waits for every write and forgets the boundary's requests.
  Status IssueReads(size_t g, const std::vector<char>* has_grad);
  Status ReadGroup(size_t g, const std::vector<char>& has_grad);
  void IssueWrites(size_t g);
  Status Drain();
  // Waits for every transfer in flight, ignoring failures (shutdown).
  void WaitAll();

  size_t num_groups() const { return groups_.size(); }
  const std::vector<int>& group_units(size_t g) const { return groups_[g].units; }
  size_t group_of(int unit) const { return static_cast<size_t>(group_of_unit_[unit]); }
  size_t num_buffers() const { return bufs_.size(); }
  // Sub-group g's swap buffer (valid between its read and its write).
  float* buffer(size_t g) const { return static_cast<float*>(bufs_[g % bufs_.size()].data()); }
  // The unit's [master | m | v] in its sub-group's buffer: elements from the buffer's start.
  int64_t offset_in_group(int unit) const { return offset_in_group_[unit]; }
  float* state(int unit) const { return buffer(group_of(unit)) + offset_in_group_[unit]; }

  // Swapped gradients: whether the unit's accumulated gradient lives in the
  // store, and where it is read back at the boundary.
  bool grad_on_nvme(int unit) const { return !grad_on_nvme_.empty() && grad_on_nvme_[unit] != 0; }
  int64_t swapped_grad_units() const { return swapped_grad_units_; }
  void* grad(int unit) const;
  nvme::IoRequest WriteGrad(int unit, const void* buffer) { return store_->Write(GradTensor(unit), buffer); }
  nvme::IoRequest ReadGrad(int unit, void* buffer) { return store_->Read(GradTensor(unit), buffer); }
  // The two staging buffers a swapped gradient is accumulated in on its way
  // to the store (each holds the largest swapped unit's gradient).
  void* grad_stage(int s) const { return grad_stage_[s].data(); }

  // The store itself: sub-group g is tensor g (checkpoints read and write
  // whole sub-groups through the swap buffers between steps).
  nvme::SwapStore& store() const { return *store_; }

 private:
  static nvme::TensorId GradTensor(int unit) { return (nvme::TensorId{1} << 32) + static_cast<nvme::TensorId>(unit); }
  Status FlushInitialGroup();
  Result<uint64_t> PlaceGradients(const std::vector<int64_t>& buffer_elems, uint64_t available, uint64_t budget);
  Status Failed(Status s, FailureKind kind) {
    return s.ok() || !options_.on_failure ? s : options_.on_failure(s, kind);
  }

  nvme::IoEngine& io_;
  const Options options_;
  struct Group {
    std::vector<int> units;
    int64_t elems = 0;  // sum of the units' owned elements
  };
  std::vector<Group> groups_;
  std::vector<int> group_of_unit_;
  std::vector<int64_t> owned_;            // per unit
  std::vector<int64_t> offset_in_group_;  // elements: the unit's master; m and v follow, owned apart
  std::unique_ptr<nvme::SwapStore> store_;
  int64_t group_limit_ = 0;      // elements: sub_group_size, capped at kSubGroupPackElems
  uint64_t store_capacity_ = 0;  // bytes asked of the store so far (it grows as sub-groups close)
  size_t groups_written_ = 0;    // sub-groups whose initial state is in the store
  std::unique_ptr<float, decltype(&std::free)> init_group_{nullptr, &std::free};  // the open sub-group's initial state
  int64_t init_group_elems_ = 0;
  std::optional<SwapSchedule> schedule_;
  std::vector<cpu::PinnedBuffer> bufs_;
  std::vector<nvme::IoRequest> reads_, writes_;  // this boundary's, per sub-group
  // Swapped gradients.
  std::vector<char> grad_on_nvme_;
  std::vector<int64_t> grad_offset_;  // bytes into the sub-group's gradient buffer
  int64_t swapped_grad_units_ = 0;
  std::vector<cpu::PinnedBuffer> grad_bufs_;
  cpu::PinnedBuffer grad_stage_[2];
  std::vector<std::vector<nvme::IoRequest>> grad_reads_;  // this boundary's, per sub-group
};

}  // namespace zinf::sched
