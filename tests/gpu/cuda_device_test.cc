// CudaDevice against the same contract as HostDevice; skipped without a GPU.
#include <gtest/gtest.h>

#include "device_contract_tests.h"

namespace zinf {
namespace test {
INSTANTIATE_TEST_SUITE_P(Cuda, DeviceContractTest, ::testing::Values("cuda"));
}  // namespace test

namespace {


}  // namespace
}  // namespace zinf
