// The backend registry: what a build without a backend answers (one
// NotBuilt wording), the communicators it creates, and the per-device kernel
// tables: each table's kernels, run on its device's memory, give the CPU
// kernels' bits (the CUDA table where a GPU exists, else skipped).
#include "sched/backends.h"

#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cpu/adam.h"
#include "cpu/cast.h"
#include "cpu/norm.h"
#include "test_util.h"
#include "zinf/device.h"

namespace zinf::sched {
namespace {

TEST(BackendRegistryTest, NotBuiltNamesTheOptionThatBuildsIt) {
  const Status cuda = NotBuilt(OptionalBackend::kCuda);
  EXPECT_EQ(cuda.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(cuda.message(), "this build of zinf has no CUDA (configure with -DZINF_WITH_CUDA=ON)");
  EXPECT_EQ(NotBuilt(OptionalBackend::kNccl).message(),
            "this build of zinf has no NCCL (configure with -DZINF_WITH_NCCL=ON)");
  const BackendInfo row = NotBuiltInfo(OptionalBackend::kNccl);
  EXPECT_EQ(row.name, "nccl");
  EXPECT_FALSE(row.built);
  EXPECT_EQ(row.detail, "not built (configure with -DZINF_WITH_NCCL=ON)");
}

TEST(BackendRegistryTest, TheRuntimeReportAgreesWithWhatWasBuilt) {
  const RuntimeInfo info = ProbeRuntime();
  for (OptionalBackend b : {OptionalBackend::kCuda, OptionalBackend::kNccl}) {
    const std::string name = NotBuiltInfo(b).name;
    bool found = false;
    for (const BackendInfo& row : info.backends) {
      if (row.name != name) continue;
      found = true;
      EXPECT_EQ(row.built, Built(b)) << name;
    }
    EXPECT_TRUE(found) << name;
  }
}

TEST(BackendRegistryTest, WhatIsNotBuiltSaysSoEverywhere) {
  if (!Built(OptionalBackend::kNccl)) {
    for (const Status& st : {NewNcclUniqueId().status(),
                             sched::CreateNcclCommunicator(0, 1, gpu::NcclUniqueId{}, 0, CommOptions{}).status(),
                             WrapNcclCommunicator(nullptr, CommOptions{}).status(),
                             CreateCommunicator(CommBackend::kNccl, CommOptions{}).status()}) {
      EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.ToString();
      EXPECT_EQ(st.message(), NotBuilt(OptionalBackend::kNccl).message());
    }
  }
  if (!Built(OptionalBackend::kCuda)) {
    EXPECT_EQ(GetCudaTimings().status().message(), NotBuilt(OptionalBackend::kCuda).message());
    auto device = CreateDevice(DeviceOptions{.spec = "cpu", .memory_budget = 1 << 20});
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    auto stream = (*device)->CreateStream();
    ASSERT_TRUE(stream.ok());
    const DeviceKernels& cuda = KernelsFor(DeviceKind::kCuda);
    EXPECT_EQ(cuda.add_in_place(nullptr, nullptr, 0, **stream).code(), StatusCode::kUnimplemented);
    EXPECT_EQ(cuda.pci_bus_id(**device).status().message(), NotBuilt(OptionalBackend::kCuda).message());
    auto named = CreateDevice(DeviceOptions{.spec = "cuda:0"});
    EXPECT_EQ(named.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(named.status().message().find(NotBuilt(OptionalBackend::kCuda).message()), std::string::npos);
  }
}

TEST(BackendRegistryTest, OneRankMpiCommunicatorWorksOnHostMemory) {
  auto comm = CreateCommunicator(CommBackend::kMpi, CommOptions{.timeout_seconds = 20});
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  EXPECT_GE((*comm)->size(), 1);
  EXPECT_FALSE(CommunicatesDeviceMemory(comm->get()));
  EXPECT_FALSE(CommunicatesDeviceMemory(nullptr));
}

TEST(BackendRegistryTest, TheHostDeviceNeedsNoRegistrarAndHasNoBusId) {
  auto device = CreateDevice(DeviceOptions{.spec = "cpu", .memory_budget = 1 << 20});
  ASSERT_TRUE(device.ok());
  EXPECT_EQ(&KernelsFor(DeviceKind::kHost), &HostKernels());
  auto bus = DevicePciBusId(**device);
  ASSERT_TRUE(bus.ok());
  EXPECT_EQ(*bus, "");
  EXPECT_EQ(CreateHostRegistrarFor(**device).status().code(), StatusCode::kInvalidArgument);
}

// Buffers of one device, copied in and out around the kernels.
class DeviceKernelsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto device = CreateDevice(DeviceOptions{.spec = GetParam(), .memory_budget = 64 << 20, .checking = true});
    if (!device.ok() && GetParam() != "cpu") GTEST_SKIP() << "no CUDA device: " << device.status().ToString();
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(*device);
    auto stream = device_->CreateStream();
    ASSERT_TRUE(stream.ok());
    stream_ = std::move(*stream);
  }
  void TearDown() override {
    if (!stream_) return;
    for (void* p : buffers_) EXPECT_TRUE(device_->Free(p, *stream_).ok());
    EXPECT_TRUE(stream_->Synchronize().ok());
  }
  template <class T>
  T* Up(const std::vector<T>& host) {
    auto p = device_->Allocate(std::max<size_t>(host.size() * sizeof(T), 1), *stream_);
    EXPECT_TRUE(p.ok());
    buffers_.push_back(*p);
    EXPECT_TRUE(device_->CopyToDevice(*p, host.data(), host.size() * sizeof(T), *stream_).ok());
    EXPECT_TRUE(stream_->Synchronize().ok());  // the copy is asynchronous: `host` may change or go
    return static_cast<T*>(*p);
  }
  template <class T>
  std::vector<T> Down(const T* device_ptr, size_t n) {
    std::vector<T> host(n);
    EXPECT_TRUE(device_->CopyToHost(host.data(), device_ptr, n * sizeof(T), *stream_).ok());
    EXPECT_TRUE(stream_->Synchronize().ok());
    return host;
  }
  const DeviceKernels& kernels() const { return KernelsFor(device_->kind()); }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::vector<void*> buffers_;
  tbb::task_arena arena_{2};
};

// Past one norm block, with a tail.
constexpr size_t kElems = (size_t{1} << 16) + 4097;

TEST_P(DeviceKernelsTest, AddInPlaceAndNormPartialsGiveTheCpuBits) {
  std::vector<float> a = test::UniformFloats(1, kElems, -2, 2), b = test::UniformFloats(2, kElems, -2, 2);
  float* da = Up(a);
  ASSERT_TRUE(kernels().add_in_place(da, Up(b), kElems, *stream_).ok());
  for (size_t i = 0; i < kElems; ++i) a[i] = a[i] + b[i];
  const std::vector<float> sum = Down(da, kElems);
  EXPECT_EQ(std::memcmp(sum.data(), a.data(), kElems * 4), 0);

  std::vector<double> want(cpu::NumNormBlocks(kElems));
  ASSERT_TRUE(cpu::SumSquaresBlocks(arena_, a.data(), DType::kFloat32, kElems, want).ok());
  double* partials = Up(std::vector<double>(want.size()));
  ASSERT_TRUE(kernels().sum_squares_blocks(da, kElems, partials, *stream_).ok());
  const std::vector<double> got = Down(partials, want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 8), 0);
}

TEST_P(DeviceKernelsTest, AdamStepAndCastGiveTheCpuBits) {
  std::vector<float> params = test::UniformFloats(3, kElems, -1, 1), m = test::UniformFloats(4, kElems, -1e-2, 1e-2),
                     v = test::UniformFloats(5, kElems, 0, 1e-3), grads = test::UniformFloats(6, kElems, -1, 1);
  auto constants = cpu::MakeAdamStepConstants(cpu::AdamOptions{.lr = 1e-3, .weight_decay = 0.01}, 3, 0.5);
  ASSERT_TRUE(constants.ok());
  float *dp = Up(params), *dm = Up(m), *dv = Up(v);
  uint16_t* dcopy = Up(std::vector<uint16_t>(kElems));
  ASSERT_TRUE(kernels().adam_step(*constants, dp, dm, dv, Up(grads), dcopy, DType::kBFloat16, kElems, *stream_).ok());
  std::vector<uint16_t> copy(kElems);
  const cpu::AdamBuffers buffers{.params = params.data(),
                                 .exp_avg = m.data(),
                                 .exp_avg_sq = v.data(),
                                 .grads = grads.data(),
                                 .param_copy = copy.data(),
                                 .param_copy_dtype = DType::kBFloat16,
                                 .num_elems = kElems};
  ASSERT_TRUE(cpu::AdamStep(arena_, *constants, buffers).ok());
  EXPECT_EQ(Down(dp, kElems), params);
  EXPECT_EQ(Down(dm, kElems), m);
  EXPECT_EQ(Down(dv, kElems), v);
  EXPECT_EQ(Down(dcopy, kElems), copy);

  uint16_t* half = Up(std::vector<uint16_t>(kElems));
  ASSERT_TRUE(kernels().cast(dp, DType::kFloat32, half, DType::kFloat16, kElems, *stream_).ok());
  std::vector<uint16_t> want(kElems);
  ASSERT_TRUE(cpu::Cast(arena_, params.data(), DType::kFloat32, want.data(), DType::kFloat16, kElems).ok());
  EXPECT_EQ(Down(half, kElems), want);
}

TEST_P(DeviceKernelsTest, BusyWaitHoldsTheStream) {
  EXPECT_EQ(kernels().busy_wait(-1, *stream_).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(kernels().busy_wait(0.001, *stream_).ok());
  EXPECT_TRUE(stream_->Synchronize().ok());
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceKernelsTest, ::testing::Values("cpu", "cuda"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace zinf::sched
