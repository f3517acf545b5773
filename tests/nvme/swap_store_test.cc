// The swap store on both I/O backends: striping, read-before-write, checksums,
// failed writes, space reservation, clean shutdown and crash leftovers.
#include "nvme/swap_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "nvme/fault_file.h"
#include "nvme_test_util.h"

namespace zinf::nvme {
namespace {

using testing::Aligned;
using testing::FillRandom;
using testing::FreshDir;

class SwapStoreTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    IoEngineOptions o;
    o.backend = GetParam();
    o.block_size = 64 << 10;
    o.queue_depth = 8;
    o.rings = 2;
    engine_ = std::move(IoEngine::Create(o)).value();
    root_ = FreshDir();
  }
  std::string Dir(const std::string& name) {
    std::string d = root_ + "/" + name;
    std::filesystem::create_directories(d);
    return d;
  }
  std::unique_ptr<SwapStore> MakeStore(SwapStoreOptions o) {
    auto s = SwapStore::Create(*engine_, o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(s).value();
  }
  std::unique_ptr<IoEngine> engine_;
  std::string root_;
};

TEST_P(SwapStoreTest, StripesOverTwoDirectoriesAndReadsBackWhatWasWritten) {
  SwapStoreOptions o;
  o.dirs = {Dir("a"), Dir("b")};
  o.capacity_bytes = 8 << 20;
  o.extent_bytes = 64 << 10;
  auto store = MakeStore(o);
  ASSERT_EQ(store->file_paths().size(), 2u);

  const uint64_t sizes[] = {(1 << 20) + 100, 4096, 3 * (64 << 10), 1};
  for (uint64_t id = 0; id < 4; ++id) ASSERT_TRUE(store->Allocate(id, sizes[id]).ok());
  std::vector<testing::AlignedBuffer> data;
  for (uint64_t id = 0; id < 4; ++id) {
    uint64_t padded = *store->PaddedBytes(id);
    EXPECT_EQ(padded % 4096, 0u);
    data.push_back(Aligned(padded));
    FillRandom(data.back().get(), sizes[id], 50 + id);
    ASSERT_TRUE(store->Write(id, data.back().get()).Wait().ok());
  }
  for (uint64_t id = 0; id < 4; ++id) {
    auto back = Aligned(*store->PaddedBytes(id));
    Status st = store->Read(id, back.get()).Wait();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(std::memcmp(back.get(), data[id].get(), sizes[id]), 0) << "tensor " << id;
  }
  // Tensor 0's second extent lives at the start of the second file.
  std::ifstream raw(store->file_paths()[1], std::ios::binary);
  std::vector<char> head(64 << 10);
  raw.read(head.data(), head.size());
  EXPECT_EQ(std::memcmp(head.data(), data[0].get() + (64 << 10), 64 << 10), 0);
  EXPECT_EQ(store->bytes_reserved(), 8u << 20);
}

TEST_P(SwapStoreTest, ReadBeforeWriteIsRefused) {
  SwapStoreOptions o;
  o.dirs = {Dir("a")};
  o.capacity_bytes = 1 << 20;
  auto store = MakeStore(o);
  ASSERT_TRUE(store->Allocate(7, 8192).ok());
  auto buf = Aligned(8192);
  Status st = store->Read(7, buf.get()).Wait();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("tensor 7 is read before it was written"), std::string::npos) << st.message();
  EXPECT_EQ(store->Read(8, buf.get()).Wait().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->Allocate(7, 10).code(), StatusCode::kAlreadyExists);
}

