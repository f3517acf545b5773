// Step metrics: timed stream tasks (optimizer, collectives, copies, NVMe
// waits, compute stalls), accumulated per window under the engine's lock
// and closed into StepStats at each boundary, and StepStats' report.
#include "sched/engine_impl.h"

namespace zinf {
namespace sched {

Status EngineImpl::Collective(Stream& stream, const char* kind, uint64_t bytes,
                              const std::function<Status()>& enqueue) {
  auto start = std::make_shared<Clock::time_point>();
  ZINF_RETURN_IF_ERROR(stream.Enqueue([start](const StreamContext&) {
    *start = Clock::now();
    return Status::Ok();
  }));
  ZINF_RETURN_IF_ERROR(enqueue());
  return stream.Enqueue([this, start, kind, bytes](const StreamContext&) {
    const double s = Seconds(*start, Clock::now());
    std::lock_guard lock(mu_);
    window_.comm += s;
    StepStats::Collective& c = window_.collectives[kind];
    c.kind = kind;
    c.calls += 1;
    c.bytes += bytes;
    return Status::Ok();
  });
}

Status EngineImpl::Timed(double Window::*field, StreamTask task, Stream* stream) {
  return (stream ? *stream : *stream_).Enqueue([this, field, task = std::move(task)](const StreamContext& ctx) {
    const auto start = Clock::now();
    Status s = task(ctx);
    const double seconds = Seconds(start, Clock::now());
    std::lock_guard lock(mu_);
    window_.*field += seconds;
    return s;
  });
}

Status EngineImpl::TimedCopies(Stream& stream, uint64_t bytes, const std::function<Status()>& enqueue) {
  auto start = std::make_shared<Clock::time_point>();
  ZINF_RETURN_IF_ERROR(stream.Enqueue([start](const StreamContext&) {
    *start = Clock::now();
    return Status::Ok();
  }));
  ZINF_RETURN_IF_ERROR(enqueue());
  return stream.Enqueue([this, start, bytes](const StreamContext&) {
    const double s = Seconds(*start, Clock::now());
    std::lock_guard lock(mu_);
    window_.copy += s;
    window_.copy_bytes += bytes;
    return Status::Ok();
  });
}

Status EngineImpl::WaitTimed(Stream& stream, Event& event, const Unit& u, const char* cause, const std::string& what) {
  ZINF_ASSIGN_OR_RETURN(bool done, event.Query());
  if (done) return Status::Ok();
  auto start = std::make_shared<Clock::time_point>();
  ZINF_RETURN_IF_ERROR(stream.Enqueue([start](const StreamContext&) {
    *start = Clock::now();
    return Status::Ok();
  }));
  ZINF_RETURN_IF_ERROR(stream.Wait(event));
  return stream.Enqueue([this, start, what, unit = u.name, cause](const StreamContext&) {
    const double s = Seconds(*start, Clock::now());
    std::lock_guard lock(mu_);
    StepStats::Stall& st = window_.stalls[{unit, cause}];
    st.unit = unit;
    st.cause = cause;
    st.count += 1;
    st.seconds += s;
    window_.stall += s;
    if (s > window_.longest_stall) {
      window_.longest_stall = s;
      window_.longest_stall_what = what;
    }
    return Status::Ok();
  });
}

Result<StepStats> EngineImpl::Stats() {
  int64_t first;
  {
    std::lock_guard lock(mu_);
    if (!closed_.empty()) {
      StepStats s = closed_.rbegin()->second;
      s.behind = boundaries_ - s.boundary;
      return s;
    }
    if (boundaries_ == 0) return FailedPrecondition("Stats(): no optimizer step has been taken yet");
    first = first_boundary_;  // none has finished: wait for this engine's first
  }
  ZINF_ASSIGN_OR_RETURN(StepStats s, Stats(first));
  std::lock_guard lock(mu_);
  s.behind = boundaries_ - s.boundary;
  return s;
}

Result<StepStats> EngineImpl::Stats(int64_t boundary) {
  {
    std::lock_guard lock(mu_);
    if (auto it = closed_.find(boundary); it != closed_.end()) return it->second;
    if (boundary > boundaries_ || boundary < first_boundary_ ||
        (!closed_.empty() && boundary < closed_.begin()->first)) {
      return OutOfRange("Stats(" + std::to_string(boundary) + "): boundaries " +
                        (closed_.empty() ? std::string("none") : std::to_string(closed_.begin()->first)) + " to " +
                        std::to_string(boundaries_) + " are kept or enqueued");
    }
  }
  ZINF_RETURN_IF_ERROR(closed_events_[boundary % closed_events_.size()]->Synchronize());
  {
    std::lock_guard lock(mu_);
    if (auto it = closed_.find(boundary); it != closed_.end()) return it->second;
  }
  // Not kept although its window's event completed: its stream failed (the
  // task was skipped), or the boundary predates a Load.
  ZINF_RETURN_IF_ERROR(Synchronize());
  return OutOfRange("Stats(" + std::to_string(boundary) + "): that boundary's metrics are not kept (it came before "
                    "this engine's first step or its last Load)");
}


// The window's close: the step's counts in the engine stream's order (every
// read and write of the step has completed there), then its StepStats,
// logged in one line (with the optimizer offloaded, after the last copy
// back and the engine stream's last task).
Status EngineImpl::EnqueueWindowClose(int64_t boundary) {
  ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, boundary](const StreamContext&) {
    std::lock_guard lock(mu_);
    StreamCounts c = stream_counts_;
    stream_counts_ = StreamCounts{};
    const nvme::IoEngineStats now = IoTotals();
    c.nvme_read = now.bytes_read - io_base_.bytes_read;
    c.nvme_written = now.bytes_written - io_base_.bytes_written;
    io_base_ = now;
    closing_[boundary] = c;
    return Status::Ok();
  }));
  // Close the window: the step's metrics, logged in one line (with offload,
  // after the last copy back and the engine stream's last task).
  if (offload_) {
    ZINF_RETURN_IF_ERROR(updates_done_->Record(*stream_));
    ZINF_RETURN_IF_ERROR(copy_stream_->Wait(*updates_done_));
  }
  Stream& closing = offload_ ? *copy_stream_ : *stream_;
  ZINF_RETURN_IF_ERROR(closing.Enqueue([this, boundary](const StreamContext&) {
    StepStats s;
    {
      std::lock_guard lock(mu_);
      auto decided = decided_steps_.find(boundary);
      if (decided == decided_steps_.end()) {
        return Internal("the window of boundary " + std::to_string(boundary) + " closed before its decision");
      }
      const Decision d = decided->second.first;
      s.step = decided->second.second;
      decided_steps_.erase(decided);
      s.boundary = boundary;
      s.skipped = d.skip;
      s.loss_scale = d.loss_scale;
      s.next_loss_scale = d.next_loss_scale;
      s.lr = d.lr;
      s.grad_norm = d.grad_norm;
      s.clip_coef = d.clip_coef;
      s.optimizer_seconds = window_.optimizer;
      s.comm_seconds = window_.comm;
      s.copy_seconds = window_.copy;
      s.io_seconds = window_.io;
      s.copy_bytes = window_.copy_bytes;
      if (auto it = closing_.find(boundary); it != closing_.end()) {
        s.fetches = it->second.fetches;
        s.prefetch_hits = it->second.prefetch_hits;
        s.nvme_bytes_read = it->second.nvme_read;
        s.nvme_bytes_written = it->second.nvme_written;
        closing_.erase(it);
      }
      nvme_total_read_ += s.nvme_bytes_read;
      nvme_total_written_ += s.nvme_bytes_written;
      s.nvme_bytes_read_total = nvme_total_read_;
      s.nvme_bytes_written_total = nvme_total_written_;
      s.stall_seconds = window_.stall;
      s.longest_stall = window_.longest_stall_what;
      for (auto& [key, st] : window_.stalls) s.stalls.push_back(st);
      for (auto& [kind, c] : window_.collectives) s.collectives.push_back(c);
      window_ = Window{};
    }
    s.device_bytes_in_use = device_.memory_stats().in_use_bytes;
    if (pool_) {
      const PinnedPoolStats ps = pool_->stats();
      s.host_pinned_bytes = ps.pinned_bytes;
      s.host_peak_pinned_bytes = ps.peak_pinned_bytes;
    }
    ZINF_LOG_INFO("{}", s.ToString());
    std::lock_guard lock(mu_);
    closed_[boundary] = std::move(s);
    while (closed_.size() > 64) closed_.erase(closed_.begin());
    return Status::Ok();
  }));
  return closed_events_[boundary % closed_events_.size()]->Record(closing);
}

}  // namespace sched

