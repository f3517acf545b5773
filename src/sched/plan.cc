// `zinf plan`'s arithmetic: the engine's allocations per rank and a step-time
// model, for every stage × offload combination (plan.h).
#include "sched/plan.h"

#include <nlohmann/json.hpp>

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "common/device_allocator.h"
#include "common/json_text.h"
#include "common/runtime_info.h"
#include "common/units.h"
#include "cpu/pinned_pool.h"
#include "sched/gradient_placement.h"
#include "sched/partition.h"
#include "sched/swap_schedule.h"

namespace zinf::sched {
namespace {

constexpr uint64_t kExtentBytes = uint64_t{1} << 20;  // the swap store's default extent

uint64_t Dev(uint64_t bytes) { return DeviceAllocator::RoundUp(bytes); }
uint64_t Pin(uint64_t bytes) { return cpu::PinnedPool::SizeClassBytes(std::max<uint64_t>(bytes, 1)); }

struct Items {
  std::vector<PlanItem> items;
  void Add(const std::string& what, uint64_t bytes) {
    if (bytes == 0) return;
    for (PlanItem& i : items) {
      if (i.what == what) {
        i.bytes += bytes;
        return;
      }
    }
    items.push_back({what, bytes});
  }
  uint64_t total() const {
    return std::accumulate(items.begin(), items.end(), uint64_t{0},
                           [](uint64_t s, const PlanItem& i) { return s + i.bytes; });
  }
};

Result<nlohmann::json> ParseJson(const std::string& text, const std::string& source) {
  ZINF_ASSIGN_OR_RETURN(ParsedJson parsed, ParseJsonText(text, source));
  if (!parsed.value.is_object()) return InvalidArgument(source + ": not a JSON object");
  return std::move(parsed.value);
}

// A field for a message: its JSON, or "?" when missing.
std::string FieldText(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? std::string("?") : JsonSnippet(*it);
}

// The readers below take files other tools wrote, which a user may have
// edited: a field of another type is an error naming the file, never an
// exception (nlohmann's value() throws on a type mismatch).
template <class F>
Status Guarded(const std::string& source, const char* what, F&& read) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(source + ": not the output of " + what + " (" + e.what() + ")");
  }
}

Result<double> PositiveNumber(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || !j[key].is_number() || !(j[key].get<double>() > 0)) {
    return InvalidArgument(source + ": expected a positive number at \"" + key + "\"");
  }
  return j[key].get<double>();
}

std::string Gb(double gbps) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g", gbps);
  return buf;
}

// Stage 3's device peak of gathered units and in-flight gradients, by
// replaying what the engine does over one micro-step that follows its
// recorded trace: forward fetches every unit (held ones stay fetched),
// backward fetches them in reverse order, writes each one's gradients and
// hands them to the reduce buckets; Fetch gathers ahead along the trace
// within stage3_prefetch_bucket_size and stage3_max_live_parameters, and
// Release keeps a unit used again within stage3_max_reuse_distance. The
// held units' gradients are written from the start of backward (the GPT
// head writes the tied embedding's).
struct Stage3Peak {
  uint64_t gathered = 0, grads = 0;  // at the moment their sum peaks
};

