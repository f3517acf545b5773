// GPU tests: skipped (not passed) where no CUDA device is present.
#include "gpu/cuda_probe.h"

#include <string>

#include "gpu/cublas_lib.h"

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

// cuBLAS is opened on first use, not linked; opening it needs no GPU.
TEST(CublasLibTest, OpensAndResolvesEveryEntryPoint) {
  Result<const CublasLib*> lib = Cublas();
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  const CublasLib& b = **lib;
  EXPECT_NE(b.create, nullptr);
  EXPECT_NE(b.destroy, nullptr);
  EXPECT_NE(b.set_stream, nullptr);
  EXPECT_NE(b.set_math_mode, nullptr);
  EXPECT_NE(b.sgemm, nullptr);
  EXPECT_NE(b.sgemm_strided_batched, nullptr);
  EXPECT_NE(b.gemm_ex, nullptr);
  EXPECT_NE(b.gemm_strided_batched_ex, nullptr);
  // The resolved functions are cuBLAS's own: they name its status codes.
  EXPECT_EQ(std::string(b.status_name(CUBLAS_STATUS_NOT_INITIALIZED)), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_EQ(std::string(b.status_name(CUBLAS_STATUS_INVALID_VALUE)), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_NE(std::string(b.status_string(CUBLAS_STATUS_INVALID_VALUE)), "");
  // Opened once: the same table every time.
  Result<const CublasLib*> again = Cublas();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *lib);
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
