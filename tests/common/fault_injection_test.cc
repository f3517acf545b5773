// The ZINF_FAULT plan: which event of which site fails, once.
#include "common/fault_injection.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace zinf::fault {
namespace {

struct ClearPlan {
  ~ClearPlan() { SetPlanForTesting(""); }
};

TEST(FaultInjectionTest, TheNthAllocationFailsOnce) {
  ClearPlan clear;
  ASSERT_TRUE(SetPlanForTesting("alloc:3"));
  EXPECT_EQ(At(Site::kIoWrite), 0);  // not an allocation: not counted
  EXPECT_EQ(At(Site::kDeviceAlloc), 0);
  EXPECT_EQ(At(Site::kDeviceAlloc), 0);
  EXPECT_EQ(At(Site::kDeviceAlloc), ENOMEM);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(At(Site::kDeviceAlloc), 0);
}

TEST(FaultInjectionTest, EioCountsReadsAndWritesEnospcOnlyWrites) {
  ClearPlan clear;
  ASSERT_TRUE(SetPlanForTesting("eio:2"));
  EXPECT_EQ(At(Site::kIoRead), 0);
  EXPECT_EQ(At(Site::kDeviceAlloc), 0);
  EXPECT_EQ(At(Site::kIoWrite), EIO);
  ASSERT_TRUE(SetPlanForTesting("enospc:2"));
  EXPECT_EQ(At(Site::kIoWrite), 0);
  EXPECT_EQ(At(Site::kIoRead), 0);
  EXPECT_EQ(At(Site::kIoRead), 0);
  EXPECT_EQ(At(Site::kIoWrite), ENOSPC);
  ASSERT_TRUE(SetPlanForTesting("ring:1"));
  EXPECT_EQ(At(Site::kIoWrite), 0);
  EXPECT_EQ(At(Site::kRingSubmit), EIO);
  EXPECT_EQ(At(Site::kRingSubmit), 0);
  ASSERT_TRUE(SetPlanForTesting("nan:2"));
  EXPECT_EQ(At(Site::kDeviceAlloc), 0);
  EXPECT_EQ(At(Site::kLoss), 0);
  EXPECT_EQ(At(Site::kLoss), EDOM);
  EXPECT_EQ(At(Site::kLoss), 0);
}

TEST(FaultInjectionTest, CountModeNeverFails) {
  ClearPlan clear;
  ASSERT_TRUE(SetPlanForTesting("count"));
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(At(Site::kDeviceAlloc), 0);
    EXPECT_EQ(At(Site::kIoWrite), 0);
  }
}

TEST(FaultInjectionTest, MalformedPlansAreRefused) {
  ClearPlan clear;
  for (const char* bad : {"alloc", "alloc:", "alloc:0", "alloc:-2", "alloc:3x", "disk:3", ":3"}) {
    EXPECT_FALSE(SetPlanForTesting(bad)) << bad;
  }
  ASSERT_TRUE(SetPlanForTesting(""));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(At(Site::kDeviceAlloc), 0);
}

}  // namespace
}  // namespace zinf::fault
