// Checkpoint metadata as untrusted input (checkpoint_tables.h) and the
// reader's promise that follows from it: every element a caller asks for is
// read from some slice, or the read is kDataLoss.
#include "sched/checkpoint_io.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "sched/checkpoint_tables.h"
#include "test_util.h"

namespace zinf::sched::ckpt {
namespace {

std::string Manifest(const std::string& units, int world = 1) {
  return R"({"format": 2, "world_size": )" + std::to_string(world) + R"(, "units": )" + units + "}";
}

std::string Slice(int64_t begin, int64_t count, uint64_t offset, uint64_t xxh3 = 0, const char* kind = "master") {
  return R"({"unit": "u", "kind": ")" + std::string(kind) + R"(", "begin": )" + std::to_string(begin) +
         R"(, "count": )" + std::to_string(count) + R"(, "offset": )" + std::to_string(offset) + R"(, "xxh3": )" +
         std::to_string(xxh3) + "}";
}

std::string Table(const std::vector<std::string>& slices, const std::string& file = "rank-0.bin") {
  std::string list;
  for (const auto& s : slices) list += (list.empty() ? "" : ", ") + s;
  return R"({"file": ")" + file + R"(", "align": 4096, "tensors": [)" + list + "]}";
}

std::string ManifestError(const std::string& text) {
  CheckpointTables t;
  Status s = ParseManifest(text, "m.json", &t);
  EXPECT_FALSE(s.ok()) << text;
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  return s.message();
}

std::string TableError(const std::string& text) {
  CheckpointTables t;
  Status s = AddRankTable(text, "rank-0.json", &t);
  EXPECT_FALSE(s.ok()) << text;
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  return s.message();
}

TEST(CheckpointTablesTest, DamagedManifestsNameTheKey) {
  EXPECT_NE(ManifestError("{").find("m.json:1:2: malformed JSON"), std::string::npos);
  EXPECT_NE(ManifestError(R"({"format": 1})").find("not a zinf checkpoint manifest of format 2"), std::string::npos);
  EXPECT_NE(ManifestError(Manifest("[]", 0)).find("manifest.world_size is 0"), std::string::npos);
  EXPECT_NE(ManifestError(R"({"format": 2, "world_size": 1e300, "units": []})").find("world_size is 1e+300"),
            std::string::npos);
  EXPECT_NE(ManifestError(Manifest(R"([{"name": "u", "elements": -1}])")).find("units[0].elements is -1"),
            std::string::npos);
  EXPECT_NE(ManifestError(Manifest(R"([{"name": 7, "elements": 1}])")).find("units[0].name is 7"), std::string::npos);
  EXPECT_NE(ManifestError(std::string(100000, '[') + std::string(100000, ']')).find("nests deeper"), std::string::npos);
}

TEST(CheckpointTablesTest, DamagedTablesNameTheSlice) {
  EXPECT_NE(TableError(Table({}, "../../etc/passwd")).find("table.file is \"../../etc/passwd\""), std::string::npos);
  EXPECT_NE(TableError(Table({Slice(-1, 4, 0)})).find("tensors[0].begin is -1"), std::string::npos);
  EXPECT_NE(TableError(Table({Slice(0, 4, 0, 0, "momentum")})).find("tensors[0].kind is \"momentum\""),
            std::string::npos);
  // begin + count and count * 4 + offset would overflow.
  EXPECT_NE(TableError(Table({Slice(INT64_MAX - 1, 10, 0)})).find("tensors[0].count is 10"), std::string::npos);
  EXPECT_NE(TableError(Table({Slice(0, 4, UINT64_MAX - 8)})).find("run beyond 2^63 bytes"), std::string::npos);
  EXPECT_NE(TableError(R"({"file": "rank-0.bin", "tensors": [{"unit": "u", "kind": "master", "begin": 0,
                           "count": 4.5, "offset": 0, "xxh3": 0}]})")
                .find("tensors[0].count is 4.5"),
            std::string::npos);
}

