#include "sched/unit_table.h"

#include <algorithm>

namespace zinf::sched {

std::vector<UnitLayout::GroupRun> UnitLayout::GroupRuns(int64_t begin, int64_t count) const {
  std::vector<GroupRun> runs;
  if (count <= 0) return runs;
  const int64_t end = begin + count;
  for (size_t t = 0; t < tensor_offsets.size(); ++t) {
    const int64_t t_begin = t == 0 ? 0 : tensor_offsets[t];  // the first run also takes nothing before it
    const int64_t t_end = t + 1 < tensor_offsets.size() ? tensor_offsets[t + 1] : end;  // the last takes the padding
    const int64_t lo = std::max(t_begin, begin), hi = std::min(t_end, end);
    if (lo >= hi) continue;
    const int g = t < tensor_groups.size() ? tensor_groups[t] : 0;
    if (!runs.empty() && runs.back().group == g && runs.back().offset + runs.back().elems == lo - begin) {
      runs.back().elems += hi - lo;
    } else {
      runs.push_back({lo - begin, hi - lo, g});
    }
  }
  return runs;
}

Result<UnitLayout> UnitTable::Layout(const std::string& name, const std::vector<ParamSpec>& params, int groups) const {
  if (params.empty()) return InvalidArgument("unit '" + name + "' has no parameters");
  if (names_.count(name)) return InvalidArgument("a unit named '" + name + "' is already registered");
  UnitLayout u;
  u.index = size();
  u.name = name;
  int64_t total = 0;
  for (const ParamSpec& p : params) {
    int64_t n = 1;
    for (int64_t d : p.shape) {
      if (d <= 0 || n > (int64_t{1} << 40) / d) {
        return InvalidArgument("parameter '" + p.name + "' of unit '" + name +
                               "': every dimension must be positive and the tensor under 2^40 elements");
      }
      n *= d;
    }
    if (p.group < 0 || p.group >= groups) {
      return InvalidArgument("parameter '" + p.name + "' of unit '" + name + "' is in parameter group " +
                             std::to_string(p.group) + ", but only groups 0.." + std::to_string(groups - 1) +
                             " are defined (AddParamGroup)");
    }
    u.tensor_names.push_back(p.name);
    u.tensor_groups.push_back(p.group);
    u.tensor_shapes.push_back(p.shape);
    u.tensor_offsets.push_back(total);
    total += n;
  }
  u.part = PartitionUnit(total, options_.world);
  // Stage 3: units up to stage3_param_persistence_threshold stay whole,
  // until they add up to stage3_model_persistence_threshold.
  u.partitioned = options_.stage == 3 && (total > options_.param_persistence_threshold ||
                                          persistent_elems_ + total > options_.model_persistence_threshold);
  // offload_param nvme: shards stay in host memory while they add up to
  // max_in_cpu elements; the others live in the parameter store.
  u.shard_on_nvme = u.partitioned && options_.param_offload && options_.param_nvme &&
                    cpu_shard_elems_ + u.part.shard_elems > options_.max_in_cpu;
  return u;
}

void UnitTable::Add(const UnitLayout& u) {
  names_.emplace(u.name, u.index);
  if (options_.stage == 3 && !u.partitioned) persistent_elems_ += u.part.num_elems;
  if (u.partitioned && options_.param_offload && !u.shard_on_nvme) cpu_shard_elems_ += u.part.shard_elems;
}

}  // namespace zinf::sched
