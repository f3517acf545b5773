// NcclComm and its rank-order kernel. Skipped (not passed) without a CUDA
// device, except the host-only pieces (staging size, the watchdog's
// deadline). The kernel is checked bit for bit against the host's
// ReduceInRankOrder, the slow twin; the communicator on one GPU (1 rank:
// collectives are copies, but every NCCL call and the stream plumbing run),
// its failure handling (Abort, Health, the watchdog's timeout) and staging.
// The NcclMultiRankTest cases need one GPU per rank under mpirun
// (mpi_nccl_comm_test.np2) and skip otherwise.
#include "gpu/nccl_comm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/communicator.h"
#include "common/float16.h"
#include "cpu/mpi_comm.h"
#include "gpu/cuda_device.h"
#include "gpu/cuda_probe.h"
#include "gpu/reduce_kernels.h"
#include "sched/backends.h"
#include "zinf/device.h"
#include "test_util.h"

namespace zinf::gpu {
namespace {

using Bytes = std::vector<uint8_t>;

using test::SplitMix64;
// Random finite values, with every 61st element a special (inf, NaN, -0,
// denormal), in `dtype`'s storage.
Bytes MakeInput(DType dtype, int rank, size_t count) {
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -0.0f,
                            1e-40f,
                            6e-8f};
  Bytes out(count * DTypeSizeBytes(dtype));
  for (size_t i = 0; i < count; ++i) {
    const uint64_t bits = SplitMix64(static_cast<uint64_t>(rank) << 40 ^ i);
    float v = std::ldexp(1.0f + (bits & 0xffffff) / 16777216.0f, static_cast<int>((bits >> 24) % 17) - 8);
    if ((bits >> 40) & 1) v = -v;
    if (i % 61 == 60) v = specials[(bits >> 41) % 6];
    if (dtype == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == DType::kBFloat16 ? FloatToBf16Bits(v) : FloatToHalfBits(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

class NcclCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
};

void* DeviceCopy(const Bytes& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(host.size(), 1)), cudaSuccess);
  if (!host.empty()) {
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return p;
}

Bytes HostCopy(const void* device_ptr, size_t bytes) {
  Bytes host(bytes);
  EXPECT_EQ(cudaMemcpy(host.data(), device_ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST_F(NcclCommTest, ReduceKernelMatchesTheHostTwinBitForBit) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (int n : {1, 2, 3, 5, 8}) {
        for (size_t count : {size_t{1}, size_t{1000}, size_t{300001}}) {
          const int self_rank = n / 2;
          const size_t bytes = count * DTypeSizeBytes(dtype);
          std::vector<Bytes> inputs;
          for (int r = 0; r < n; ++r) inputs.push_back(MakeInput(dtype, r, count));
          std::vector<const void*> pointers;
          for (const Bytes& b : inputs) pointers.push_back(b.data());
          Bytes want(bytes);
          ReduceInRankOrder(pointers.data(), n, want.data(), count, dtype, op);
          Bytes staging;  // every input but self_rank's, in rank order
          for (int r = 0; r < n; ++r)
            if (r != self_rank) staging.insert(staging.end(), inputs[r].begin(), inputs[r].end());
          void* d_staging = DeviceCopy(staging);
          void* d_self = DeviceCopy(inputs[self_rank]);
          // out == self: the in-place reduce-scatter case.
          Status st = LaunchReduceInRankOrder(d_staging, d_self, self_rank, n, d_self, count, dtype, op, stream);
          ASSERT_TRUE(st.ok()) << st.ToString();
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          const Bytes got = HostCopy(d_self, bytes);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0)
              << DTypeName(dtype) << " " << ReduceOpName(op) << " n=" << n << " count=" << count;
          cudaFree(d_staging);
          cudaFree(d_self);
        }
      }
    }
  }
  cudaStreamDestroy(stream);
}

TEST_F(NcclCommTest, OneRankCollectivesOnACudaStream) {
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto comm = CreateNcclCommunicator(0, 1, *id, 0, CommOptions{});
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  auto device = CreateDevice(DeviceOptions{.spec = "cuda:0", .memory_budget = 64 << 20});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok());
  const size_t count = 4099;
  const Bytes input = MakeInput(DType::kBFloat16, 0, count);
  auto send = (*device)->Allocate(input.size(), **stream);
  auto recv = (*device)->Allocate(input.size(), **stream);
  ASSERT_TRUE(send.ok() && recv.ok());
  ASSERT_TRUE((*device)->CopyToDevice(*send, input.data(), input.size(), **stream).ok());
  ASSERT_TRUE((*comm)->AllReduce(*send, *recv, count, DType::kBFloat16, ReduceOp::kSum, **stream).ok());
  ASSERT_TRUE((*comm)->ReduceScatter(*recv, *recv, count, DType::kBFloat16, ReduceOp::kMax, **stream).ok());
  ASSERT_TRUE((*comm)->AllGather(*recv, *send, count, DType::kBFloat16, **stream).ok());
  ASSERT_TRUE((*comm)->Broadcast(*send, count, DType::kBFloat16, 0, **stream).ok());
  ASSERT_TRUE((*comm)->Barrier(**stream).ok());
  Bytes got(input.size());
  ASSERT_TRUE((*device)->CopyToHost(got.data(), *send, got.size(), **stream).ok());
  Status st = (*stream)->Synchronize();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got, input);
}