template <typename Partitioned>
Stage3Peak SimulateStage3(const PlanInput& in, const std::vector<UnitPartition>& parts, uint64_t esize,
                          const Partitioned& partitioned) {
  const ZeroConfig& z = in.config.zero;
  const size_t n = parts.size();
  auto is_held = [&](size_t u) {
    return std::find(in.model.held_units.begin(), in.model.held_units.end(), static_cast<int>(u)) !=
           in.model.held_units.end();
  };
  std::vector<int> trace;  // the recorded order: partitioned units only
  for (size_t u = 0; u < n; ++u) {
    if (partitioned(u)) trace.push_back(static_cast<int>(u));
  }
  for (size_t u = n; u-- > 0;) {
    if (partitioned(u)) trace.push_back(static_cast<int>(u));
  }
  std::vector<char> gathered(n, 0), has_grads(n, 0);
  int64_t live = 0;
  uint64_t gathered_bytes = 0, grad_bytes = 0;
  Stage3Peak peak;
  auto note = [&] {
    if (gathered_bytes + grad_bytes > peak.gathered + peak.grads) peak = {gathered_bytes, grad_bytes};
  };
  auto gather = [&](int u) {
    gathered[u] = 1;
    live += parts[u].padded_elems;
    gathered_bytes += Dev(static_cast<uint64_t>(parts[u].padded_elems) * esize);
    note();
  };
  auto drop = [&](int u) {
    gathered[u] = 0;
    live -= parts[u].padded_elems;
    gathered_bytes -= Dev(static_cast<uint64_t>(parts[u].padded_elems) * esize);
  };
  auto grads_bytes_of = [&](size_t u) { return Dev(static_cast<uint64_t>(parts[u].padded_elems) * 4); };
  size_t pos = 0;  // fetches so far
  auto fetch = [&](int u) {
    ++pos;
    if (!gathered[u]) gather(u);
    int64_t ahead = 0;
    for (size_t j = pos; j < trace.size(); ++j) {
      const int w = trace[j];
      if (gathered[w]) continue;
      if (ahead + parts[w].padded_elems > z.stage3_prefetch_bucket_size ||
          live + parts[w].padded_elems > z.stage3_max_live_parameters) {
        break;
      }
      gather(w);
      ahead += parts[w].padded_elems;
    }
  };
  auto keep_for_reuse = [&](int u) {
    if (live > z.stage3_max_live_parameters) return false;
    int64_t distance = 0;
    for (size_t j = pos; j < trace.size(); ++j) {
      if (trace[j] == u) return distance <= z.stage3_max_reuse_distance;
      distance += parts[trace[j]].padded_elems;
      if (distance > z.stage3_max_reuse_distance) return false;
    }
    return false;
  };
  auto release = [&](int u) {
    if (!keep_for_reuse(u)) drop(u);
  };
  for (size_t u = 0; u < n; ++u) {
    if (!partitioned(u)) continue;
    fetch(static_cast<int>(u));
    if (!is_held(u)) release(static_cast<int>(u));
  }
  for (size_t u = 0; u < n; ++u) {
    if (partitioned(u) && is_held(u)) {
      has_grads[u] = 1;
      grad_bytes += grads_bytes_of(u);
    }
  }
  note();
  std::vector<size_t> open;  // the open reduce bucket
  int64_t open_elems = 0;
  auto flush = [&] {
    for (size_t v : open) {
      if (has_grads[v]) grad_bytes -= grads_bytes_of(v), has_grads[v] = 0;
    }
    open.clear();
    open_elems = 0;
  };
  for (size_t u = n; u-- > 0;) {
    const int64_t P = parts[u].padded_elems;
    if (partitioned(u)) {
      fetch(static_cast<int>(u));
      if (!has_grads[u]) {
        has_grads[u] = 1;
        grad_bytes += grads_bytes_of(u);
        note();
      }
    }
    if (!open.empty() && open_elems + P > z.reduce_bucket_size && z.overlap_comm) flush();
    open.push_back(u);
    open_elems += P;
    if (partitioned(u)) release(static_cast<int>(u));
  }
  return peak;
}

}  // namespace

Result<PlanModel> PlanParamsModel(int64_t num_params, int units, int64_t tokens_per_micro_step) {
  if (num_params < 1) return InvalidArgument("--params must be >= 1");
  if (units < 1) return InvalidArgument("units must be >= 1");
  units = static_cast<int>(std::min<int64_t>(units, num_params));
  PlanModel m;
  const int64_t each = num_params / units;
  for (int u = 0; u < units; ++u) m.unit_elems.push_back(u + 1 < units ? each : num_params - each * (units - 1));
  m.description = FormatCount(static_cast<double>(num_params)) + " parameters in " + std::to_string(units) +
                  " units of ~" + std::to_string(each) + " elements (no model shape: units assumed)";
  m.activation_note = "not counted (no model shape: give --model for activations)";
  if (tokens_per_micro_step > 0) m.flops_per_micro_step = 6.0 * static_cast<double>(num_params) * tokens_per_micro_step;
  return m;
}

Status ApplyAdamJson(const std::string& json_text, const std::string& source, PlanRates& rates) {
  return Guarded(source, "`zinf bench adam --json`", [&]() -> Status {
    ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(json_text, source));
    if (j.value("bench", "") != "adam" || !j.contains("rows") || !j["rows"].is_array() || j["rows"].empty()) {
      return InvalidArgument(source +
                             ": not the output of `zinf bench adam --json` (no \"bench\": \"adam\" with rows)");
    }
    const nlohmann::json* best = nullptr;
    for (const auto& r : j["rows"]) {
      if (!r.is_object() || !r.contains("threads") || !r["threads"].is_number()) {
        return InvalidArgument(source + ": a row without \"threads\"");
      }
      if (!best || r["threads"].get<double>() > (*best)["threads"].get<double>()) best = &r;
    }
    ZINF_ASSIGN_OR_RETURN(double rate, PositiveNumber(*best, "params_per_s", source));
    ZINF_ASSIGN_OR_RETURN(double bytes, PositiveNumber(j, "bytes_per_param", source));
    rates.adam_params_per_s = {rate, source + " (" + FieldText(*best, "threads") + " threads, " +
                                         Gb(rate * bytes / 1e9) + " GB/s at " + Gb(bytes) + " B/param)"};
    rates.adam_bytes_per_param = bytes;
    return Status::Ok();
  });
}

