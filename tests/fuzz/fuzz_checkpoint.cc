// A checkpoint's metadata (checkpoint_tables.cc): the input is manifest.json
// followed by NUL-separated rank tables (rank-0.json, rank-1.json, ...). Any
// text is a set of tables or a kDataLoss naming the file; then every unit of
// the manifest and every (unit, kind) of the tables is planned for reading,
// whole and in pieces, and a plan that succeeds covers each element asked
// for.
#include <algorithm>
#include <limits>

#include "fuzz_util.h"
#include "sched/checkpoint_tables.h"

namespace {

void Plan(const zinf::sched::ckpt::CheckpointTables& t, const std::string& unit, const std::string& kind,
          int64_t elems) {
  using namespace zinf;
  const int64_t rest = elems > 0 ? elems - 1 : 0;
  for (auto [first, count] : {std::pair<int64_t, int64_t>{0, elems}, {elems / 3, elems / 2}, {elems, 0}, {1, rest}}) {
    auto plan = sched::ckpt::PlanRange(t, "ckpt", unit, kind, elems, first, count);
    if (!plan.ok()) {
      fuzz::CheckRejection(plan.status(), "checkpoint ckpt");
      continue;
    }
    ZINF_FUZZ_CHECK(sched::ckpt::CoveredElements(*plan, first, count) == count, "a plan that leaves elements unread");
    for (const sched::ckpt::SlicePart& p : *plan) {
      ZINF_FUZZ_CHECK(p.lo >= first && p.hi <= first + count && p.lo < p.hi, "a part outside the range");
      ZINF_FUZZ_CHECK(p.lo >= p.slice->begin && p.hi <= p.slice->begin + p.slice->count, "a part outside its slice");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zinf;
  const auto parts = fuzz::SplitParts(fuzz::AsText(data, size), 9);
  sched::ckpt::CheckpointTables t;
  Status s = sched::ckpt::ParseManifest(parts[0], "manifest.json", &t);
  if (!s.ok()) fuzz::CheckRejection(s, "manifest.json");
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string name = "rank-" + std::to_string(i - 1) + ".json";
    Status table = sched::ckpt::AddRankTable(parts[i], name, &t);
    if (!table.ok()) fuzz::CheckRejection(table, name);
  }
  for (const sched::ckpt::ManifestUnit& u : t.units) Plan(t, u.name, sched::ckpt::kStateKindNames[0], u.elements);
  for (const auto& [key, slices] : t.slices) {
    int64_t end = 0;
    for (const sched::ckpt::SliceEntry& sl : slices) {
      ZINF_FUZZ_CHECK(sl.begin >= 0 && sl.count >= 0 && sl.begin <= std::numeric_limits<int64_t>::max() - sl.count,
                      "a slice AddRankTable should have refused");
      end = std::max(end, sl.begin + sl.count);
    }
    Plan(t, key.first, key.second, end);
    Plan(t, key.first, key.second, end > 0 ? end - 1 : 0);
  }
  return 0;
}