TEST_F(NcclCommTest, RefusesAStreamWithoutACudaStream) {
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok());
  auto comm = CreateNcclCommunicator(0, 1, *id, 0, CommOptions{});
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  InlineHostStream host;
  float x = 1;
  Status st = (*comm)->AllReduce(&x, &x, 1, DType::kFloat32, ReduceOp::kSum, host);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

TEST_F(NcclCommTest, WrapsAnExistingCommunicatorWithoutOwningIt) {
  ncclComm_t raw = nullptr;
  int devices[] = {0};
  ASSERT_EQ(ncclCommInitAll(&raw, 1, devices), ncclSuccess);
  {
    auto comm = WrapNcclCommunicator(raw, CommOptions{});
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    EXPECT_EQ((*comm)->rank(), 0);
    EXPECT_EQ((*comm)->size(), 1);
  }
  // Still ours: usable, and destroyed exactly once, here.
  int count = 0;
  EXPECT_EQ(ncclCommCount(raw, &count), ncclSuccess);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(ncclCommDestroy(raw), ncclSuccess);
}

// What a failed call must say: the cause, and that the communicator is done.
bool NamesBrokenCause(const Status& st, const std::string& cause) {
  return st.code() == StatusCode::kUnavailable &&
         st.message().find("unusable after an earlier failure") != std::string::npos &&
         st.message().find(cause) != std::string::npos;
}

TEST_F(NcclCommTest, OneRankHealthIsOkUntilAbortThenEveryCallFailsAtOnce) {
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto comm = CreateNcclCommunicator(0, 1, *id, 0, CommOptions{});
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  EXPECT_TRUE((*comm)->Health().ok()) << (*comm)->Health().ToString();
  auto device = CreateDevice(DeviceOptions{.spec = "cuda:0", .memory_budget = 16 << 20});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok());
  const size_t count = 1000;
  const Bytes input = MakeInput(DType::kFloat32, 0, count);
  auto send = (*device)->Allocate(input.size(), **stream);
  auto recv = (*device)->Allocate(input.size(), **stream);
  ASSERT_TRUE(send.ok() && recv.ok());
  ASSERT_TRUE((*device)->CopyToDevice(*send, input.data(), input.size(), **stream).ok());
  ASSERT_TRUE((*device)->Memset(*recv, 0, input.size(), **stream).ok());
  ASSERT_TRUE((*comm)->Barrier(**stream).ok());  // usable before
  ASSERT_TRUE((*stream)->Synchronize().ok());

  const std::string cause = "test: rank 0 ran out of host memory in step 7";
  (*comm)->Abort(OutOfMemory(cause));
  (*comm)->Abort(IoError("a second cause is ignored"));
  Status h = (*comm)->Health();
  EXPECT_EQ(h.code(), StatusCode::kOutOfMemory) << h.ToString();
  EXPECT_EQ(h.message(), cause);

  Status calls[] = {
      (*comm)->AllGather(*send, *recv, count, DType::kFloat32, **stream),
      (*comm)->ReduceScatter(*send, *recv, count, DType::kFloat32, ReduceOp::kSum, **stream),
      (*comm)->AllReduce(*send, *recv, count, DType::kFloat32, ReduceOp::kSum, **stream),
      (*comm)->Broadcast(*recv, count, DType::kFloat32, 0, **stream),
      (*comm)->Barrier(**stream),
  };
  for (const Status& st : calls) EXPECT_TRUE(NamesBrokenCause(st, cause)) << st.ToString();
  // Nothing was enqueued: the stream is clean and recv still holds zeros.
  Bytes got(input.size(), 0xff);
  ASSERT_TRUE((*device)->CopyToHost(got.data(), *recv, got.size(), **stream).ok());
  Status st = (*stream)->Synchronize();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got, Bytes(input.size(), 0));
  EXPECT_EQ((*comm)->Health().message(), cause);
  // The destructor must not destroy the aborted NCCL communicator again.
}

