// NcclComm and its rank-order kernel. Skipped (not passed) without a CUDA
// device. The kernel is checked bit for bit against the host's
// ReduceInRankOrder, the slow twin; the communicator on one GPU (1 rank:
// collectives are copies, but every NCCL call and the stream plumbing run).
// Multi-rank NCCL runs need one GPU per rank under mpirun.
#include "gpu/nccl_comm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "common/communicator.h"
#include "common/float16.h"
#include "gpu/cuda_probe.h"
#include "gpu/reduce_kernels.h"
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

}  // namespace
}  // namespace zinf::gpu
