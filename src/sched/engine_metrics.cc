// Step metrics, and StepStats' report. CPU work the engine's own tasks do
// (optimizer, NVMe waits) is timed inside those tasks; device work
// (collectives, copies, the caller's stalls) by pairs of timing events, so
// no host code runs on a stream to time it (a host task there would wait
// behind any other, as CUDA may serialize host functions). Both accumulate
// per window under the engine's lock; StepStats are closed at each
// boundary, with the timed spans added as their events complete.
#include "sched/engine_impl.h"

namespace zinf::sched {

Status EngineImpl::Collective(Stream& stream, const char* kind, uint64_t bytes,
                              const std::function<Status()>& enqueue) {
  return TimeSpan(stream, "comm", kind, enqueue, [kind = std::string(kind), bytes](Window& w, double seconds) {
    w.comm += seconds;
    StepStats::Collective& c = w.collectives[kind];
    c.kind = kind;
    c.calls += 1;
    c.bytes += bytes;
  });
}

Status EngineImpl::Timed(double Window::*field, std::string what, StreamTask task, Stream* stream) {
  const char* lane = field == &Window::optimizer ? "optimizer" : field == &Window::io ? "nvme wait" : "engine";
  return (stream ? *stream : *stream_)
      .Enqueue([this, field, lane, what = std::move(what), task = std::move(task)](const StreamContext& ctx) {
        const auto start = Clock::now();
        Status s = task(ctx);
        const auto end = Clock::now();
        MutexLock lock(mu_);
        window_.*field += Seconds(start, end);
        if (timeline_origin_) window_.AddSpan(lane, what, TimelineSeconds(start), TimelineSeconds(end));
        return s;
      });
}

Status EngineImpl::Trace(Stream& stream, const std::string& lane, const std::string& what,
                         const std::function<Status()>& enqueue) {
  ZINF_ASSIGN_OR_RETURN(int64_t token, TraceBegin(stream));
  Status s = enqueue();
  Status end = TraceEnd(token, stream, lane, what);
  return !s.ok() ? s : end;
}

Status EngineImpl::SetTimelineOrigin() {
  // On an idle stream the event completes as soon as it is recorded: the
  // host time is the middle of the record and the wait (off by at most half
  // the wait). Of a few tries the narrowest window is kept: a thread that
  // was descheduled in one try (a loaded machine) does not skew the clocks.
  ZINF_RETURN_IF_ERROR(stream_->Synchronize());
  std::unique_ptr<Event> origin;
  Clock::time_point origin_host;
  Clock::duration best = Clock::duration::max();
  for (int attempt = 0; attempt < 5 && best > std::chrono::microseconds(200); ++attempt) {
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Event> e, device_.CreateTimingEvent());
    const Clock::time_point before = Clock::now();
    ZINF_RETURN_IF_ERROR(e->Record(*stream_));
    ZINF_RETURN_IF_ERROR(e->Synchronize());
    const Clock::time_point after = Clock::now();
    if (after - before < best) {
      best = after - before;
      origin = std::move(e);
      origin_host = before + (after - before) / 2;
    }
  }
  MutexLock lock(mu_);
  timeline_origin_ = std::move(origin);
  timeline_origin_host_ = origin_host;
  for (nvme::IoEngine* e : {io_.get(), param_io_.get()}) {
    if (e) e->TakeBusyIntervals();  // the set-up's writes are before the timeline
  }
  return Status::Ok();
}

void EngineImpl::TakeDiskBusy(Window& w) {
  if (!timeline_origin_) return;
  for (nvme::IoEngine* e : {io_.get(), param_io_.get()}) {
    if (!e) continue;
    const char* what = e == io_.get() ? "optimizer state" : "parameter shards";
    for (const nvme::IoBusyInterval& b : e->TakeBusyIntervals()) {
      if (b.end < timeline_origin_host_) continue;
      w.AddSpan("disk", what, TimelineSeconds(b.begin), TimelineSeconds(b.end));
    }
  }
}

Status EngineImpl::TimedCopies(Stream& stream, uint64_t bytes, const std::function<Status()>& enqueue) {
  return TimeSpan(stream, "copy", FormatBytes(bytes), enqueue, [bytes](Window& w, double seconds) {
    w.copy += seconds;
    w.copy_bytes += bytes;
  });
}

// The stall is the time the stream spent at the wait: from reaching it (the
// first event) to passing it (the second).
Status EngineImpl::WaitTimed(Stream& stream, Event& event, const Unit& u, const char* cause, const std::string& what) {
  ZINF_ASSIGN_OR_RETURN(bool done, event.Query());
  if (done) return Status::Ok();  // nothing to wait for: no operation on the stream
  return TimeSpan(
      stream, "stall", std::string(cause) + " " + u.name, [&] { return stream.Wait(event); },
      [what, unit = u.name, cause = std::string(cause)](Window& w, double seconds) {
        StepStats::Stall& st = w.stalls[{unit, cause}];
        st.unit = unit;
        st.cause = cause;
        st.count += 1;
        st.seconds += seconds;
        w.stall += seconds;
        if (seconds > w.longest_stall) {
          w.longest_stall = seconds;
          w.longest_stall_what = what;
        }
      });
}