std::string StepStats::ToString() const {
  std::string out = "step " + std::to_string(step);
  if (skipped) out += " SKIPPED (overflow)";
  char buf[256];
  std::snprintf(buf, sizeof buf, " | lr %.3g grad_norm %.4g", lr, grad_norm);
  out += buf;
  if (clip_coef < 1) {
    std::snprintf(buf, sizeof buf, " (clipped x%.3g)", clip_coef);
    out += buf;
  }
  if (loss_scale != 1 || next_loss_scale != 1) {
    std::snprintf(buf, sizeof buf, " loss_scale %g", loss_scale);
    out += buf;
    if (next_loss_scale != loss_scale) {
      std::snprintf(buf, sizeof buf, "->%g", next_loss_scale);
      out += buf;
    }
  }
  std::snprintf(buf, sizeof buf, " | optimizer %.1f ms, comm %.1f ms, copies %.1f ms, nvme waits %.1f ms, compute stalled %.1f ms",
                optimizer_seconds * 1e3, comm_seconds * 1e3, copy_seconds * 1e3, io_seconds * 1e3, stall_seconds * 1e3);
  out += buf;
  if (!longest_stall.empty()) out += " (longest: " + longest_stall + ")";
  if (nvme_bytes_read + nvme_bytes_written > 0) {
    out += " | nvme read " + FormatBytes(nvme_bytes_read) + ", written " + FormatBytes(nvme_bytes_written);
  }
  if (copy_bytes > 0) out += " | host<->device " + FormatBytes(copy_bytes);
  if (fetches > 0) out += " | prefetched " + std::to_string(prefetch_hits) + "/" + std::to_string(fetches) + " gathers";
  for (const Collective& c : collectives) {
    out += " | " + c.kind + " " + std::to_string(c.calls) + "x " + FormatBytes(c.bytes);
  }
  out += " | device " + FormatBytes(device_bytes_in_use);
  if (host_pinned_bytes > 0) out += ", host pinned " + FormatBytes(host_pinned_bytes);
  return out;
}

}  // namespace zinf
