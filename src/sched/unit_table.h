// UnitTable: the registered units' layouts, decided at registration and
// immutable after it: each unit's tensors (names, shapes, element offsets),
// its partition over the ranks, and where its parameters live (stage 3: kept
// whole below the persistence thresholds, else partitioned; offload_param
// nvme: a shard in host memory within max_in_cpu, else in the parameter
// store).
//
// Owns: the units' names and the running totals the placement rules read.
// Runs on the client's thread at registration (Layout, then Add once the
// engine has allocated the unit); read-only afterwards. Waits for nothing.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "sched/partition.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::sched {

struct UnitLayout {
  std::string name;
  std::vector<std::string> tensor_names;
  std::vector<int64_t> tensor_offsets;  // elements from the unit's start
  std::vector<std::vector<int64_t>> tensor_shapes;
  std::vector<int> tensor_groups;  // each tensor's parameter group (ParamSpec::group)
  UnitPartition part;
  int index = -1;              // registration order
  bool partitioned = false;    // stage 3: only this rank's shard is kept, gathered on Fetch
  bool shard_on_nvme = false;  // offload_param nvme past max_in_cpu: the shard's home is the parameter store
  bool frozen = false;         // UnitOptions::frozen: a compute copy only, no gradients or optimizer state

  // The runs of tensors of one parameter group that overlap the element
  // range [begin, begin + count) of the unit, in order, as (offset from
  // begin, elements, group); elements past the last tensor (padding) belong
  // to the last run.
  struct GroupRun {
    int64_t offset = 0, elems = 0;
    int group = 0;
  };
  std::vector<GroupRun> GroupRuns(int64_t begin, int64_t count) const;
};

struct UnitTableOptions {
  int world = 1;
  int stage = 0;
  int64_t param_persistence_threshold = 0;  // stage3_param_persistence_threshold (elements)
  int64_t model_persistence_threshold = 0;  // stage3_model_persistence_threshold (elements)
  bool param_offload = false;               // stage 3, offload_param cpu or nvme
  bool param_nvme = false;                  // stage 3, offload_param nvme
  int64_t max_in_cpu = 0;                   // offload_param.max_in_cpu (elements)
};

class UnitTable {
 public:
  explicit UnitTable(const UnitTableOptions& options) : options_(options) {}

  // The layout the next unit gets, or why it cannot be registered (no
  // parameters, a name already taken, a dimension that is not positive, a
  // tensor of 2^40 elements or more). Changes nothing.
  // `groups` is the number of parameter groups defined (a tensor's group
  // must be below it).
  Result<UnitLayout> Layout(const std::string& name, const std::vector<ParamSpec>& params, int groups = 1) const;
  // Registers a layout Layout returned, once the unit exists.
  void Add(const UnitLayout& layout);

  int size() const { return static_cast<int>(names_.size()); }
  int64_t persistent_elems() const { return persistent_elems_; }  // stage 3: elements of the units kept whole
  int64_t cpu_shard_elems() const { return cpu_shard_elems_; }    // offload_param nvme: shard elements in host memory

 private:
  const UnitTableOptions options_;
  std::unordered_map<std::string, int> names_;
  int64_t persistent_elems_ = 0;
  int64_t cpu_shard_elems_ = 0;
};

}  // namespace zinf::sched