Result<std::unique_ptr<Event>> EngineImpl::RecordTimingEvent(Stream& stream) {
  std::unique_ptr<Event> e;
  {
    MutexLock lock(mu_);
    if (!spare_timing_events_.empty()) {
      e = std::move(spare_timing_events_.back());
      spare_timing_events_.pop_back();
    }
  }
  if (!e) {
    ZINF_ASSIGN_OR_RETURN(e, device_.CreateTimingEvent());
  }
  ZINF_RETURN_IF_ERROR(e->Record(stream));
  return e;
}

Status EngineImpl::EndSpan(std::unique_ptr<Event> start, Stream& stream, std::string lane, std::string what,
                           std::function<void(Window&, double)> account) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Event> end, RecordTimingEvent(stream));
  MutexLock lock(mu_);
  spans_.push_back(Span{std::move(start), std::move(end), boundaries_ + (in_boundary_ ? 0 : 1), std::move(account),
                        std::move(lane), std::move(what)});
  return Status::Ok();
}

Status EngineImpl::TimeSpan(Stream& stream, const char* lane, std::string what, const std::function<Status()>& enqueue,
                            std::function<void(Window&, double)> account) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Event> start, RecordTimingEvent(stream));
  ZINF_RETURN_IF_ERROR(enqueue());
  return EndSpan(std::move(start), stream, lane, std::move(what), std::move(account));
}

Result<int64_t> EngineImpl::TraceBegin(Stream& stream) {
  {
    MutexLock lock(mu_);
    if (!timeline_origin_) return int64_t{0};  // before the first Fetch: untimed
    if (open_traces_.size() >= kMaxOpenTraces) {
      return FailedPrecondition("TraceBegin: " + std::to_string(open_traces_.size()) +
                                " traces are open; each needs its TraceEnd");
    }
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Event> start, RecordTimingEvent(stream));
  MutexLock lock(mu_);
  const int64_t token = next_trace_++;
  open_traces_[token] = std::move(start);
  return token;
}

Status EngineImpl::TraceEnd(int64_t token, Stream& stream, const std::string& lane, const std::string& what) {
  if (token == 0) return Status::Ok();  // begun before the first Fetch: untimed
  std::unique_ptr<Event> start;
  {
    MutexLock lock(mu_);
    auto it = open_traces_.find(token);
    if (it == open_traces_.end()) {
      return InvalidArgument("TraceEnd: " + std::to_string(token) +
                             " is not an open trace (from TraceBegin, ended once)");
    }
    start = std::move(it->second);
    open_traces_.erase(it);
  }
  return EndSpan(std::move(start), stream, lane, what, [](Window&, double) {});
}

void EngineImpl::ResolveSpans() {
  std::vector<std::string> lines;
  {
    MutexLock lock(mu_);
    for (auto it = spans_.begin(); it != spans_.end();) {
      Result<double> seconds = it->end->SecondsSince(*it->start);
      if (!seconds.ok() && seconds.status().code() == StatusCode::kFailedPrecondition) {
        ++it;  // not yet
        continue;
      }
      Result<double> start = Result<double>(0.0);
      if (seconds.ok() && timeline_origin_) start = it->start->SecondsSince(*timeline_origin_);
      if (seconds.ok() && start.ok()) {
        Window& w = timed_[it->window];
        it->account(w, *seconds);
        if (timeline_origin_) w.AddSpan(std::move(it->lane), std::move(it->what), *start, *start + *seconds);
      } else {
        if (seconds.ok()) seconds = start.status();
        ZINF_LOG_WARN("a timed span of step {} is left out of its metrics: {}", it->window,
                      seconds.status().ToString());
      }
      for (auto* e : {&it->start, &it->end}) {
        if (spare_timing_events_.size() < 256) spare_timing_events_.push_back(std::move(*e));
      }
      it = spans_.erase(it);
    }
    // What closed_ no longer keeps is not asked for again. (While none has
    // closed, every window is still to come: the host may be steps ahead.)
    if (!closed_.empty()) {
      const int64_t oldest = closed_.begin()->first;
      while (!timed_.empty() && timed_.begin()->first < oldest) timed_.erase(timed_.begin());
    }
    // A step is logged once the next boundary was enqueued (its work has
    // mostly been timed by then) or at Synchronize, when nothing is left.
    const bool all = spans_.empty();
    for (auto it = closed_.upper_bound(logged_through_); it != closed_.end(); ++it) {
      if (!all && it->first >= boundaries_) break;
      lines.push_back(WithSpans(it->second).ToString());
      logged_through_ = it->first;
    }
  }
  for (const std::string& line : lines) ZINF_LOG_INFO("{}", line);
}

