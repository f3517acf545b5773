// CudaDevice against the same contract as HostDevice, and a framework's
// stream adopted; skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "device_contract_tests.h"

namespace zinf {
namespace test {
INSTANTIATE_TEST_SUITE_P(Cuda, DeviceContractTest, ::testing::Values("cuda"));
}  // namespace test

namespace {

// A framework's stream adopted: zinf's copies and tasks run on it, in its
// order, so the framework's own synchronize sees them; destroying the
// wrapper leaves the native stream to its owner.
TEST(CudaDeviceTest, AnAdoptedStreamCarriesZinfsWorkAndStaysItsOwners) {
  DeviceOptions o;
  o.spec = "cuda";
  o.memory_budget = 16 << 20;
  auto d = CreateDevice(o);
  if (!d.ok() && d.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << d.status().message();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto device = std::move(d).value();
  auto own = std::move(device->CreateStream()).value();
  void* dptr = *device->Allocate(4096, *own);
  ASSERT_TRUE(own->Synchronize().ok());
  cudaStream_t native = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&native, cudaStreamNonBlocking), cudaSuccess);
  std::vector<char> host(4096, 3), back(4096, 0);
  std::atomic<bool> ran{false};
  {
    auto adopted = device->AdoptStream(native);
    ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
    Stream& s = **adopted;
    EXPECT_EQ(s.native_handle(), static_cast<void*>(native));
    ASSERT_TRUE(device->CopyToDevice(dptr, host.data(), host.size(), s).ok());
    ASSERT_TRUE(s.Enqueue([&ran](const StreamContext&) {
                   ran = true;
                   return Status::Ok();
                 }).ok());
    ASSERT_TRUE(device->CopyToHost(back.data(), dptr, back.size(), s).ok());
    ASSERT_EQ(cudaStreamSynchronize(native), cudaSuccess);  // the framework's own wait
    EXPECT_TRUE(ran.load());
    EXPECT_EQ(back, host);
  }
  EXPECT_EQ(cudaStreamQuery(native), cudaSuccess) << "the native stream was destroyed with its wrapper";
  EXPECT_EQ(cudaStreamDestroy(native), cudaSuccess);
  ASSERT_TRUE(device->Free(dptr, *own).ok());
  ASSERT_TRUE(own->Synchronize().ok());
}

}  // namespace
}  // namespace zinf
