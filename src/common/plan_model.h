// PlanModel: the model as the planner (sched/plan.h) sees it, a small
// description the model (model/gpt_plan.h) or a tool supplies, so that the
// planner knows no model. Plain values.
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace zinf {

// The model as the engine sees it: units of elements, in registration
// (= forward) order, and what its run needs besides model state.
struct PlanModel {
  std::string description;
  std::vector<int64_t> unit_elems;
  // Units the client keeps fetched through the whole micro-step (the GPT's
  // embeddings, used again by the tied LM head); the others are fetched one
  // at a time.
  std::vector<int> held_units;
  uint64_t activation_bytes = 0;    // device, per rank (0: not counted)
  uint64_t io_buffer_bytes = 0;     // device: tokens, targets, loss (already rounded)
  std::string activation_note;      // how activations were counted
  double flops_per_micro_step = 0;  // per rank; 0: unknown (no compute term)
  int64_t num_params() const { return std::accumulate(unit_elems.begin(), unit_elems.end(), int64_t{0}); }
};

}  // namespace zinf
