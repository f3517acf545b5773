#include "sched/checkpoint_tables.h"

#include <algorithm>
#include <limits>

#include "common/json_text.h"

namespace zinf::sched::ckpt {
namespace {

using json = nlohmann::json;
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
constexpr int kMaxWorldSize = 1 << 20;

Result<json> ParseObject(std::string_view text, const std::string& path) {
  auto parsed = ParseJsonText(text, path);
  if (!parsed.ok()) return DataLoss(parsed.status().message());
  if (!parsed->value.is_object()) {
    return DataLoss(path + ": expected a JSON object, found " + JsonSnippet(parsed->value));
  }
  return std::move(parsed->value);
}

// obj[key] as an integer in [min, max]; `where` names obj in messages.
Result<int64_t> IntField(const json& obj, const char* key, int64_t min, int64_t max, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return DataLoss(where + "." + key + " is missing");
  const bool fits = it->is_number_integer() && !(it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(kMaxInt64));
  if (!fits || it->get<int64_t>() < min || it->get<int64_t>() > max) {
    return DataLoss(where + "." + key + " is " + JsonSnippet(*it) + "; expected an integer in [" + std::to_string(min) +
                    ", " + std::to_string(max) + "]");
  }
  return it->get<int64_t>();
}

Result<uint64_t> UnsignedField(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return DataLoss(where + "." + key + " is missing");
  if (!it->is_number_unsigned()) {
    return DataLoss(where + "." + key + " is " + JsonSnippet(*it) + "; expected a non-negative integer");
  }
  return it->get<uint64_t>();
}

Result<std::string> StringField(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) {
    return DataLoss(where + "." + key + (it == obj.end() ? " is missing" : " is " + JsonSnippet(*it)) +
                    "; expected a string");
  }
  return it->get<std::string>();
}

}  // namespace

Status ParseManifest(std::string_view text, const std::string& path, CheckpointTables* t) {
  ZINF_ASSIGN_OR_RETURN(json m, ParseObject(text, path));
  auto format = m.find("format");
  if (format == m.end() || !format->is_number_integer() || format->get<int64_t>() != kCheckpointFormat) {
    return DataLoss(path + ": not a zinf checkpoint manifest of format " + std::to_string(kCheckpointFormat));
  }
  ZINF_ASSIGN_OR_RETURN(int64_t world, IntField(m, "world_size", 1, kMaxWorldSize, path + ": manifest"));
  auto units = m.find("units");
  if (units == m.end() || !units->is_array()) return DataLoss(path + ": manifest.units is missing or not a list");
  std::vector<ManifestUnit> list;
  for (size_t i = 0; i < units->size(); ++i) {
    const json& u = (*units)[i];
    const std::string where = path + ": manifest.units[" + std::to_string(i) + "]";
    if (!u.is_object()) return DataLoss(where + " is " + JsonSnippet(u) + "; expected an object");
    ManifestUnit unit;
    ZINF_ASSIGN_OR_RETURN(unit.name, StringField(u, "name", where));
    ZINF_ASSIGN_OR_RETURN(unit.elements, IntField(u, "elements", 0, kMaxInt64 / 4, where));
    list.push_back(std::move(unit));
  }
  t->manifest = std::move(m);
  t->world_size = static_cast<int>(world);
  t->units = std::move(list);
  return Status::Ok();
}

