// The metadata of a zinf checkpoint, read as untrusted input without
// touching its data: the manifest (step-N/manifest.json) and each saving
// rank's table (rank-R.json: its data file and slices), and the plan of
// which slices serve a range of a unit's elements. CheckpointReader
// (checkpoint_io.h) does the I/O around these; they are separate so that
// every check here can be tested, and fuzzed, on text alone.
//
// What is checked, each failure a kDataLoss naming the file and the key:
// JSON that is malformed or nests too deep; a manifest without format 2, a
// world size in [1, 2^20] or a list of units with a string name and a
// non-negative integer element count; a rank table without a data file that
// is a plain name in the step directory, or with a slice whose fields are
// not integers, whose element range is negative or overflows, or whose bytes
// would end beyond 2^63. Coverage is checked by PlanRange: every element
// asked for must lie in some slice (slices listed twice or overlapping count
// once).
// Thread-safety: pure functions; a CheckpointTables is read-only once built.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zinf/status.h"

namespace zinf::sched::ckpt {

inline constexpr int kCheckpointFormat = 2;
inline constexpr const char* kStateKindNames[3] = {"master", "exp_avg", "exp_avg_sq"};

struct SliceEntry {
  int64_t begin = 0, count = 0;   // elements [begin, begin + count) of the unit
  uint64_t offset = 0, xxh3 = 0;  // byte offset in the data file, checksum of count * 4 bytes
  size_t file = 0;                // index into CheckpointTables::files
};

struct ManifestUnit {
  std::string name;
  int64_t elements = 0;
};

struct CheckpointTables {
  nlohmann::json manifest;
  int world_size = 0;
  std::vector<ManifestUnit> units;
  std::vector<std::string> files;  // per table added: its data file's name, relative to the step directory
  std::map<std::pair<std::string, std::string>, std::vector<SliceEntry>> slices;  // (unit, kind) -> slices
};

// Reads manifest.json's text into tables->manifest, world_size and units.
// Errors start with `path`.
Status ParseManifest(std::string_view text, const std::string& path, CheckpointTables* tables);
// Adds one rank table (rank-R.json's text): its data file and slices.
// Errors start with `path`.
Status AddRankTable(std::string_view text, const std::string& path, CheckpointTables* tables);

// One slice's share of a range: elements [lo, hi) of the unit, which the
// slice holds at positions lo - slice->begin onwards.
struct SlicePart {
  const SliceEntry* slice;
  int64_t lo, hi;
};
// The slices of (unit, kind) that hold elements [first, first + count) of a
// unit of `unit_elems` elements, in table order. kDataLoss naming `dir`, the
// unit and the count when a slice lies outside the unit or an element asked
// for lies in no slice; kInvalidArgument for a range outside the unit (an
// empty range is always fine, and plans nothing).
Result<std::vector<SlicePart>> PlanRange(const CheckpointTables& tables, const std::string& dir,
                                         const std::string& unit, const std::string& kind, int64_t unit_elems,
                                         int64_t first, int64_t count);

// How many of the elements [first, first + count) the parts cover, each
// element once (sorted union of [lo, hi)).
int64_t CoveredElements(std::vector<SlicePart> parts, int64_t first, int64_t count);

}  // namespace zinf::sched::ckpt
