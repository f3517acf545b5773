// The reference product of `zinf bench model --device cuda`
// (gpu/gemm_reference.h): it must compute the model's product, row-major
// C = A·Bᵀ, in both operand types, and time it. Skipped (not passed)
// without a CUDA device.
//
// Tolerance: small integers in the operands make every product and sum
// exact in fp32 and bf16 alike, so C must equal the double-precision
// product exactly.
#include "gpu/gemm_reference.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/float16.h"
#include "gpu/cuda_probe.h"

namespace zinf::gpu {
namespace {

// Exact in bf16: integers of at most 8 significant bits.
float A(int64_t i, int64_t k) { return static_cast<float>((i * 3 + k) % 7 - 3); }
float B(int64_t j, int64_t k) { return static_cast<float>((j * 5 + k * 2) % 9 - 4); }

void CheckProduct(bool bf16) {
  const int64_t m = 37, n = 130, k = 48;  // not multiples of any tile
  std::vector<float> a(m * k), b(n * k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t x = 0; x < k; ++x) a[i * k + x] = A(i, x);
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t x = 0; x < k; ++x) b[j * k + x] = B(j, x);
  }
  const size_t esize = bf16 ? 2 : 4;
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = FloatToBf16Bits(a[i]);
  for (size_t i = 0; i < b.size(); ++i) b16[i] = FloatToBf16Bits(b[i]);
  void *da = nullptr, *db = nullptr, *dc = nullptr;
  ASSERT_EQ(cudaMalloc(&da, a.size() * esize), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, b.size() * esize), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dc, m * n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpy(da, bf16 ? static_cast<const void *>(a16.data()) : a.data(), a.size() * esize, cudaMemcpyHostToDevice),
      cudaSuccess);
  ASSERT_EQ(
      cudaMemcpy(db, bf16 ? static_cast<const void *>(b16.data()) : b.data(), b.size() * esize, cudaMemcpyHostToDevice),
      cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  Result<double> seconds = TimeCublasProduct(stream, m, n, k, bf16, da, db, static_cast<float *>(dc), 3);
  ASSERT_TRUE(seconds.ok()) << seconds.status().ToString();
  EXPECT_GT(*seconds, 0.0);
  std::vector<float> c(m * n);
  ASSERT_EQ(cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t wrong = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t x = 0; x < k; ++x) want += static_cast<double>(A(i, x)) * B(j, x);
      if (c[i * n + j] != static_cast<float>(want) && wrong++ < 5) {
        ADD_FAILURE() << "C[" << i << "][" << j << "] = " << c[i * n + j] << ", want " << want;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_FALSE(TimeCublasProduct(stream, 0, n, k, bf16, da, db, static_cast<float *>(dc), 3).ok());
  cudaStreamDestroy(stream);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

TEST(GemmReferenceTest, ComputesTheModelsRowMajorProductInFp32) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  CheckProduct(/*bf16=*/false);
}

TEST(GemmReferenceTest, ComputesTheModelsRowMajorProductInBf16) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  CheckProduct(/*bf16=*/true);
}

}  // namespace
}  // namespace zinf::gpu