Status AddRankTable(std::string_view text, const std::string& path, CheckpointTables* t) {
  ZINF_ASSIGN_OR_RETURN(json table, ParseObject(text, path));
  ZINF_ASSIGN_OR_RETURN(std::string file, StringField(table, "file", path + ": table"));
  // The data file lives beside its table: a name, never a path elsewhere.
  if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
      file.find('\0') != std::string::npos) {
    return DataLoss(path + ": table.file is " + JsonSnippet(json(file)) +
                    "; expected a file name in the step directory");
  }
  auto tensors = table.find("tensors");
  if (tensors == table.end() || !tensors->is_array())
    return DataLoss(path + ": table.tensors is missing or not a list");
  const size_t file_index = t->files.size();
  std::vector<std::pair<std::pair<std::string, std::string>, SliceEntry>> entries;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const json& e = (*tensors)[i];
    const std::string where = path + ": tensors[" + std::to_string(i) + "]";
    if (!e.is_object()) return DataLoss(where + " is " + JsonSnippet(e) + "; expected an object");
    ZINF_ASSIGN_OR_RETURN(std::string unit, StringField(e, "unit", where));
    ZINF_ASSIGN_OR_RETURN(std::string kind, StringField(e, "kind", where));
    if (std::find(std::begin(kStateKindNames), std::end(kStateKindNames), kind) == std::end(kStateKindNames)) {
      return DataLoss(where + ".kind is " + JsonSnippet(json(kind)) + "; expected master, exp_avg or exp_avg_sq");
    }
    SliceEntry s;
    ZINF_ASSIGN_OR_RETURN(s.begin, IntField(e, "begin", 0, kMaxInt64, where));
    // count * 4 bytes, from offset, must stay below 2^63.
    ZINF_ASSIGN_OR_RETURN(s.count, IntField(e, "count", 0, (kMaxInt64 - s.begin) / 4, where));
    ZINF_ASSIGN_OR_RETURN(s.offset, UnsignedField(e, "offset", where));
    if (s.offset > uint64_t(kMaxInt64) - uint64_t(s.count) * 4) {
      return DataLoss(where + ": offset " + std::to_string(s.offset) + " and " + std::to_string(s.count) +
                      " elements run beyond 2^63 bytes");
    }
    ZINF_ASSIGN_OR_RETURN(s.xxh3, UnsignedField(e, "xxh3", where));
    s.file = file_index;
    entries.push_back({{std::move(unit), std::move(kind)}, s});
  }
  t->files.push_back(std::move(file));
  for (auto& [key, slice] : entries) t->slices[key].push_back(slice);
  return Status::Ok();
}

int64_t CoveredElements(std::vector<SlicePart> parts, int64_t first, int64_t count) {
  std::sort(parts.begin(), parts.end(), [](const SlicePart& a, const SlicePart& b) { return a.lo < b.lo; });
  int64_t covered = 0, reached = first;
  for (const SlicePart& p : parts) {
    const int64_t lo = std::max(p.lo, reached), hi = std::min(p.hi, first + count);
    if (hi > lo) {
      covered += hi - lo;
      reached = hi;
    }
  }
  return covered;
}

Result<std::vector<SlicePart>> PlanRange(const CheckpointTables& t, const std::string& dir, const std::string& unit,
                                         const std::string& kind, int64_t unit_elems, int64_t first, int64_t count) {
  if (count == 0) return std::vector<SlicePart>{};  // nothing asked, wherever (a shard of padding only)
  if (unit_elems < 0 || first < 0 || count < 0 || first > unit_elems - count) {
    return InvalidArgument("checkpoint " + dir + ": unit '" + unit + "' " + kind + ": elements [" +
                           std::to_string(first) + ", +" + std::to_string(count) + ") asked of a unit of " +
                           std::to_string(unit_elems));
  }
  std::vector<SlicePart> parts;
  auto it = t.slices.find({unit, kind});
  if (it != t.slices.end()) {
    for (const SliceEntry& sl : it->second) {
      // AddRankTable bounds begin and count, so begin + count does not overflow.
      if (sl.begin + sl.count > unit_elems) {
        return DataLoss("checkpoint " + dir + ": unit '" + unit + "' " + kind + " slice [" + std::to_string(sl.begin) +
                        ", " + std::to_string(sl.begin + sl.count) + ") is outside the unit (" +
                        std::to_string(unit_elems) + " elements)");
      }
      const int64_t lo = std::max(sl.begin, first), hi = std::min(sl.begin + sl.count, first + count);
      if (lo < hi) parts.push_back({&sl, lo, hi});
    }
  }
  // Each element once: a slice listed twice (or two overlapping) must not
  // stand in for elements no slice holds.
  const int64_t covered = CoveredElements(parts, first, count);
  if (covered != count) {
    return DataLoss("checkpoint " + dir + ": unit '" + unit + "' " + kind + " covers " + std::to_string(covered) +
                    " of the " + std::to_string(count) + " elements asked for");
  }
  return parts;
}

}  // namespace zinf::sched::ckpt