TEST_P(SwapStoreTest, ChecksumMismatchIsDataLossNamingTensorPathAndOffset) {
  SwapStoreOptions o;
  o.dirs = {Dir("a"), Dir("b")};
  o.capacity_bytes = 4 << 20;
  o.extent_bytes = 64 << 10;
  o.checksums = true;
  auto store = MakeStore(o);
  ASSERT_TRUE(store->Allocate(3, 256 << 10).ok());
  auto data = Aligned(256 << 10), back = Aligned(256 << 10);
  FillRandom(data.get(), 256 << 10, 4);
  ASSERT_TRUE(store->Write(3, data.get()).Wait().ok());
  ASSERT_TRUE(store->Read(3, back.get()).Wait().ok());

  // Flip one byte of the tensor's third extent (file a, offset 64 KiB + 10).
  int fd = ::open(store->file_paths()[0].c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte;
  ASSERT_EQ(::pread(fd, &byte, 1, (64 << 10) + 10), 1);
  byte ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &byte, 1, (64 << 10) + 10), 1);
  ::fsync(fd);
  ::close(fd);
  Status st = store->Read(3, back.get()).Wait();
  ASSERT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("tensor 3: checksum mismatch in " + store->file_paths()[0] + " offset=65536"),
            std::string::npos)
      << st.message();
}

TEST_P(SwapStoreTest, AFailedWriteLeavesTheTensorUnreadable) {
  SwapStoreOptions o;
  o.dirs = {Dir("a")};
  o.capacity_bytes = 1 << 20;
  FaultPlan plan;
  plan.fail_attempt = 1;
  o.open_file = [&](const std::string& path, const FileOptions& fo) -> Result<std::shared_ptr<File>> {
    ZINF_ASSIGN_OR_RETURN(auto f, FaultInjectingFile::Open(path, fo, plan));
    return std::shared_ptr<File>(f);
  };
  auto store = MakeStore(o);
  ASSERT_TRUE(store->Allocate(1, 256 << 10).ok());
  auto data = Aligned(256 << 10);
  Status w = store->Write(1, data.get()).Wait();
  ASSERT_EQ(w.code(), StatusCode::kIoError);
  EXPECT_NE(w.message().find("swap out tensor 1: pwrite " + store->file_paths()[0]), std::string::npos) << w.message();
  Status r = store->Read(1, data.get()).Wait();
  EXPECT_EQ(r.code(), StatusCode::kDataLoss);
  EXPECT_NE(r.message().find("its last write failed"), std::string::npos) << r.message();
  // A complete rewrite makes it readable again.
  ASSERT_TRUE(store->Write(1, data.get()).Wait().ok());
  EXPECT_TRUE(store->Read(1, data.get()).Wait().ok());
}

TEST_P(SwapStoreTest, NotEnoughSpaceIsAnErrorBeforeAnythingIsWritten) {
  SwapStoreOptions o;
  o.dirs = {Dir("a"), Dir("b")};
  o.capacity_bytes = 1ull << 60;  // an exbibyte
  auto s = SwapStore::Create(*engine_, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kIoError);
  const std::string& m = s.status().message();
  EXPECT_NE(m.find("not enough space for the swap store"), std::string::npos) << m;
  EXPECT_NE(m.find(o.dirs[0] + " needs 512.00 PiB"), std::string::npos) << m;
  EXPECT_NE(m.find("available"), std::string::npos) << m;
  EXPECT_TRUE(std::filesystem::is_empty(o.dirs[0]));
  EXPECT_TRUE(std::filesystem::is_empty(o.dirs[1]));
}

TEST_P(SwapStoreTest, AllocationBeyondTheReservationIsRefused) {
  SwapStoreOptions o;
  o.dirs = {Dir("a")};
  o.capacity_bytes = 1 << 20;
  auto store = MakeStore(o);
  ASSERT_TRUE(store->Allocate(1, 768 << 10).ok());
  Status st = store->Allocate(2, 512 << 10);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(st.message().find("swap store full: tensor 2 needs 512.00 KiB"), std::string::npos) << st.message();
}