// A collective that does not complete within the timeout breaks the
// communicator through the watchdog. On one rank the reduce-scatter is a
// copy, held up here behind a host task, so no NCCL kernel is in flight when
// the watchdog aborts. The communicator is made first and wrapped (the short
// timeout would also bound its creation); the wrapper's abort frees it.
TEST_F(NcclCommTest, OneRankWatchdogBreaksOnACollectivePastTheTimeout) {
  ncclComm_t raw = nullptr;
  int devices[] = {0};
  ASSERT_EQ(ncclCommInitAll(&raw, 1, devices), ncclSuccess);
  auto comm = WrapNcclCommunicator(raw, CommOptions{.timeout_seconds = 0.5});
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  auto device = CreateDevice(DeviceOptions{.spec = "cuda:0", .memory_budget = 16 << 20});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok());
  const size_t count = 4096;
  auto send = (*device)->Allocate(count * 2, **stream);
  auto recv = (*device)->Allocate(count * 2, **stream);
  ASSERT_TRUE(send.ok() && recv.ok());
  auto release = std::make_shared<std::atomic<bool>>(false);
  ASSERT_TRUE((*stream)
                  ->Enqueue([release](const StreamContext&) {
                    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
                    while (!release->load() && std::chrono::steady_clock::now() < limit)
                      std::this_thread::sleep_for(std::chrono::milliseconds(1));
                    return Status::Ok();
                  })
                  .ok());
  ASSERT_TRUE((*comm)->ReduceScatter(*send, *recv, count, DType::kBFloat16, ReduceOp::kSum, **stream).ok());
  const auto t0 = std::chrono::steady_clock::now();
  Status h = (*comm)->Health();
  while (h.ok() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    h = (*comm)->Health();
  }
  release->store(true);
  EXPECT_EQ(h.code(), StatusCode::kUnavailable) << h.ToString();
  EXPECT_NE(h.message().find("reduce_scatter #1 of 4096 bf16 elements"), std::string::npos) << h.ToString();
  EXPECT_NE(h.message().find("a peer may be dead or stopped"), std::string::npos) << h.ToString();
  Status st = (*stream)->Synchronize();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(NamesBrokenCause((*comm)->Barrier(**stream), "reduce_scatter #1")) << h.ToString();
}

TEST_F(NcclCommTest, WrappedCommunicatorAbortedByTheWrapperIsNotDestroyedTwice) {
  ncclComm_t raw = nullptr;
  int devices[] = {0};
  ASSERT_EQ(ncclCommInitAll(&raw, 1, devices), ncclSuccess);
  auto comm = WrapNcclCommunicator(raw, CommOptions{});
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  EXPECT_TRUE((*comm)->Health().ok());
  (*comm)->Abort(Internal("test: wrapped and aborted"));
  EXPECT_EQ((*comm)->Health().code(), StatusCode::kInternal);
  comm->reset();
  // ncclCommAbort freed `raw`: per the contract the caller neither uses nor destroys it now.
}

