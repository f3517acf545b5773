// The I/O engine, on both backends: every test runs on io_uring and on the
// pread/pwrite fallback, so the fallback passes the same tests.
#include "nvme/io_engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "nvme/fault_file.h"
#include "zinf/config.h"
#include "nvme_test_util.h"

namespace zinf::nvme {
namespace {

using testing::Aligned;
using testing::FillRandom;
using testing::FreshDir;

class IoEngineTest : public ::testing::TestWithParam<IoBackend> {
 protected:
  std::unique_ptr<IoEngine> MakeEngine(uint64_t block_size = 64 << 10, unsigned queue_depth = 8, unsigned rings = 2) {
    IoEngineOptions o;
    o.backend = GetParam();
    o.block_size = block_size;
    o.queue_depth = queue_depth;
    o.rings = rings;
    auto e = IoEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e.value()->backend_name(), GetParam() == IoBackend::kUring ? "io_uring" : "posix");
    return std::move(e).value();
  }
  std::shared_ptr<File> NewFile(IoEngine& e, const std::string& name, bool direct = true) {
    FileOptions fo;
    fo.create = true;
    fo.truncate = true;
    fo.direct = direct;
    auto f = e.Open(FreshDir() + "/" + name, fo);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    return *f;
  }
  std::shared_ptr<FaultInjectingFile> NewFaultFile(const std::string& name, const FaultPlan& plan) {
    FileOptions fo;
    fo.create = true;
    fo.truncate = true;
    auto f = FaultInjectingFile::Open(FreshDir() + "/" + name, fo, plan);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    return *f;
  }
};

TEST_P(IoEngineTest, RoundTripsRandomOffsetsAndSizes) {
  auto engine = MakeEngine();
  auto file = NewFile(*engine, "data");
  constexpr uint64_t kFileBytes = 8 << 20;
  auto expected = Aligned(kFileBytes);
  FillRandom(expected.get(), kFileBytes, 1);
  ASSERT_TRUE(engine->WriteSync(file, 0, expected.get(), kFileBytes).ok());

  std::mt19937_64 rng(7);
  for (int i = 0; i < 40; ++i) {
    uint64_t pages = kFileBytes / 4096;
    uint64_t first = rng() % pages;
    uint64_t count = 1 + rng() % std::min<uint64_t>(pages - first, 300);  // up to ~1.2 MiB, odd block tails
    uint64_t off = first * 4096, len = count * 4096;
    if (i % 2) {  // rewrite the range with new bytes
      FillRandom(expected.get() + off, len, 100 + i);
      ASSERT_TRUE(engine->WriteSync(file, off, expected.get() + off, len).ok());
    }
    auto got = Aligned(len);
    Status st = engine->ReadSync(file, off, got.get(), len);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(std::memcmp(got.get(), expected.get() + off, len), 0) << "offset " << off << " len " << len;
  }
  auto s = engine->stats();
  EXPECT_GE(s.bytes_written, kFileBytes);
  EXPECT_EQ(s.failed_requests, 0u);
}

TEST_P(IoEngineTest, BufferedFilesTakeUnalignedRanges) {
  auto engine = MakeEngine();
  auto file = NewFile(*engine, "buffered", /*direct=*/false);
  std::vector<char> data(300001), back(300001);
  FillRandom(data.data(), data.size(), 3);
  ASSERT_TRUE(engine->WriteSync(file, 13, data.data(), data.size()).ok());
  ASSERT_TRUE(engine->ReadSync(file, 13, back.data(), back.size()).ok());
  EXPECT_EQ(data, back);
}

TEST_P(IoEngineTest, MisalignmentIsInvalidArgumentSayingWhich) {
  auto engine = MakeEngine();
  auto file = NewFile(*engine, "direct");
  auto buf = Aligned(1 << 20);
  struct Case {
    uint64_t offset;
    uint64_t length;
    size_t buf_shift;
    const char* says;
  };
  for (const Case& c :
       {Case{1000, 4096, 0, "offset 1000 is not a multiple of 4096"},
        Case{0, 5000, 0, "length 5000 is not a multiple of 4096"}, Case{0, 4096, 512, "buffer address"}}) {
    Status st = engine->WriteSync(file, c.offset, buf.get() + c.buf_shift, c.length);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(file->path()), std::string::npos) << st.message();
  }
  EXPECT_EQ(engine->stats().blocks, 0u);  // nothing was issued
}