// The reproducer of the data loss: a table listing [0, 4) twice for a unit
// of 8 elements summed to 8 "covered" elements, and ReadRanges returned OK
// with [4, 8) never read.
TEST(CheckpointTablesTest, ASliceListedTwiceCoversItsElementsOnce) {
  CheckpointTables t;
  ASSERT_TRUE(AddRankTable(Table({Slice(0, 4, 0), Slice(0, 4, 0)}), "rank-0.json", &t).ok());
  auto plan = PlanRange(t, "ckpt", "u", "master", 8, 0, 8);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(plan.status().message().find("unit 'u' master covers 4 of the 8 elements asked for"), std::string::npos)
      << plan.status().message();
  // Overlapping slices that do hold every element are fine.
  ASSERT_TRUE(AddRankTable(Table({Slice(2, 6, 4096)}, "rank-1.bin"), "rank-1.json", &t).ok());
  auto whole = PlanRange(t, "ckpt", "u", "master", 8, 0, 8);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->size(), 3u);
  EXPECT_EQ(CoveredElements(*whole, 0, 8), 8);
  EXPECT_FALSE(PlanRange(t, "ckpt", "u", "master", 6, 0, 6).ok());  // a slice beyond the unit
  EXPECT_EQ(PlanRange(t, "ckpt", "u", "master", 8, 4, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(PlanRange(t, "ckpt", "u", "master", 8, 12, 0).value().empty());  // nothing asked
}

class CheckpointReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = zinf::test::TestDir() + "/checkpoint_io_test/" + info->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    io_ = std::move(nvme::IoEngine::Create(nvme::IoEngineOptions{})).value();
    // Elements 0..7 of unit "u" as two slices, each padded to 4 KiB.
    std::vector<char> bin(8192, 0);
    for (int i = 0; i < 8; ++i) values_[i] = static_cast<float>(i) + 0.5f;
    std::memcpy(bin.data(), values_, 16);
    std::memcpy(bin.data() + 4096, values_ + 4, 16);
    Write("rank-0.bin", std::string(bin.begin(), bin.end()));
    sum_lo_ = Checksum(values_, 16);
    sum_hi_ = Checksum(values_ + 4, 16);
  }
  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
  }
  Result<std::unique_ptr<CheckpointReader>> Open() { return CheckpointReader::Open(*io_, dir_); }

  std::string dir_;
  std::unique_ptr<nvme::IoEngine> io_;
  float values_[8];
  uint64_t sum_lo_ = 0, sum_hi_ = 0;
};

TEST_F(CheckpointReaderTest, ReadsEveryElement) {
  Write("manifest.json", Manifest(R"([{"name": "u", "elements": 8}])"));
  Write("rank-0.json", Table({Slice(0, 4, 0, sum_lo_), Slice(4, 4, 4096, sum_hi_)}));
  auto r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ((*r)->units().size(), 1u);
  EXPECT_EQ((*r)->units()[0].elements, 8);
  float out[8] = {};
  ASSERT_TRUE((*r)->ReadRange("u", 0, 8, 0, 8, out).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], values_[i]);
}

TEST_F(CheckpointReaderTest, ASliceListedTwiceIsDataLossNotASilentGap) {
  // The manifest names no unit, so Open passes; the read itself must refuse.
  Write("manifest.json", Manifest("[]"));
  Write("rank-0.json", Table({Slice(0, 4, 0, sum_lo_), Slice(0, 4, 0, sum_lo_)}));
  auto r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  float out[8] = {};
  Status s = (*r)->ReadRange("u", 0, 8, 0, 8, out);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("covers 4 of the 8 elements"), std::string::npos) << s.ToString();
  // With the unit in the manifest, Open already says so.
  Write("manifest.json", Manifest(R"([{"name": "u", "elements": 8}])"));
  auto again = Open();
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("covers 4 of the 8 elements"), std::string::npos)
      << again.status().ToString();
}

// A manifest unit sizes buffers (zinf export allocates it whole): it must be
// held by slices that lie within the real data file.
TEST_F(CheckpointReaderTest, SizesAreBoundedByTheDataFile) {
  Write("manifest.json", Manifest(R"([{"name": "u", "elements": 1000000000000}])"));
  Write("rank-0.json", Table({Slice(0, 4, 0, sum_lo_), Slice(4, 4, 4096, sum_hi_)}));
  auto r = Open();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  Write("manifest.json", Manifest(R"([{"name": "u", "elements": 1000000000000}])"));
  Write("rank-0.json", Table({Slice(0, 1000000000000, 0, sum_lo_)}));
  r = Open();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("checkpoint file truncated: " + dir_ + "/rank-0.bin is 8192 bytes"),
            std::string::npos)
      << r.status().ToString();
  Write("rank-0.json", Table({Slice(0, 4, 0, sum_lo_)}, "missing.bin"));
  r = Open();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("checkpoint file missing: " + dir_ + "/missing.bin"), std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace zinf::sched::ckpt