TEST_F(NcclCommTest, OneRankHasNoStagingAndTakesNoneFromTheBudget) {
  auto id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok());
  auto comm = CreateNcclCommunicator(0, 1, *id, 0, CommOptions{});
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  EXPECT_EQ((*comm)->ReductionStagingBytes(1 << 20, DType::kFloat32), 0u);
  auto device = CreateCudaDevice(0, DeviceOptions{.memory_budget = 16 << 20});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  (*comm)->SetStagingDevice(device->get());
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok());
  const size_t count = 100003;
  auto send = (*device)->Allocate(count * 4, **stream);
  auto recv = (*device)->Allocate(count * 4, **stream);
  ASSERT_TRUE(send.ok() && recv.ok());
  const DeviceMemoryStats before = (*device)->memory_stats();
  ASSERT_TRUE((*comm)->ReduceScatter(*send, *recv, count, DType::kFloat32, ReduceOp::kSum, **stream).ok());
  ASSERT_TRUE((*comm)->AllReduce(*send, *recv, count, DType::kFloat32, ReduceOp::kMax, **stream).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  const DeviceMemoryStats after = (*device)->memory_stats();
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.peak_in_use_bytes, before.peak_in_use_bytes);
}

// Host-only: these run without a GPU.
TEST(NcclHostTest, ReductionStagingBytes) {
  EXPECT_EQ(NcclReductionStagingBytes(1, 1 << 20, DType::kFloat32), 0u);
  EXPECT_EQ(NcclReductionStagingBytes(2, 1000, DType::kFloat32), 4000u);
  EXPECT_EQ(NcclReductionStagingBytes(4, 1000, DType::kBFloat16), 6000u);
  EXPECT_EQ(NcclReductionStagingBytes(8, 0, DType::kFloat16), 0u);
  // No 32-bit overflow: 7 * 2^31 fp32 elements.
  EXPECT_EQ(NcclReductionStagingBytes(8, size_t{1} << 31, DType::kFloat32), uint64_t{7} << 33);
}

TEST(NcclHostTest, DeadlinePassesOnlyAtTheTimeout) {
  const std::string what = "reduce_scatter #12 of 4096 bf16 elements";
  EXPECT_TRUE(CheckNcclDeadline(what, 0, 300).ok());
  EXPECT_TRUE(CheckNcclDeadline(what, 299.9, 300).ok());
  Status st = CheckNcclDeadline(what, 300.04, 300);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("300.0 s after it was enqueued"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("a peer may be dead or stopped"), std::string::npos) << st.message();
}

// Under mpirun with one GPU per rank (device = rank): NCCL over MPI, with the
// MPI communicator as the notice channel.
class NcclMultiRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    auto mpi = cpu::CreateMpiCommunicator(CommOptions{.timeout_seconds = 60});
    ASSERT_TRUE(mpi.ok()) << mpi.status().ToString();
    world_ = (*mpi)->size();
    rank_ = (*mpi)->rank();
    if (world_ < 2) GTEST_SKIP() << "one rank: run under mpirun -np 2 or more";
    if (CudaDeviceCount() < world_)
      GTEST_SKIP() << "needs one GPU per rank: " << CudaDeviceCount() << " for " << world_ << " ranks";
    ASSERT_EQ(cudaSetDevice(rank_), cudaSuccess);
    auto nccl = sched::CreateCommunicator(sched::CommBackend::kNccl, CommOptions{.timeout_seconds = 60}, rank_);
    ASSERT_TRUE(nccl.ok()) << nccl.status().ToString();
    comm_ = std::move(*nccl);
  }

  void* DeviceBuffer(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1)), cudaSuccess);
    buffers_.push_back(p);
    return p;
  }
  void TearDown() override {
    for (void* p : buffers_) cudaFree(p);
  }

  int world_ = 1, rank_ = 0;
  std::unique_ptr<Communicator> comm_;
  std::vector<void*> buffers_;
};

// The staging comes from the device's budget: too small a budget is
// kOutOfMemory before anything is enqueued, on every rank alike, and leaves
// the communicator usable.
TEST_F(NcclMultiRankTest, StagingBeyondTheBudgetIsOutOfMemory) {
  const size_t count = 1 << 19;  // fp32: 2 MiB per peer, over a 1 MiB budget
  const uint64_t staging = comm_->ReductionStagingBytes(count, DType::kFloat32);
  EXPECT_EQ(staging, static_cast<uint64_t>(world_ - 1) * count * 4);
  auto device = CreateCudaDevice(rank_, DeviceOptions{.memory_budget = 1 << 20});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  comm_->SetStagingDevice(device->get());
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok());
  void* send = DeviceBuffer(world_ * count * 4);  // outside the budget
  void* recv = DeviceBuffer(count * 4);
  Status st = comm_->ReduceScatter(send, recv, count, DType::kFloat32, ReduceOp::kSum, **stream);
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory) << st.ToString();
  EXPECT_NE(st.message().find("NCCL reduction staging of " + std::to_string(staging) + " bytes"), std::string::npos)
      << st.ToString();
  EXPECT_TRUE(comm_->Health().ok()) << comm_->Health().ToString();
  ASSERT_TRUE(comm_->Barrier(**stream).ok());
  Status sync = (*stream)->Synchronize();
  EXPECT_TRUE(sync.ok()) << sync.ToString();
}