TEST_P(IoEngineTest, ShortTransfersAreResubmittedForTheRemainder) {
  auto engine = MakeEngine();
  FaultPlan plan;
  plan.max_transfer = 12288;  // every attempt moves at most 3 pages of a 64 KiB block
  auto file = NewFaultFile("short", plan);
  constexpr uint64_t kBytes = 1 << 20;
  auto data = Aligned(kBytes), back = Aligned(kBytes);
  FillRandom(data.get(), kBytes, 5);
  ASSERT_TRUE(engine->WriteSync(file, 0, data.get(), kBytes).ok());
  ASSERT_TRUE(engine->ReadSync(file, 0, back.get(), kBytes).ok());
  EXPECT_EQ(std::memcmp(data.get(), back.get(), kBytes), 0);
  auto s = engine->stats();
  // 64 KiB blocks in 12 KiB pieces: 6 attempts per block, 5 of them resubmissions.
  EXPECT_EQ(s.short_resubmits, 2 * 16 * 5u);
  EXPECT_EQ(s.bytes_written, kBytes);
  EXPECT_EQ(s.bytes_read, kBytes);
}

TEST_P(IoEngineTest, FailedAttemptNamesOpPathOffsetLengthAndErrno) {
  auto engine = MakeEngine(64 << 10, 4, 1);
  FaultPlan plan;
  plan.fail_attempt = 3;  // the 4th block of the write
  plan.fail_errno = EIO;
  auto file = NewFaultFile("eio", plan);
  constexpr uint64_t kBytes = 8 * (64 << 10);
  auto data = Aligned(kBytes);
  IoRequest req = engine->Write(file, 0, data.get(), kBytes);
  Status st = req.Wait();
  ASSERT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("pwrite " + file->path() + " offset="), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("len=65536: Input/output error (errno 5)"), std::string::npos) << st.message();
  EXPECT_TRUE(req.Done());
  EXPECT_LT(req.bytes_transferred(), kBytes);  // the failed block's bytes are never counted
  EXPECT_EQ(engine->stats().failed_requests, 1u);
}

TEST_P(IoEngineTest, ReadsOfABadRangeFail) {
  auto engine = MakeEngine();
  FaultPlan plan;
  plan.fail_reads_from = 256 << 10;
  plan.fail_errno = EIO;
  auto file = NewFaultFile("badsector", plan);
  auto data = Aligned(512 << 10);
  ASSERT_TRUE(engine->WriteSync(file, 0, data.get(), 512 << 10).ok());
  EXPECT_TRUE(engine->ReadSync(file, 0, data.get(), 256 << 10).ok());
  Status st = engine->ReadSync(file, 0, data.get(), 512 << 10);
  ASSERT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("pread " + file->path()), std::string::npos) << st.message();
}

TEST_P(IoEngineTest, EnospcStopsTheWriteAtTheLine) {
  auto engine = MakeEngine();
  FaultPlan plan;
  plan.enospc_at = 200 << 10;  // inside the 4th 64 KiB block
  auto file = NewFaultFile("enospc", plan);
  auto data = Aligned(1 << 20);
  Status st = engine->WriteSync(file, 0, data.get(), 1 << 20);
  ASSERT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("No space left on device (errno 28)"), std::string::npos) << st.message();
  // Blocks past the line fail at their own offsets; the one crossing it wrote
  // up to the line and failed for the rest at exactly 200 KiB, or a later
  // block reported first. Either way the offset named is at or past the line.
  auto pos = st.message().find("offset=");
  ASSERT_NE(pos, std::string::npos);
  EXPECT_GE(std::stoull(st.message().substr(pos + 7)), 200u << 10) << st.message();
}