// The rates of one point of a sweep.
Status ApplySweepPoint(const nlohmann::json& p, const std::string& source, PlanRates& rates) {
  ZINF_ASSIGN_OR_RETURN(double r, PositiveNumber(p, "read_gb_per_s", source));
  ZINF_ASSIGN_OR_RETURN(double w, PositiveNumber(p, "write_gb_per_s", source));
  const std::string at = source + " (recommended point: block " + FieldText(p, "block_size") + ", qd " +
                         FieldText(p, "queue_depth") + ", threads " + FieldText(p, "threads") + ")";
  rates.nvme_read_gbps = {r, at};
  rates.nvme_write_gbps = {w, at};
  return Status::Ok();
}

Status ApplyAioJson(const std::string& json_text, const std::string& source, PlanRates& rates) {
  return Guarded(source, "`zinf aio sweep --json` or `zinf aio read|write --json`", [&]() -> Status {
    ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(json_text, source));
    const std::string command = j.value("command", "");
    if (command == "aio sweep") {
      if (!j.contains("points") || !j["points"].is_array() || !j.contains("recommended")) {
        return InvalidArgument(source + ": `zinf aio sweep --json` output without \"points\" and \"recommended\"");
      }
      const auto& rec = j["recommended"];
      if (!rec.contains("aio") || !rec["aio"].is_object()) return InvalidArgument(source + ": no recommended.aio");
      const auto& a = rec["aio"];
      for (const auto& p : j["points"]) {
        if (p.value("block_size", -1.0) == a.value("block_size", -2.0) &&
            p.value("queue_depth", -1.0) == a.value("queue_depth", -2.0) &&
            p.value("threads", -1.0) == a.value("intra_op_parallelism", -2.0)) {
          return ApplySweepPoint(p, source, rates);
        }
      }
      return InvalidArgument(source + ": the recommended aio setting is not among the sweep's points");
    }
    if (command == "aio") {
      const std::string op = j.value("op", "");
      if ((op != "read" && op != "write") || !j.contains("median") || !j["median"].is_object()) {
        return InvalidArgument(source + ": `zinf aio read|write --json` output without \"op\" and \"median\"");
      }
      ZINF_ASSIGN_OR_RETURN(double g, PositiveNumber(j["median"], "gb_per_s", source));
      const std::string from = source + " (median of zinf aio " + op + ")";
      if (op == "read") {
        rates.nvme_read_gbps = {g, from};
      } else {
        rates.nvme_write_gbps = {g, from};
      }
      return Status::Ok();
    }
    return InvalidArgument(source +
                           ": not the output of `zinf aio sweep --json` or `zinf aio read|write --json` "
                           "(the file --output writes holds no throughput; use --json)");
  });
}

Status ApplyModelJson(const std::string& json_text, const std::string& source, PlanRates& rates) {
  return Guarded(source, "`zinf bench model --json`", [&]() -> Status {
    ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(json_text, source));
    if (j.value("bench", "") != "model" || !j.contains("phases") || !j["phases"].is_array()) {
      return InvalidArgument(source + ": not the output of `zinf bench model --json`");
    }
    for (const auto& p : j["phases"]) {
      if (p.value("phase", "") == "step") {
        ZINF_ASSIGN_OR_RETURN(double g, PositiveNumber(p, "gflop_per_s", source));
        rates.model_gflops = {g, source + " (" + j.value("preset", std::string("?")) + ", step phase)"};
        return Status::Ok();
      }
    }
    return InvalidArgument(source + ": no \"step\" phase");
  });
}

uint64_t PinnedBudgetBytes(const Config& config) {
  return config.zinf.host_memory > 0 ? config.zinf.host_memory : PhysicalMemoryBytes();
}

std::string PlanNvmePath(const Config& config) {
  const OffloadOptimizerConfig& o = config.zero.offload_optimizer;
  const OffloadParamConfig& p = config.zero.offload_param;
  if (o.device == OffloadDevice::kNvme && !o.nvme_path.empty()) return o.nvme_path.front();
  if (p.device == OffloadDevice::kNvme && !p.nvme_path.empty()) return p.nvme_path.front();
  if (!o.nvme_path.empty()) return o.nvme_path.front();
  if (!p.nvme_path.empty()) return p.nvme_path.front();
  return "";
}