// A store whose tensors come one by one grows its reservation: the earlier
// tensors keep their bytes, the space is checked before each growth.
TEST_P(SwapStoreTest, ReserveGrowsTheStoreAndKeepsWhatIsThere) {
  SwapStoreOptions o;
  o.dirs = {Dir("a"), Dir("b")};
  auto store = MakeStore(o);  // nothing reserved yet
  EXPECT_EQ(store->bytes_reserved(), 0u);
  EXPECT_EQ(store->Allocate(1, 4096).code(), StatusCode::kOutOfMemory);
  ASSERT_TRUE(store->Reserve(3 << 20).ok());
  EXPECT_EQ(store->bytes_reserved(), 4u << 20);  // whole 1 MiB extents in each of the two files
  auto first = Aligned(3 << 20);
  FillRandom(first.get(), 3 << 20, 77);
  ASSERT_TRUE(store->Allocate(1, 3 << 20).ok());
  ASSERT_TRUE(store->Write(1, first.get()).Wait().ok());
  ASSERT_TRUE(store->Reserve(2 << 20).ok());  // never shrinks
  EXPECT_EQ(store->bytes_reserved(), 4u << 20);
  EXPECT_EQ(store->Allocate(2, 2 << 20).code(), StatusCode::kOutOfMemory);
  ASSERT_TRUE(store->Reserve(6 << 20).ok());
  EXPECT_EQ(store->bytes_reserved(), 6u << 20);
  auto second = Aligned(2 << 20);
  FillRandom(second.get(), 2 << 20, 78);
  ASSERT_TRUE(store->Allocate(2, 2 << 20).ok());
  ASSERT_TRUE(store->Write(2, second.get()).Wait().ok());
  auto back = Aligned(3 << 20);
  ASSERT_TRUE(store->Read(1, back.get()).Wait().ok());
  EXPECT_EQ(std::memcmp(back.get(), first.get(), 3 << 20), 0);
  ASSERT_TRUE(store->Read(2, back.get()).Wait().ok());
  EXPECT_EQ(std::memcmp(back.get(), second.get(), 2 << 20), 0);
  const Status st = store->Reserve(1ull << 60);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("not enough space for the swap store"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(" more"), std::string::npos) << st.message();
  EXPECT_EQ(store->bytes_reserved(), 6u << 20);
}

TEST_P(SwapStoreTest, FilesAreRemovedOnCleanShutdownAndCrashLeftoversReported) {
  std::string dir = Dir("a");
  // A leftover from a process that is gone: fork a child, let it exit, reuse its pid in a name.
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  std::string leftover = dir + "/zinf-swap-" + std::to_string(child) + "-00000000deadbeef-0.swap";
  std::ofstream(leftover) << "old state";

  SwapStoreOptions o;
  o.dirs = {dir};
  o.capacity_bytes = 1 << 20;
  std::vector<std::string> paths;
  {
    auto store = MakeStore(o);
    ASSERT_EQ(store->stale_files().size(), 1u);
    EXPECT_EQ(store->stale_files()[0].path, leftover);
    EXPECT_EQ(store->stale_files()[0].pid, child);
    paths = store->file_paths();
    EXPECT_NE(paths[0], leftover);  // never reused
    EXPECT_TRUE(std::filesystem::exists(paths[0]));
  }
  EXPECT_FALSE(std::filesystem::exists(paths[0]));
  EXPECT_TRUE(std::filesystem::exists(leftover));  // reported, not deleted behind the user's back
  EXPECT_EQ(SwapStore::FindStale({dir}).size(), 1u);
}

TEST_P(SwapStoreTest, BadDirectoriesAreClearErrors) {
  SwapStoreOptions o;
  o.dirs = {root_ + "/missing"};
  EXPECT_EQ(SwapStore::Create(*engine_, o).status().code(), StatusCode::kNotFound);
  std::string file = root_ + "/plain_file";
  std::ofstream(file) << "x";
  o.dirs = {file};
  auto s = SwapStore::Create(*engine_, o);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("is not a directory"), std::string::npos);
  o.dirs = {};
  EXPECT_EQ(SwapStore::Create(*engine_, o).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapStoreTest, ::testing::Values(IoBackend::kUring, IoBackend::kPosix),
                         [](const auto& test_info) {
                           return test_info.param == IoBackend::kUring ? "io_uring" : "posix";
                         });

}  // namespace
}  // namespace zinf::nvme
