#include "sched/reduce_buckets.h"

#include <gtest/gtest.h>

#include <vector>

namespace zinf::sched {
namespace {

using Buckets = std::vector<std::vector<int>>;

TEST(ReduceBucketsTest, UnitsFillBucketsInReadyOrderUpToTheCapacity) {
  ReduceBuckets b(/*capacity=*/100, /*overlap=*/true);
  // Backward order 3 2 1 0; 40 + 50 fit, 30 more would not.
  EXPECT_TRUE(b.Add(3, 40, false));
  EXPECT_TRUE(b.closed().empty());
  b.Add(2, 50, false);
  EXPECT_TRUE(b.closed().empty());
  b.Add(1, 30, false);
  EXPECT_EQ(b.closed(), (Buckets{{3, 2}}));
  b.ClearClosed();
  // The last unit closes the open bucket: 30 + 70 = 100 still fits.
  EXPECT_TRUE(b.Add(0, 70, true));
  EXPECT_EQ(b.closed(), (Buckets{{1, 0}}));
  EXPECT_TRUE(b.open_empty());
}

TEST(ReduceBucketsTest, AUnitLargerThanTheCapacityHasABucketToItself) {
  ReduceBuckets b(100, true);
  b.Add(0, 10, false);
  b.Add(1, 250, false);
  b.Add(2, 10, true);
  EXPECT_EQ(b.closed(), (Buckets{{0}, {1}, {2}}));
}

TEST(ReduceBucketsTest, WithoutOverlapTheBucketsWaitForTheLastUnit) {
  ReduceBuckets b(50, /*overlap=*/false);
  EXPECT_FALSE(b.Add(0, 40, false));
  EXPECT_FALSE(b.Add(1, 40, false));  // closes {0}, held
  EXPECT_EQ(b.closed(), (Buckets{{0}}));
  EXPECT_TRUE(b.Add(2, 5, true));
  EXPECT_EQ(b.closed(), (Buckets{{0}, {1, 2}}));
}

TEST(ReduceBucketsTest, TheMicroStepsEndClosesWhatUnfetchedUnitsLeftOpen) {
  ReduceBuckets b(100, false);
  b.Add(2, 10, false);
  b.Add(1, 10, false);  // unit 0 not fetched this micro-step: never "last"
  EXPECT_TRUE(b.closed().empty());
  b.CloseOpen();
  EXPECT_EQ(b.closed(), (Buckets{{2, 1}}));
  b.ClearClosed();
  b.CloseOpen();  // nothing open: nothing closes
  EXPECT_TRUE(b.closed().empty());
}

}  // namespace
}  // namespace zinf::sched
