// Reading the engine's per-step timelines (StepStats::timeline): each
// step's stretch on the caller's stream, how busy every lane was within it,
// the stalls by cause, one line of text per step, and an SVG picture.
//
// A step's period is the stretch from its first "compute" or "stall" span to
// its last: the caller's stream working through the step's forward and
// backward, waits included. Busy time is the union of a lane's spans within
// the period, whichever step's window they were recorded in (a step's
// updates run during the next step's forward).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zinf/engine.h"

namespace zinf::sched {

struct StepTimeline {
  int64_t boundary = 0;
  double start = 0, end = 0;             // the period, timeline seconds
  std::map<std::string, double> busy;    // lane -> seconds busy within the period
  std::map<std::string, double> stalls;  // cause -> seconds the caller's stream waited
  double seconds() const { return end - start; }
  double share(const std::string& lane) const;  // busy / period (0 when the lane is absent)
};

// Seconds each lane was busy (the union of its spans) within [t0, t1].
std::map<std::string, double> LaneBusy(const std::vector<TimelineSpan>& spans, double t0, double t1);

// One entry per step of `steps` that has a period (a step with no compute
// or stall span has none), its lanes taken from the spans of every step
// given: pass the steps around the ones to look at as well.
std::vector<StepTimeline> SummarizeTimeline(const std::vector<StepStats>& steps);

// "compute 92% | optimizer 71% | disk 0% | copy 12% | comm 0% | stalled
// 3.1 ms (optimizer 3.1 ms)": the lanes a trainer looks at, then any other.
std::string FormatStepTimeline(const StepTimeline& t);

// The spans of `steps` as lanes against time, with each step's period
// marked; spans are clipped to [from, to] (timeline seconds; from >= to
// takes everything). Each span carries a tooltip with its name and length.
std::string TimelineSvg(const std::vector<StepStats>& steps, const std::string& title, double from = 0, double to = 0);
// TimelineSvg written to `path`.
Status WriteTimelineSvg(const std::string& path, const std::vector<StepStats>& steps, const std::string& title,
                        double from = 0, double to = 0);

}  // namespace zinf::sched
