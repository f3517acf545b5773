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
  ZINF_RETURN_IF_ERROR(Synchronize());
  std::lock_guard lock(mu_);
  if (!last_stats_) return FailedPrecondition("Stats(): no optimizer step has been taken yet");
  return *last_stats_;
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
