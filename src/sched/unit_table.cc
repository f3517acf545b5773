#include "sched/unit_table.h"

namespace zinf {
namespace sched {

Result<UnitLayout> UnitTable::Layout(const std::string& name, const std::vector<ParamSpec>& params) const {
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
    u.tensor_names.push_back(p.name);
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

}  // namespace sched
}  // namespace zinf
