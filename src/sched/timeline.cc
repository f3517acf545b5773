#include "sched/timeline.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

namespace zinf::sched {
namespace {

bool OnCallersStream(const TimelineSpan& s) { return s.lane == "compute" || s.lane == "stall"; }

// A stall's cause: `what` up to its first space ("optimizer unit3").
std::string StallCause(const std::string& what) { return what.substr(0, what.find(' ')); }

// The length of the union of [a, b) intervals clipped to [t0, t1].
double UnionWithin(std::vector<std::pair<double, double>> iv, double t0, double t1) {
  std::sort(iv.begin(), iv.end());
  double total = 0, cur_a = 0, cur_b = -std::numeric_limits<double>::infinity();
  bool open = false;
  for (auto [a, b] : iv) {
    a = std::max(a, t0);
    b = std::min(b, t1);
    if (b <= a) continue;
    if (open && a <= cur_b) {
      cur_b = std::max(cur_b, b);
      continue;
    }
    if (open) total += cur_b - cur_a;
    cur_a = a;
    cur_b = b;
    open = true;
  }
  if (open) total += cur_b - cur_a;
  return total;
}

// The lanes in the order a reader looks for them; others follow by name.
constexpr const char* kLaneOrder[] = {"compute", "stall", "optimizer", "disk", "nvme wait", "copy", "comm"};

int LaneRank(const std::string& lane) {
  for (int i = 0; i < static_cast<int>(std::size(kLaneOrder)); ++i) {
    if (lane == kLaneOrder[i]) return i;
  }
  return static_cast<int>(std::size(kLaneOrder));
}

const char* LaneColor(const std::string& lane) {
  switch (LaneRank(lane)) {
    case 0:
      return "#4c78a8";  // compute
    case 1:
      return "#e45756";  // stall
    case 2:
      return "#f58518";  // optimizer
    case 3:
      return "#54a24b";  // disk
    case 4:
      return "#b279a2";  // nvme wait
    case 5:
      return "#72b7b2";  // copy
    case 6:
      return "#eeca3b";  // comm
    default:
      return "#9d755d";
  }
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

double StepTimeline::share(const std::string& lane) const {
  auto it = busy.find(lane);
  return it == busy.end() || seconds() <= 0 ? 0.0 : it->second / seconds();
}

std::map<std::string, double> LaneBusy(const std::vector<TimelineSpan>& spans, double t0, double t1) {
  std::map<std::string, std::vector<std::pair<double, double>>> by_lane;
  for (const TimelineSpan& s : spans) by_lane[s.lane].emplace_back(s.start, s.end);
  std::map<std::string, double> busy;
  for (auto& [lane, iv] : by_lane) busy[lane] = UnionWithin(std::move(iv), t0, t1);
  return busy;
}

std::vector<StepTimeline> SummarizeTimeline(const std::vector<StepStats>& steps) {
  std::vector<TimelineSpan> all;
  for (const StepStats& s : steps) all.insert(all.end(), s.timeline.begin(), s.timeline.end());
  std::vector<StepTimeline> out;
  for (const StepStats& s : steps) {
    double a = std::numeric_limits<double>::infinity(), b = -a;
    for (const TimelineSpan& span : s.timeline) {
      if (!OnCallersStream(span)) continue;
      a = std::min(a, span.start);
      b = std::max(b, span.end);
    }
    if (a > b) continue;
    StepTimeline t;
    t.boundary = s.boundary;
    t.start = a;
    t.end = b;
    t.busy = LaneBusy(all, a, b);
    std::map<std::string, std::vector<std::pair<double, double>>> stalls;
    for (const TimelineSpan& span : all) {
      if (span.lane == "stall") stalls[StallCause(span.what)].emplace_back(span.start, span.end);
    }
    for (auto& [cause, iv] : stalls) {
      const double seconds = UnionWithin(std::move(iv), a, b);
      if (seconds > 0) t.stalls[cause] = seconds;
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string FormatStepTimeline(const StepTimeline& t) {
  std::string out;
  char buf[96];
  auto lane = [&](const std::string& name, bool always) {
    if (!always && t.busy.count(name) == 0) return;
    std::snprintf(buf, sizeof buf, "%s%s %.0f%%", out.empty() ? "" : " | ", name.c_str(), 100 * t.share(name));
    out += buf;
  };
  for (const char* name : {"compute", "optimizer", "disk", "copy"}) lane(name, true);
  for (const char* name : {"nvme wait", "comm"}) lane(name, false);
  for (const auto& [name, seconds] : t.busy) {
    if (LaneRank(name) == static_cast<int>(std::size(kLaneOrder))) lane(name, true);
  }
  const double stalled = t.busy.count("stall") ? t.busy.at("stall") : 0.0;
  std::snprintf(buf, sizeof buf, " | stalled %.1f ms", stalled * 1e3);
  out += buf;
  std::string causes;
  for (const auto& [cause, seconds] : t.stalls) {
    std::snprintf(buf, sizeof buf, "%s%s %.1f ms", causes.empty() ? "" : ", ", cause.c_str(), seconds * 1e3);
    causes += buf;
  }
  if (!causes.empty()) out += " (" + causes + ")";
  return out;
}

std::string TimelineSvg(const std::vector<StepStats>& steps, const std::string& title, double from, double to) {
  std::vector<TimelineSpan> spans;
  for (const StepStats& s : steps) {
    for (const TimelineSpan& span : s.timeline) {
      if (from < to && (span.end < from || span.start > to)) continue;
      spans.push_back(span);
    }
  }
  double t0 = from, t1 = to;
  if (!(from < to)) {
    t0 = std::numeric_limits<double>::infinity();
    t1 = -t0;
    for (const TimelineSpan& s : spans) {
      t0 = std::min(t0, s.start);
      t1 = std::max(t1, s.end);
    }
    if (spans.empty()) t0 = 0, t1 = 1;
  }
  if (t1 <= t0) t1 = t0 + 1e-3;
  std::vector<std::string> lanes;
  for (const TimelineSpan& s : spans) {
    if (std::find(lanes.begin(), lanes.end(), s.lane) == lanes.end()) lanes.push_back(s.lane);
  }
  std::sort(lanes.begin(), lanes.end(), [](const std::string& a, const std::string& b) {
    return std::make_pair(LaneRank(a), a) < std::make_pair(LaneRank(b), b);
  });
  const double W = 1200, left = 90, right = 20, top = 40, row = 26, bar = 18;
  const double H = top + row * static_cast<double>(lanes.size()) + 40;
  const double plot_w = W - left - right;
  auto x_of = [&](double t) { return left + plot_w * (std::clamp(t, t0, t1) - t0) / (t1 - t0); };
  char buf[512];
  std::string svg;
  std::snprintf(buf, sizeof buf,
                "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' font-family='sans-serif' "
                "font-size='12'>\n<rect width='%.0f' height='%.0f' fill='white'/>\n",
                W, H, W, H);
  svg += buf;
  std::snprintf(buf, sizeof buf, "<text x='%.0f' y='20' font-size='13'>", left);
  svg += buf + Escape(title) + "</text>\n";
  for (size_t i = 0; i < lanes.size(); ++i) {
    const double y = top + row * static_cast<double>(i);
    std::snprintf(buf, sizeof buf, "<text x='%.0f' y='%.1f' text-anchor='end'>", left - 6, y + bar - 4);
    svg += buf + Escape(lanes[i]) + "</text>\n";
    std::snprintf(buf, sizeof buf, "<line x1='%.0f' y1='%.1f' x2='%.0f' y2='%.1f' stroke='#eee'/>\n", left, y + row - 2,
                  W - right, y + row - 2);
    svg += buf;
  }
  for (const TimelineSpan& s : spans) {
    const size_t lane = std::find(lanes.begin(), lanes.end(), s.lane) - lanes.begin();
    const double y = top + row * static_cast<double>(lane);
    const double x = x_of(s.start), w = std::max(0.5, x_of(s.end) - x);
    // The name is appended as is: a long one must not be cut with the markup after it.
    std::snprintf(buf, sizeof buf,
                  "<rect x='%.2f' y='%.1f' width='%.2f' height='%.0f' fill='%s' fill-opacity='0.8'><title>", x, y, w,
                  bar, LaneColor(s.lane));
    svg += buf + Escape(s.what);
    std::snprintf(buf, sizeof buf, ": %.3f ms at %.3f s</title></rect>\n", (s.end - s.start) * 1e3, s.start);
    svg += buf;
  }
  const double bottom = top + row * static_cast<double>(lanes.size());
  for (const StepTimeline& t : SummarizeTimeline(steps)) {
    if (t.start < t0 || t.start > t1) continue;
    std::snprintf(buf, sizeof buf,
                  "<line x1='%.2f' y1='%.0f' x2='%.2f' y2='%.0f' stroke='#333' stroke-dasharray='4 3'/>"
                  "<text x='%.2f' y='%.0f' font-size='11'>step %lld</text>\n",
                  x_of(t.start), top - 8, x_of(t.start), bottom, x_of(t.start) + 3, top - 10,
                  static_cast<long long>(t.boundary));
    svg += buf;
  }
  std::snprintf(buf, sizeof buf,
                "<line x1='%.0f' y1='%.0f' x2='%.0f' y2='%.0f' stroke='#888'/>"
                "<text x='%.0f' y='%.0f'>%.3f s</text><text x='%.0f' y='%.0f' text-anchor='end'>%.3f s "
                "(%.1f ms shown)</text>\n</svg>\n",
                left, bottom + 4, W - right, bottom + 4, left, bottom + 20, t0, W - right, bottom + 20, t1,
                (t1 - t0) * 1e3);
  svg += buf;
  return svg;
}

Status WriteTimelineSvg(const std::string& path, const std::vector<StepStats>& steps, const std::string& title,
                        double from, double to) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return IoError("timeline: cannot create " + path + ": " + std::strerror(errno));
  out << TimelineSvg(steps, title, from, to);
  out.close();
  if (!out) return IoError("timeline: writing " + path + " failed: " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace zinf::sched
