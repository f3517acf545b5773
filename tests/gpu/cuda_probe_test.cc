// GPU tests: skipped (not passed) where no CUDA device is present.
#include "gpu/cuda_probe.h"

#include <gtest/gtest.h>

namespace zinf::gpu {
namespace {

TEST(CudaProbeTest, NoDeviceIsAnAnswerNotAnError) {
  BackendInfo info = ProbeCuda();
  EXPECT_TRUE(info.built);
  if (CudaDeviceCount() == 0) {
    EXPECT_FALSE(info.usable);
    EXPECT_NE(info.detail.find("no GPU"), std::string::npos) << info.detail;
  }
}

TEST(CudaProbeTest, KernelsLoadOnDevice0) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  BackendInfo info = ProbeCuda();
  EXPECT_TRUE(info.usable) << info.detail;
  EXPECT_NE(info.detail.find("kernels load"), std::string::npos) << info.detail;
}

TEST(NcclProbeTest, ReportsAVersion) {
#if ZINF_HAVE_NCCL
  BackendInfo info = ProbeNccl();
  EXPECT_TRUE(info.built);
  EXPECT_NE(info.detail.find('.'), std::string::npos) << info.detail;
#else
  GTEST_SKIP() << "built without NCCL";
#endif
}

}  // namespace
}  // namespace zinf::gpu