TEST_P(IoEngineTest, EndOfFileIsDataLoss) {
  auto engine = MakeEngine();
  auto file = NewFile(*engine, "short_file");
  auto data = Aligned(256 << 10);
  ASSERT_TRUE(engine->WriteSync(file, 0, data.get(), 64 << 10).ok());
  Status st = engine->ReadSync(file, 0, data.get(), 256 << 10);
  ASSERT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("end of file"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(file->path()), std::string::npos) << st.message();
}

TEST_P(IoEngineTest, EagainIsRetried) {
  auto engine = MakeEngine();
  FaultPlan plan;
  plan.fail_attempt = 0;
  plan.fail_errno = EAGAIN;
  auto file = NewFaultFile("eagain", plan);
  auto data = Aligned(128 << 10);
  EXPECT_TRUE(engine->WriteSync(file, 0, data.get(), 128 << 10).ok());
  EXPECT_EQ(engine->stats().retries, 1u);
}

TEST_P(IoEngineTest, DelayedCompletionsAreNotReportedEarly) {
  auto engine = MakeEngine(64 << 10, 4, 1);
  FaultPlan plan;
  plan.delay_us = 30000;
  auto file = NewFaultFile("slow", plan);
  auto data = Aligned(64 << 10);
  auto t0 = std::chrono::steady_clock::now();
  bool called = false;
  IoRequest req = engine->Write(file, 0, data.get(), 64 << 10, [&](const Status& s) { called = s.ok(); });
  const bool done = req.Done();
  // (Asked within the delay, it must say no; a thread descheduled past the
  // delay before asking cannot tell.)
  if (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(30)) {
    EXPECT_FALSE(done);
  }
  ASSERT_TRUE(req.Wait().ok());
  EXPECT_TRUE(called);  // the callback ran before waiters woke
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
}