Result<uint64_t> FreeBytesAt(const std::string& path) {
  struct statvfs st;
  if (statvfs(path.c_str(), &st) != 0) {
    const int err = errno;
    return IoError("statvfs " + path + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")");
  }
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

namespace {

// One stage × offload combination, counted in phases in the order the
// engine allocates (each tier's items keep that order in the row): the
// units, the device's buffers, the offloaded optimizer's staging (and with
// NVMe its sub-groups and gradients), the parameters' staging; then the
// totals against the capacities and the step time.
class CombinationCount {
 public:
  CombinationCount(const PlanInput& in, int stage, OffloadDevice optimizer, OffloadDevice param)
      : in_(in),
        z_(in.config.zero),
        stage_(stage),
        param_(param),
        N_(std::max(1, in.world_size)),
        esize_(DTypeSizeBytes(in.config.bf16.enabled   ? DType::kBFloat16
                              : in.config.fp16.enabled ? DType::kFloat16
                                                       : DType::kFloat32)),
        offload_(optimizer != OffloadDevice::kNone),
        nvme_(optimizer == OffloadDevice::kNvme),
        zero_copy_(offload_ && in.host_device && in.config.zinf.offload_zero_copy),
        k_(std::max<int64_t>(1, in.gradient_accumulation_steps)) {
    row_.stage = stage;
    row_.optimizer = optimizer;
    row_.param = param;
    row_.zero_formula = ModelStateBytes(in.model.num_params(), N_, stage, optimizer, param);
    for (int64_t n : in.model.unit_elems) parts_.push_back(PartitionUnit(std::max<int64_t>(n, 1), N_));
    shard_on_nvme_.assign(parts_.size(), 0);
  }

  PlanRow Count() && {
    CountUnits();
    CountDeviceBuffers();
    if (offload_) CountOffloadStaging();
    if (nvme_) CountNvmeOptimizer();
    CountParamStaging();
    SetTotals();
    CountStepTime();
    return std::move(row_);
  }

 private:
  int64_t owned(const UnitPartition& p) const { return stage_ == 0 ? p.padded_elems : p.shard_elems; }
  bool partitioned(size_t u) const {
    return stage_ == 3 && in_.model.unit_elems[u] > z_.stage3_param_persistence_threshold;
  }
  // As the engine: the reduced gradient read where it lies (engine_impl.h).
  bool grad_in_place(size_t u) const {
    return zero_copy_ && !nvme_ && k_ == 1 && !partitioned(u) && !(stage_ >= 2 && N_ > 1 && z_.contiguous_gradients);
  }

  // Per unit: its compute copy or parameter shard (device, pinned host or
  // the parameter store), its gradients, and the optimizer's state where it
  // is not on NVMe.
  void CountUnits() {
    for (size_t u = 0; u < parts_.size(); ++u) {
      const UnitPartition& p = parts_[u];
      const int64_t o = owned(p);
      max_owned_ = std::max(max_owned_, o);
      owned_total_ += o;
      blocks_ += o / kNormBlock;
      // Copied into the accumulator: every micro-step, or with zero copy the
      // first (the others add from where they lie), or never (in place).
      const int64_t copies = grad_in_place(u) ? 0 : zero_copy_ ? 1 : k_;
      accum_copy_total_ += copies * (offload_ ? o : (stage_ >= 2 ? p.shard_elems : p.padded_elems));
      if (partitioned(u)) {
        CountShard(u);
      } else {
        dev_.Add("compute copy", Dev(static_cast<uint64_t>(p.padded_elems) * esize_));
      }
      if (!partitioned(u)) dev_.Add("fp32 gradients", Dev(static_cast<uint64_t>(p.padded_elems) * 4));
      if (!offload_) {
        dev_.Add("fp32 gradient accumulator",
                 Dev(static_cast<uint64_t>(stage_ >= 2 ? p.shard_elems : p.padded_elems) * 4));
        dev_.Add("fp32 master, m, v", 3 * Dev(static_cast<uint64_t>(o) * 4));
      } else if (nvme_) {
        // Host memory or the swap store: decided in CountNvmeOptimizer, with
        // what else is pinned.
      } else {
        host_.Add("fp32 master, m, v", 3 * Pin(static_cast<uint64_t>(o) * 4));
        if (!grad_in_place(u)) host_.Add("fp32 gradient accumulator", Pin(static_cast<uint64_t>(o) * 4));
      }
    }
  }

  // A stage-3 unit's shard. offload_param nvme, as the engine: shards in
  // host memory up to max_in_cpu elements, the rest in the parameter store.
  void CountShard(size_t u) {
    const UnitPartition& p = parts_[u];
    const uint64_t shard = static_cast<uint64_t>(p.shard_elems) * esize_;
    const bool to_nvme =
        param_ == OffloadDevice::kNvme && cpu_shard_elems_ + p.shard_elems > z_.offload_param.max_in_cpu;
    if (param_ == OffloadDevice::kNone) {
      dev_.Add("compute copy (parameter shards)", Dev(shard));
    } else if (!to_nvme) {
      host_.Add(param_ == OffloadDevice::kCpu ? "parameter shards (offload_param)"
                                              : "parameter shards in host memory (offload_param max_in_cpu)",
                Pin(shard));
      if (param_ == OffloadDevice::kNvme) cpu_shard_elems_ += p.shard_elems;
    } else {
      disk_.Add("parameter shards (offload_param)", (shard + kExtentBytes - 1) / kExtentBytes * kExtentBytes);
      shard_on_nvme_[u] = 1;
      ++nvme_units_;
      max_nvme_shard_ = std::max(max_nvme_shard_, p.shard_elems);
    }
    if (param_ != OffloadDevice::kNone) max_host_shard_ = std::max(max_host_shard_, p.shard_elems);
  }

  // The device's buffers beyond the units': stage 3's gathered parameters
  // and gradients at their peak, norm partials, the reduce bucket, NCCL's
  // staging, activations and batch buffers.
  void CountDeviceBuffers() {
    if (stage_ == 3) {
      const Stage3Peak peak = SimulateStage3(in_, parts_, esize_, [this](size_t u) { return partitioned(u); });
      dev_.Add("gathered parameters (stage 3: fetched, prefetched and kept for reuse)", peak.gathered);
      dev_.Add("fp32 gradients (stage 3: from backward to their reduce bucket)", peak.grads);
    }
    dev_.Add("norm partials", Dev(static_cast<uint64_t>(blocks_) * (stage_ == 0 ? 1 : N_) * 8));
    // Stage 2/3 reduce buckets: units in backward order, greedily up to
    // reduce_bucket_size; a bucket of several units is packed into one buffer
    // (only with several ranks and contiguous_gradients).
    int64_t max_reduced = 0;  // the most elements one gradient reduction takes (all ranks' shares)
    for (const UnitPartition& p : parts_) max_reduced = std::max(max_reduced, p.padded_elems);
    if (stage_ >= 2 && N_ > 1 && z_.contiguous_gradients) {
      int64_t open = 0, open_units = 0, max_bucket = 0;
      auto close = [&] {
        if (open_units > 1) max_bucket = std::max(max_bucket, open);
        open = open_units = 0;
      };
      for (size_t i = parts_.size(); i-- > 0;) {
        if (open_units > 0 && open + parts_[i].padded_elems > z_.reduce_bucket_size) close();
        open += parts_[i].padded_elems;
        ++open_units;
      }
      close();
      if (max_bucket > 0) dev_.Add("reduce bucket", Dev(static_cast<uint64_t>(max_bucket) * 4));
      max_reduced = std::max(max_reduced, max_bucket);
    }
    // NCCL's deterministic reductions land the other ranks' chunks of this
    // rank's share in a staging buffer from the device budget while each runs:
    // (N - 1) × the share, fp32, at most one at a time (the engine stream).
    if (in_.reductions_on_device && N_ > 1) {
      dev_.Add("NCCL reduction staging (the largest gradient reduction)",
               Dev(static_cast<uint64_t>(N_ - 1) * static_cast<uint64_t>(max_reduced / N_) * 4));
    }
    dev_.Add("activations", in_.model.activation_bytes);
    dev_.Add("batch buffers", in_.model.io_buffer_bytes);
  }

  // With optimizer offload: the gradient staging and the parameter slots.
  void CountOffloadStaging() {
    if (zero_copy_) {  // nothing staged but the swapped gradients
      if (nvme_) host_.Add("gradient staging", Pin(static_cast<uint64_t>(max_owned_) * 4));
      return;
    }
    host_.Add("gradient staging", Pin(static_cast<uint64_t>(max_owned_) * 4));
    const int64_t slots = std::clamp<int64_t>(z_.offload_optimizer.buffer_count, 2, 64);
    host_.Add("parameter staging slots", slots * Pin(static_cast<uint64_t>(max_owned_) * esize_));
  }

  // offload_optimizer nvme. As the engine: units packed into sub-groups of
  // at most min(sub_group_size, 1 GiB of state); a larger unit alone, up to
  // one pinned buffer (gradient_placement.h).
  void CountNvmeOptimizer() {
    const int64_t cap = static_cast<int64_t>(cpu::PinnedPool::kMaxBufferBytes / 12);
    const int64_t limit = std::min<int64_t>(z_.sub_group_size, kSubGroupPackElems);
    std::vector<int64_t> groups;
    GradientPlacementInput gin;  // each unit's owned elements and sub-group, for the gradients below
    for (const UnitPartition& p : parts_) {
      const int64_t o = owned(p);
      if (o > cap) {
        row_.runnable = false;
        row_.note = "a unit has " + std::to_string(o) + " elements on a rank: its optimizer state exceeds one " +
                    FormatBytes(cpu::PinnedPool::kMaxBufferBytes) +
                    " swap buffer; split it or shard it over more ranks";
      }
      if (groups.empty() || groups.back() + o > limit) groups.push_back(0);
      groups.back() += o;
      gin.owned.push_back(o);
      gin.group_of_unit.push_back(static_cast<int>(groups.size()) - 1);
    }
    // As the engine: no more buffers than sub-groups, each fitting the
    // sub-groups that cycle through it.
    const int64_t buffers = std::min<int64_t>(std::clamp<int64_t>(z_.offload_optimizer.buffer_count, 1, 64),
                                              std::max<int64_t>(1, static_cast<int64_t>(groups.size())));
    uint64_t buffer_bytes = 0;
    for (int64_t e : SwapSchedule::BufferElems(groups, static_cast<size_t>(buffers))) {
      buffer_bytes += Pin(static_cast<uint64_t>(e) * 12);
    }
    host_.Add(
        "NVMe swap buffers (" + std::to_string(buffers) + " for " + std::to_string(groups.size()) + " sub-groups)",
        buffer_bytes);
    for (int64_t g : groups) {
      disk_.Add("fp32 master, m, v", (static_cast<uint64_t>(g) * 12 + kExtentBytes - 1) / kExtentBytes * kExtentBytes);
    }
    gin.buffers = buffers;
    gin.state_buffer_bytes = buffer_bytes;
    CountNvmeGradients(gin);
  }

  // Gradients, as the engine places them: pinned host memory while the host
  // budget allows (the first units first), else the swap store through a
  // gradient buffer per swap buffer and two staging buffers.
  void CountNvmeGradients(GradientPlacementInput& gin) {
    uint64_t others = 0;  // what the engine has pinned when it decides
    for (const PlanItem& i : host_.items) others += i.bytes;
    others -= gin.state_buffer_bytes;
    if (nvme_units_ > 0) {
      others += 2 * Pin((static_cast<uint64_t>(max_nvme_shard_) * esize_ + 4095) / 4096 * 4096);
    }
    const uint64_t budget = in_.host_memory;
    gin.home = in_.config.zinf.gradients;
    gin.available = budget == 0 ? UINT64_MAX : budget > others ? budget - others : 0;
    const GradientPlacement place = PlaceGradients(gin);
    if (!place.swap) {
      host_.Add("fp32 gradient accumulator", place.host_bytes);
      return;
    }
    host_.Add("NVMe gradient buffers (" + std::to_string(gin.buffers) + " x a sub-group's gradients, 2 staging)",
              place.buffer_bytes);
    // Short even of these buffers, every gradient is swapped (and the row
    // does not fit).
    if (place.host_bytes > 0) host_.Add("fp32 gradient accumulator (the units host memory holds)", place.host_bytes);
    disk_.Add("fp32 gradients (swapped: host memory short)", place.nvme_bytes);
    grad_swap_bytes_ += place.nvme_bytes;
  }

  // offload_param: the update's device scratch without optimizer offload,
  // and with shards on NVMe the two staging buffers (a shard larger than
  // buffer_size cannot run).
  void CountParamStaging() {
    if (param_ != OffloadDevice::kNone && !offload_ && max_host_shard_ > 0) {
      dev_.Add("parameter update scratch (offload_param, one shard)",
               Dev(static_cast<uint64_t>(max_host_shard_) * esize_));
    }
    if (nvme_units_ == 0) return;
    const uint64_t padded = (static_cast<uint64_t>(max_nvme_shard_) * esize_ + 4095) / 4096 * 4096;
    host_.Add("parameter staging buffers (offload_param nvme: gathers' and updates', the largest shard each)",
              2 * Pin(padded));
    if (max_nvme_shard_ > z_.offload_param.buffer_size) {
      row_.runnable = false;
      row_.note = "offload_param.buffer_size " + std::to_string(z_.offload_param.buffer_size) +
                  " is smaller than a parameter shard (" + std::to_string(max_nvme_shard_) + " elements): raise it";
    }
  }

  void SetTotals() {
    row_.device_items = dev_.items;
    row_.host_items = host_.items;
    row_.nvme_items = disk_.items;
    row_.device_bytes = dev_.total();
    row_.host_bytes = host_.total();
    row_.nvme_bytes = disk_.total();
    row_.fits_device = in_.device_memory == 0 || row_.device_bytes <= in_.device_memory;
    row_.fits_host = in_.host_memory == 0 || row_.host_bytes <= in_.host_memory;
    row_.fits_nvme = in_.nvme_free == 0 || row_.nvme_bytes <= in_.nvme_free;
  }

  // Step time, per optimizer step of k micro-steps.
  void CountStepTime() {
    const PlanRates& r = in_.rates;
    const double k = static_cast<double>(k_);
    const double esize = static_cast<double>(esize_);
    row_.compute_s = k * in_.model.flops_per_micro_step / (r.model_gflops.value * 1e9);
    // Copies and passes: the reduced gradient into the accumulator (to the
    // host with offload) every micro-step; stage 3 on one rank copies each
    // partitioned unit's shard into its gathered buffer per fetch (forward and
    // backward; held units once); at the boundary the norm reads the owned
    // gradients and, with offload, the new compute copy comes back.
    double copy_bytes = static_cast<double>(accum_copy_total_) * 4;
    double comm_bytes = 0, shard_read_bytes = 0, shard_write_bytes = 0;
    const double share = static_cast<double>(N_ - 1) / N_;
    for (size_t u = 0; u < parts_.size(); ++u) {
      const double P = static_cast<double>(parts_[u].padded_elems);
      if (partitioned(u)) {
        const bool held = std::find(in_.model.held_units.begin(), in_.model.held_units.end(), static_cast<int>(u)) !=
                          in_.model.held_units.end();
        const double gathers = k * (held ? 1 : 2);
        if (N_ == 1)
          copy_bytes += gathers * P * esize;
        else
          comm_bytes += gathers * P * esize * share;
        if (shard_on_nvme_[u]) {
          const double shard = static_cast<double>(parts_[u].shard_elems) * esize;
          shard_read_bytes += gathers * shard;
          shard_write_bytes += shard;
        }
      }
      if (N_ > 1) {
        comm_bytes += k * P * 4 * (stage_ < 2 ? 2 * share : share);           // all-reduce / reduce-scatter
        if (stage_ >= 1 && !partitioned(u)) comm_bytes += P * esize * share;  // the new shards gathered
      }
    }
    copy_bytes += static_cast<double>(owned_total_) * 4;
    if (offload_ && !zero_copy_) copy_bytes += static_cast<double>(owned_total_) * esize;
    row_.copy_s = copy_bytes / (r.copy_gbps.value * 1e9);
    row_.comm_s = comm_bytes / (r.comm_gbps.value * 1e9);
    const double extra = esize_ < 4 ? esize : 8.0;  // the compute copy written (fp32: a memcpy)
    row_.optimizer_s =
        static_cast<double>(owned_total_) / r.adam_params_per_s.value * (28.0 + extra) / r.adam_bytes_per_param;
    if (nvme_) {
      const double state = static_cast<double>(owned_total_) * 12;
      row_.nvme_s = state / (r.nvme_read_gbps.value * 1e9) + state / (r.nvme_write_gbps.value * 1e9);
      // Swapped gradients: written each micro-step, read back for each later
      // micro-step's accumulation and once for the update.
      const double grads = k * static_cast<double>(grad_swap_bytes_);
      row_.nvme_s += grads / (r.nvme_read_gbps.value * 1e9) + grads / (r.nvme_write_gbps.value * 1e9);
    }
    row_.nvme_s += shard_write_bytes / (r.nvme_write_gbps.value * 1e9);
    row_.param_read_s = shard_read_bytes / (r.nvme_read_gbps.value * 1e9);
    row_.step_s = std::max(row_.compute_s, row_.param_read_s) + row_.copy_s + row_.comm_s +
                  std::max(row_.optimizer_s, row_.nvme_s);
  }

  const PlanInput& in_;
  const ZeroConfig& z_;
  const int stage_;
  const OffloadDevice param_;
  const int N_;
  const uint64_t esize_;  // bytes of the compute dtype
  const bool offload_;    // the optimizer on the host (cpu or nvme)
  const bool nvme_;       // the optimizer's state on NVMe
  const bool zero_copy_;  // offload on the CPU device without staging copies
  const int64_t k_;       // micro-steps per optimizer step
  std::vector<UnitPartition> parts_;
  PlanRow row_;
  Items dev_, host_, disk_;
  int64_t max_owned_ = 0, owned_total_ = 0, blocks_ = 0, max_host_shard_ = 0;
  int64_t accum_copy_total_ = 0;  // gradient elements copied into accumulators per step
  int64_t cpu_shard_elems_ = 0, max_nvme_shard_ = 0, nvme_units_ = 0;  // offload_param nvme
  uint64_t grad_swap_bytes_ = 0;  // offload_optimizer nvme: gradients in the swap store
  std::vector<char> shard_on_nvme_;
};

}  // namespace

PlanRow PlanCombination(const PlanInput& in, int stage, OffloadDevice optimizer, OffloadDevice param) {
  return CombinationCount(in, stage, optimizer, param).Count();
}

std::vector<PlanRow> PlanAll(const PlanInput& input) {
  std::vector<PlanRow> rows;
  const OffloadDevice tiers[] = {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme};
  for (int stage = 0; stage <= 3; ++stage) {
    for (OffloadDevice param : tiers) {
      if (stage < 3 && param != OffloadDevice::kNone) continue;
      for (OffloadDevice opt : tiers) rows.push_back(PlanCombination(input, stage, opt, param));
    }
  }
  return rows;
}

std::string PlanToJson(const PlanInput& in, const std::vector<PlanRow>& rows) {
  auto cap = [](uint64_t v) { return v == 0 ? nlohmann::json(nullptr) : nlohmann::json(v); };
  auto rate = [](const PlanRate& r) { return nlohmann::json{{"value", r.value}, {"source", r.source}}; };
  auto items = [](const std::vector<PlanItem>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const PlanItem& i : v) a.push_back({{"what", i.what}, {"bytes", i.bytes}});
    return a;
  };
  nlohmann::json j = {
      {"command", "plan"},
      {"model",
       {{"description", in.model.description},
        {"params", in.model.num_params()},
        {"units", in.model.unit_elems.size()},
        {"activation_bytes", in.model.activation_bytes},
        {"activations", in.model.activation_note},
        {"flops_per_micro_step", in.model.flops_per_micro_step}}},
      {"ranks", in.world_size},
      {"reductions_on_device", in.reductions_on_device},
      {"host_device", in.host_device},
      {"gradient_accumulation_steps", in.gradient_accumulation_steps},
      {"compute_dtype", in.config.bf16.enabled   ? "bf16"
                        : in.config.fp16.enabled ? "fp16"
                                                 : "fp32"},
      {"capacity", {{"device", cap(in.device_memory)}, {"host", cap(in.host_memory)}, {"nvme", cap(in.nvme_free)}}},
      {"rates",
       {{"adam_params_per_s", rate(in.rates.adam_params_per_s)},
        {"adam_bytes_per_param", in.rates.adam_bytes_per_param},
        {"nvme_read_gb_per_s", rate(in.rates.nvme_read_gbps)},
        {"nvme_write_gb_per_s", rate(in.rates.nvme_write_gbps)},
        {"model_gflop_per_s", rate(in.rates.model_gflops)},
        {"copy_gb_per_s", rate(in.rates.copy_gbps)},
        {"comm_gb_per_s", rate(in.rates.comm_gbps)}}},
      {"rows", nlohmann::json::array()}};
  for (const PlanRow& r : rows) {
    j["rows"].push_back(
        {{"stage", r.stage},
         {"offload_optimizer", std::string(OffloadDeviceName(r.optimizer))},
         {"offload_param", std::string(OffloadDeviceName(r.param))},
         {"runnable", r.runnable},
         {"note", r.note},
         {"device_bytes", r.device_bytes},
         {"host_bytes", r.host_bytes},
         {"nvme_bytes", r.nvme_bytes},
         {"device", items(r.device_items)},
         {"host", items(r.host_items)},
         {"nvme", items(r.nvme_items)},
         {"zero_formula",
          {{"device", r.zero_formula.device}, {"host", r.zero_formula.host}, {"nvme", r.zero_formula.nvme}}},
         {"fits", {{"device", r.fits_device}, {"host", r.fits_host}, {"nvme", r.fits_nvme}, {"all", r.fits()}}},
         {"seconds",
          {{"compute", r.compute_s},
           {"copies", r.copy_s},
           {"comm", r.comm_s},
           {"optimizer", r.optimizer_s},
           {"nvme", r.nvme_s},
           {"param_read", r.param_read_s},
           {"step", r.step_s}}}});
  }
  return j.dump(2);
}

}  // namespace zinf::sched