// With enough budget the staging shows in the device's accounting while the
// reduce-scatter is enqueued and is returned after; the result matches the
// host's rank-order reduction bit for bit.
TEST_F(NcclMultiRankTest, StagingFromTheBudgetIsAccountedAndReturned) {
  const size_t count = 100003;
  const uint64_t staging = comm_->ReductionStagingBytes(count, DType::kFloat32);
  auto device = CreateCudaDevice(rank_, DeviceOptions{.memory_budget = 64 << 20});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  comm_->SetStagingDevice(device->get());
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok());
  std::vector<Bytes> inputs;
  for (int r = 0; r < world_; ++r) inputs.push_back(MakeInput(DType::kFloat32, r, world_ * count));
  void* send = DeviceCopy(inputs[rank_]);
  buffers_.push_back(send);
  void* recv = DeviceBuffer(count * 4);
  const DeviceMemoryStats before = (*device)->memory_stats();
  ASSERT_TRUE(comm_->ReduceScatter(send, recv, count, DType::kFloat32, ReduceOp::kSum, **stream).ok());
  Status st = (*stream)->Synchronize();
  ASSERT_TRUE(st.ok()) << st.ToString();
  const DeviceMemoryStats after = (*device)->memory_stats();
  EXPECT_GE(after.peak_in_use_bytes, before.in_use_bytes + staging);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.allocations, before.allocations);
  std::vector<const void*> mine;
  for (const Bytes& b : inputs) mine.push_back(b.data() + rank_ * count * 4);
  Bytes want(count * 4);
  ReduceInRankOrder(mine.data(), world_, want.data(), count, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(HostCopy(recv, count * 4), want);
  EXPECT_TRUE(comm_->Health().ok()) << comm_->Health().ToString();
}

// The last rank aborts while the others wait in a reduce-scatter it never
// joins: the notice reaches them through the MPI channel, their watchdogs
// abort NCCL, and they fail with the rank and its cause well before the
// 60 s timeout. Last in the file: the aborted MPI channel skips
// MPI_Finalize at exit.
TEST_F(NcclMultiRankTest, AbortReachesThePeersThroughTheNoticeChannel) {
  const int victim = world_ - 1;
  const std::string cause = "test: rank-local failure";
  auto device = CreateCudaDevice(rank_, DeviceOptions{.memory_budget = 16 << 20});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok());
  const size_t count = 4096;
  void* send = DeviceBuffer(world_ * count * 4);
  void* recv = DeviceBuffer(count * 4);
  if (rank_ == victim) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are waiting by now
    comm_->Abort(Internal(cause));
    Status h = comm_->Health();
    EXPECT_EQ(h.code(), StatusCode::kInternal) << h.ToString();
    EXPECT_EQ(h.message(), cause);
    EXPECT_TRUE(NamesBrokenCause(comm_->Barrier(**stream), cause));
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  // Either the call itself fails once the notice arrives (NCCL still
  // connecting to the victim) or it is enqueued and the watchdog ends it.
  Status st = comm_->ReduceScatter(send, recv, count, DType::kFloat32, ReduceOp::kSum, **stream);
  Status h = comm_->Health();
  while (st.ok() && h.ok() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    h = comm_->Health();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string named = "rank " + std::to_string(victim) + " stopped";
  EXPECT_EQ(h.code(), StatusCode::kUnavailable) << h.ToString();
  EXPECT_NE(h.message().find(named), std::string::npos) << h.ToString();
  EXPECT_NE(h.message().find(cause), std::string::npos) << h.ToString();
  EXPECT_LT(waited, 10.0) << "the notice should end the wait, not the 60 s timeout";
  if (st.ok()) (*stream)->Synchronize().IgnoreError();  // returns: NCCL was aborted (the data is garbage)
  EXPECT_EQ(comm_->Barrier(**stream).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace zinf::gpu
