// OpenBLAS opened on first use: every entry point resolves and is OpenBLAS's.
#include "cpu/openblas_lib.h"

#include <gtest/gtest.h>

#include <string>

namespace zinf::cpu {
namespace {

TEST(OpenBlasLibTest, OpensOnceAndComputes) {
  Result<const OpenBlasLib*> lib = OpenBlas();
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  const OpenBlasLib& b = **lib;
  ASSERT_NE(b.sgemm, nullptr);
  ASSERT_NE(b.dgemm, nullptr);
  ASSERT_NE(b.set_num_threads, nullptr);
  ASSERT_NE(b.get_num_threads, nullptr);
  ASSERT_NE(b.get_config, nullptr);
  EXPECT_NE(std::string(b.get_config()).find("OpenBLAS"), std::string::npos) << b.get_config();
  // [1 2; 3 4] · [5 6; 7 8] = [19 22; 43 50], row-major, in float and double.
  const float a[] = {1, 2, 3, 4}, x[] = {5, 6, 7, 8};
  float c[4] = {};
  b.sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, x, 2, 0.0f, c, 2);
  EXPECT_EQ(c[0], 19.0f);
  EXPECT_EQ(c[1], 22.0f);
  EXPECT_EQ(c[2], 43.0f);
  EXPECT_EQ(c[3], 50.0f);
  const double ad[] = {1, 2, 3, 4}, xd[] = {5, 6, 7, 8};
  double cd[4] = {};
  b.dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 2, 2, 2, 1.0, ad, 2, xd, 2, 0.0, cd, 2);  // aᵀ · x
  EXPECT_EQ(cd[0], 26.0);
  EXPECT_EQ(cd[3], 44.0);
  Result<const OpenBlasLib*> again = OpenBlas();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *lib);
  EXPECT_EQ(&OpenBlasOrDie(), *lib);
}

}  // namespace
}  // namespace zinf::cpu