TEST_P(IoEngineTest, ManyConcurrentRequestsFromSeveralThreads) {
  auto engine = MakeEngine(16 << 10, 16, 2);
  auto file = NewFile(*engine, "concurrent");
  constexpr int kThreads = 3, kPerThread = 40;
  constexpr uint64_t kChunk = 48 << 10;
  auto data = Aligned(kThreads * kPerThread * kChunk);
  FillRandom(data.get(), kThreads * kPerThread * kChunk, 11);
  std::vector<std::thread> threads;
  std::atomic<int> callbacks{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<IoRequest> reqs;
      for (int i = 0; i < kPerThread; ++i) {
        uint64_t off = (t * kPerThread + i) * kChunk;
        reqs.push_back(engine->Write(file, off, data.get() + off, kChunk, [&](const Status&) { ++callbacks; }));
      }
      for (auto& r : reqs) EXPECT_TRUE(r.Wait().ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(callbacks.load(), kThreads * kPerThread);
  auto back = Aligned(kThreads * kPerThread * kChunk);
  ASSERT_TRUE(engine->ReadSync(file, 0, back.get(), kThreads * kPerThread * kChunk).ok());
  EXPECT_EQ(std::memcmp(back.get(), data.get(), kThreads * kPerThread * kChunk), 0);
}

TEST_P(IoEngineTest, RegisteredBuffersRoundTrip) {
  auto engine = MakeEngine();
  auto file = NewFile(*engine, "fixed");
  constexpr uint64_t kBytes = 1 << 20;
  auto buf = Aligned(kBytes), back = Aligned(kBytes);
  FillRandom(buf.get(), kBytes, 9);
  ASSERT_TRUE(engine->RegisterBuffer(buf.get(), kBytes).ok());
  ASSERT_TRUE(engine->RegisterBuffer(back.get(), kBytes).ok());
  ASSERT_TRUE(engine->WriteSync(file, 0, buf.get(), kBytes).ok());
  ASSERT_TRUE(engine->ReadSync(file, 0, back.get(), kBytes).ok());
  EXPECT_EQ(std::memcmp(buf.get(), back.get(), kBytes), 0);
  EXPECT_EQ(engine->IsRegistered(buf.get() + 4096, 8192), GetParam() == IoBackend::kUring);
  EXPECT_FALSE(engine->IsRegistered(buf.get() + kBytes - 4096, 8192));  // runs past the buffer
  EXPECT_TRUE(engine->UnregisterBuffer(buf.get()).ok());
  EXPECT_TRUE(engine->UnregisterBuffer(back.get()).ok());
  EXPECT_FALSE(engine->IsRegistered(buf.get(), 4096));
  if (GetParam() == IoBackend::kUring) {
    EXPECT_EQ(engine->UnregisterBuffer(buf.get()).code(), StatusCode::kNotFound);
  }
  EXPECT_EQ(engine->RegisterBuffer(buf.get() + 100, 4096).code(), StatusCode::kInvalidArgument);
  if (GetParam() == IoBackend::kUring) {
    ASSERT_TRUE(engine->RegisterBuffer(buf.get(), kBytes).ok());
    EXPECT_EQ(engine->RegisterBuffer(buf.get() + 4096, 4096).code(), StatusCode::kAlreadyExists);  // overlaps
    EXPECT_TRUE(engine->UnregisterBuffer(buf.get()).ok());
  }
}

// A buffer over io_uring's 1 GiB per slot is registered as one slot per GiB:
// I/O inside either segment is fixed, I/O across the boundary runs plain,
// and all of it lands where it should.
TEST_P(IoEngineTest, BuffersOverOneGibTakeOneSlotPerGib) {
  auto engine = MakeEngine();
  auto file = NewFile(*engine, "big");
  constexpr uint64_t kGiB = uint64_t{1} << 30, kBytes = kGiB + (1 << 20), kChunk = 1 << 20;
  auto buf = Aligned(kBytes);
  ASSERT_TRUE(engine->RegisterBuffer(buf.get(), kBytes).ok());
  const bool uring = GetParam() == IoBackend::kUring;
  EXPECT_EQ(engine->IsRegistered(buf.get() + kGiB - kChunk, kChunk), uring);  // the first segment's end
  EXPECT_EQ(engine->IsRegistered(buf.get() + kGiB, kChunk), uring);           // the second segment
  EXPECT_FALSE(engine->IsRegistered(buf.get() + kGiB - 4096, 8192));          // across the boundary
  // Three chunks written from the buffer: before, across and after the GiB
  // boundary; read back into a plain buffer.
  const uint64_t offsets[] = {kGiB - 2 * kChunk, kGiB - kChunk / 2, kGiB};
  for (int i = 0; i < 3; ++i) FillRandom(buf.get() + offsets[i], kChunk, 20 + i);
  auto back = Aligned(kChunk);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(engine->WriteSync(file, static_cast<uint64_t>(i) * kChunk, buf.get() + offsets[i], kChunk).ok());
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(engine->ReadSync(file, static_cast<uint64_t>(i) * kChunk, back.get(), kChunk).ok());
    EXPECT_EQ(std::memcmp(back.get(), buf.get() + offsets[i], kChunk), 0) << "chunk " << i;
  }
  // And into the registered buffer, across its boundary.
  ASSERT_TRUE(engine->ReadSync(file, 0, buf.get() + kGiB - kChunk / 2, kChunk).ok());
  ASSERT_TRUE(engine->ReadSync(file, 0, back.get(), kChunk).ok());
  EXPECT_EQ(std::memcmp(back.get(), buf.get() + kGiB - kChunk / 2, kChunk), 0);
  EXPECT_TRUE(engine->UnregisterBuffer(buf.get()).ok());
  EXPECT_FALSE(engine->IsRegistered(buf.get() + kGiB, kChunk));
  if (uring) {
    EXPECT_EQ(engine->UnregisterBuffer(buf.get()).code(), StatusCode::kNotFound);
  }
}

TEST_P(IoEngineTest, EmptyRequestCompletesAtOnce) {
  auto engine = MakeEngine();
  bool called = false;
  IoRequest req = engine->Submit({}, [&](const Status& s) { called = s.ok(); });
  EXPECT_TRUE(req.Done());
  EXPECT_TRUE(req.Wait().ok());
  EXPECT_TRUE(called);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineTest, ::testing::Values(IoBackend::kUring, IoBackend::kPosix),
                         [](const auto& test_info) {
                           return test_info.param == IoBackend::kUring ? "io_uring" : "posix";
                         });

TEST_P(IoEngineTest, SingleSubmitRoundTrips) {
  IoEngineOptions o;
  o.backend = GetParam();
  o.block_size = 16 << 10;
  o.single_submit = true;
  auto engine = std::move(IoEngine::Create(o)).value();
  auto file = NewFile(*engine, "single");
  auto data = Aligned(256 << 10), back = Aligned(256 << 10);
  FillRandom(data.get(), 256 << 10, 21);
  ASSERT_TRUE(engine->WriteSync(file, 0, data.get(), 256 << 10).ok());
  ASSERT_TRUE(engine->ReadSync(file, 0, back.get(), 256 << 10).ok());
  EXPECT_EQ(std::memcmp(data.get(), back.get(), 256 << 10), 0);
  const IoEngineStats s = engine->stats();
  EXPECT_EQ(s.blocks, 32u);
  // One submission per block on io_uring, where the same requests batched
  // go out in one submission each (16 blocks, queue depth 32).
  if (GetParam() == IoBackend::kUring) {
    EXPECT_EQ(s.submit_batches, s.blocks);
    o.single_submit = false;
    auto batched = std::move(IoEngine::Create(o)).value();
    auto file2 = NewFile(*batched, "batched");
    ASSERT_TRUE(batched->WriteSync(file2, 0, data.get(), 256 << 10).ok());
    ASSERT_TRUE(batched->ReadSync(file2, 0, back.get(), 256 << 10).ok());
    EXPECT_EQ(batched->stats().blocks, 32u);
    EXPECT_LE(batched->stats().submit_batches, 4u);
    EXPECT_GE(batched->stats().submit_batches, 2u);
  } else {
    EXPECT_EQ(s.submit_batches, 0u);
  }
}

TEST(IoEngineOptionsTest, ComeFromTheConfigsAioBlock) {
  auto c = ParseConfig(R"({"aio": {"block_size": 2097152, "queue_depth": 16, "thread_count": 2, "single_submit": true,
                          "io_backend": "posix"}, "zinf": {"aio": {"fixed_buffers": false, "sqpoll": true}}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  IoEngineOptions o = IoEngineOptionsFromConfig(*c);
  EXPECT_EQ(o.block_size, 2u << 20);
  EXPECT_EQ(o.queue_depth, 16u);
  EXPECT_EQ(o.rings, 2u);
  EXPECT_TRUE(o.single_submit);
  EXPECT_EQ(o.backend, IoBackend::kPosix);
  EXPECT_FALSE(o.fixed_buffers);
  EXPECT_TRUE(o.sqpoll);
  auto rings = ParseConfig(R"({"aio": {"intra_op_parallelism": 2}, "zinf": {"aio": {"rings": 3}}})");
  EXPECT_EQ(IoEngineOptionsFromConfig(*rings).rings, 3u);  // zinf.aio.rings wins
}

TEST(IoEngineOptionsTest, BadOptionsAreRejected) {
  IoEngineOptions o;
  o.block_size = 1000;
  EXPECT_EQ(IoEngine::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.queue_depth = 0;
  EXPECT_NE(IoEngine::Create(o).status().message().find("queue depth 0"), std::string::npos);
  o = {};
  o.rings = 0;
  EXPECT_EQ(IoEngine::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(IoEngineFallbackTest, DisabledUringFallsBackToThreadsAndSaysWhy) {
  ::setenv("ZINF_NO_IO_URING", "1", 1);
  IoEngineOptions o;
  auto engine = IoEngine::Create(o);
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->backend_name(), "posix");
  EXPECT_NE((*engine)->fallback_reason().find("ZINF_NO_IO_URING"), std::string::npos);
  o.backend = IoBackend::kUring;
  EXPECT_EQ(IoEngine::Create(o).status().code(), StatusCode::kUnavailable);
  ::unsetenv("ZINF_NO_IO_URING");
  o.backend = IoBackend::kAuto;
  auto uring = IoEngine::Create(o);
  ASSERT_TRUE(uring.ok());
  EXPECT_EQ((*uring)->backend_name(), "io_uring");
  EXPECT_EQ((*uring)->fallback_reason(), "");
}

// A submission that fails for good (testing::FailUringSubmit stands in for
// a ring that broke): no request waits forever, blocks the kernel took still
// complete with their data, and the ring takes no more requests.
class IoEngineRingFailureTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kBlock = 16 << 10;
  void SetUp() override {
    IoEngineOptions o;
    o.backend = IoBackend::kUring;
    o.block_size = kBlock;
    o.queue_depth = 8;
    o.rings = 1;
    auto e = IoEngine::Create(o);
    if (!e.ok()) GTEST_SKIP() << "no io_uring here: " << e.status().ToString();
    engine_ = std::move(e).value();
    FileOptions fo;
    fo.create = true;
    fo.truncate = true;
    fo.direct = true;
    auto f = engine_->Open(FreshDir() + "/ring-failure", fo);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    file_ = *f;
  }
  std::unique_ptr<IoEngine> engine_;
  std::shared_ptr<File> file_;
};

TEST_F(IoEngineRingFailureTest, BlocksTheKernelNeverSawFailAndSoDoesEveryLaterRequest) {
  constexpr uint64_t kBytes = 32 * kBlock;
  auto data = Aligned(kBytes), back = Aligned(kBytes);
  FillRandom(data.get(), kBytes, 31);
  ASSERT_TRUE(engine_->WriteSync(file_, 0, data.get(), kBytes).ok());
  testing::FailUringSubmit(EFAULT);
  const Status st = engine_->ReadSync(file_, 0, back.get(), kBytes);
  ASSERT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_NE(st.message().find("pread " + file_->path() + " offset="), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Bad address (errno 14)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("the ring takes no more requests"), std::string::npos) << st.message();
  // Later requests fail at once with the same error instead of waiting.
  const Status later = engine_->WriteSync(file_, 0, data.get(), kBlock);
  EXPECT_EQ(later.code(), StatusCode::kIoError);
  EXPECT_NE(later.message().find("pwrite " + file_->path()), std::string::npos) << later.message();
  EXPECT_NE(later.message().find("Bad address (errno 14)"), std::string::npos) << later.message();
  EXPECT_EQ(engine_->stats().failed_requests, 2u);
}

TEST_F(IoEngineRingFailureTest, BlocksTheKernelTookCompleteWithTheirData) {
  constexpr uint64_t kBytes = 32 * kBlock;
  auto data = Aligned(kBytes), back = Aligned(kBytes);
  FillRandom(data.get(), kBytes, 32);
  ASSERT_TRUE(engine_->WriteSync(file_, 0, data.get(), kBytes).ok());
  std::memset(back.get(), 0, kBytes);
  const uint64_t read_before = engine_->stats().bytes_read;
  // The read's first submission (a full queue, 8 blocks) reaches the kernel;
  // the next one, after the first completion, fails.
  testing::FailUringSubmit(EFAULT, /*after=*/1);
  const Status st = engine_->ReadSync(file_, 0, back.get(), kBytes);
  ASSERT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_EQ(engine_->stats().bytes_read - read_before, 8 * kBlock);
  EXPECT_EQ(std::memcmp(back.get(), data.get(), 8 * kBlock), 0);
}

TEST(FileTest, OpenErrorsNameThePath) {
  FileOptions fo;
  auto missing = File::Open("/nonexistent/zinf/file", fo);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/zinf/file"), std::string::npos);
  fo.writable = false;
  fo.direct = false;
  auto dir = File::Open(FreshDir(), fo);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("directory"), std::string::npos) << dir.status().message();
}

}  // namespace
}  // namespace zinf::nvme