StepStats EngineImpl::WithSpans(const StepStats& closed) const {
  StepStats s = closed;
  auto it = timed_.find(s.boundary);
  if (it == timed_.end()) return s;
  const Window& w = it->second;
  s.comm_seconds += w.comm;
  s.copy_seconds += w.copy;
  s.copy_bytes += w.copy_bytes;
  s.stall_seconds += w.stall;
  s.longest_stall = w.longest_stall_what;
  for (const auto& [key, st] : w.stalls) s.stalls.push_back(st);
  for (const auto& [kind, c] : w.collectives) s.collectives.push_back(c);
  s.optimizer_seconds += w.optimizer;
  const size_t room = Window::kMaxTimeline - std::min(Window::kMaxTimeline, s.timeline.size());
  const size_t taken = std::min(room, w.timeline.size());
  s.timeline.insert(s.timeline.end(), w.timeline.begin(), w.timeline.begin() + static_cast<std::ptrdiff_t>(taken));
  s.timeline_dropped += w.timeline_dropped + static_cast<int64_t>(w.timeline.size() - taken);
  return s;
}

Result<StepStats> EngineImpl::Stats() {
  ResolveSpans();
  int64_t first;
  {
    MutexLock lock(mu_);
    if (!closed_.empty()) {
      StepStats s = WithSpans(closed_.rbegin()->second);
      s.behind = boundaries_ - s.boundary;
      return s;
    }
    if (boundaries_ == 0) return FailedPrecondition("Stats(): no optimizer step has been taken yet");
    first = first_boundary_;  // none has finished: wait for this engine's first
  }
  ZINF_ASSIGN_OR_RETURN(StepStats s, Stats(first));
  MutexLock lock(mu_);
  s.behind = boundaries_ - s.boundary;
  return s;
}

Result<StepStats> EngineImpl::Stats(int64_t boundary) {
  ResolveSpans();
  {
    MutexLock lock(mu_);
    if (auto it = closed_.find(boundary); it != closed_.end()) return WithSpans(it->second);
    if (boundary > boundaries_ || boundary < first_boundary_ ||
        (!closed_.empty() && boundary < closed_.begin()->first)) {
      return OutOfRange("Stats(" + std::to_string(boundary) + "): boundaries " +
                        (closed_.empty() ? std::string("none") : std::to_string(closed_.begin()->first)) + " to " +
                        std::to_string(boundaries_) + " are kept or enqueued");
    }
  }
  ZINF_RETURN_IF_ERROR(closed_events_[boundary % closed_events_.size()]->Synchronize());
  ResolveSpans();
  {
    MutexLock lock(mu_);
    if (auto it = closed_.find(boundary); it != closed_.end()) return WithSpans(it->second);
  }
  // Not kept although its window's event completed: its stream failed (the
  // task was skipped), or the boundary predates a Load.
  ZINF_RETURN_IF_ERROR(Synchronize());
  return OutOfRange("Stats(" + std::to_string(boundary) +
                    "): that boundary's metrics are not kept (it came before "
                    "this engine's first step or its last Load)");
}

// The window's close: the step's counts in the engine stream's order (every
// read and write of the step has completed there), then its StepStats,
// logged in one line (with the optimizer offloaded, after the last copy
// back and the engine stream's last task).
Status EngineImpl::EnqueueWindowClose(int64_t boundary) {
  ZINF_RETURN_IF_ERROR(stream_->Enqueue([this, boundary](const StreamContext&) {
    MutexLock lock(mu_);
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
      MutexLock lock(mu_);
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
      TakeDiskBusy(window_);
      s.timeline = std::move(window_.timeline);
      s.timeline_dropped = window_.timeline_dropped;
      window_ = Window{};
    }
    s.device_bytes_in_use = device_.memory_stats().in_use_bytes;
    if (pool_) {
      const cpu::PinnedPoolStats ps = pool_->stats();
      s.host_pinned_bytes = ps.pinned_bytes;
      s.host_peak_pinned_bytes = ps.peak_pinned_bytes;
    }
    MutexLock lock(mu_);
    closed_[boundary] = std::move(s);
    while (closed_.size() > 64) closed_.erase(closed_.begin());
    return Status::Ok();
  }));
  return closed_events_[boundary % closed_events_.size()]->Record(closing);
}

}  // namespace zinf::sched

namespace zinf {

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
  std::snprintf(buf, sizeof buf,
                " | optimizer %.1f ms, comm %.1f ms, copies %.1f ms, nvme waits %.1f ms, compute stalled %.1f ms",
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
