#include "sched/fetch_trace.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace zinf::sched {
namespace {

// A forward and backward pass over units 0..3 (forward order), unit 0 the
// embedding held through the micro-step: 0 1 2 3 3 2 1.
const std::vector<int> kPass = {0, 1, 2, 3, 3, 2, 1};

void Record(FetchTrace& t, const std::vector<int>& calls) {
  for (int u : calls) t.Note(u);
  t.EndMicroStep();
}

TEST(FetchTraceTest, TheFirstMicroStepRecordsAndLaterOnesFollow) {
  FetchTrace t({10, 20, 30, 40});
  EXPECT_FALSE(t.Note(0).has_value());
  EXPECT_FALSE(t.followed()) << "nothing recorded yet";
  for (size_t i = 1; i < kPass.size(); ++i) t.Note(kPass[i]);
  t.EndMicroStep();
  EXPECT_EQ(t.trace(), kPass);
  for (int u : kPass) {
    EXPECT_FALSE(t.Note(u).has_value());
    EXPECT_TRUE(t.followed());
  }
  t.EndMicroStep();
  EXPECT_FALSE(t.followed());
}

TEST(FetchTraceTest, ADivergenceIsReportedOnceAndTheNewOrderReplacesTheTrace) {
  FetchTrace t({10, 20, 30, 40});
  Record(t, kPass);
  t.Note(0);
  t.Note(1);
  const auto d = t.Note(3);  // the trace has 2 here
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->call, 2u);
  EXPECT_EQ(d->unit, 3);
  EXPECT_EQ(d->expected, 2);
  EXPECT_FALSE(t.followed());
  EXPECT_FALSE(t.Note(2).has_value()) << "said once per micro-step";
  t.EndMicroStep();
  EXPECT_EQ(t.trace(), (std::vector<int>{0, 1, 3, 2}));
  // A micro-step longer than the trace diverges where the trace ends.
  for (int u : {0, 1, 3, 2}) t.Note(u);
  const auto past = t.Note(1);
  ASSERT_TRUE(past.has_value());
  EXPECT_EQ(past->call, 4u);
  EXPECT_EQ(past->expected, -1);
}

TEST(FetchTraceTest, AheadFollowsTheTraceWithinTheBucketAndTheLiveCap) {
  FetchTrace t({10, 20, 30, 40});
  Record(t, kPass);
  auto none = [](int) { return false; };
  EXPECT_TRUE(t.Ahead(none, 0, 1000, 1000).empty()) << "no call yet: the trace is not followed";
  t.Note(0);
  // After call 0: 1 2 3 (3 again, 2, 1 are the same units, gathered once).
  EXPECT_EQ(t.Ahead(none, 0, 1000, 1000), (std::vector<int>{1, 2, 3}));
  // The bucket bounds what is gathered ahead: 20 + 30 = 50 fits 55, + 40 does not.
  EXPECT_EQ(t.Ahead(none, 0, 55, 1000), (std::vector<int>{1, 2}));
  // The live cap bounds everything gathered: 10 live already, cap 60.
  EXPECT_EQ(t.Ahead(none, 10, 1000, 60), (std::vector<int>{1, 2}));
  EXPECT_EQ(t.Ahead(none, 45, 1000, 60), (std::vector<int>{})) << "20 more would pass the cap: stop, not skip";
  // Units already gathered are passed over without counting.
  std::set<int> held = {1};
  EXPECT_EQ(t.Ahead([&](int u) { return held.count(u) > 0; }, 0, 50, 1000), (std::vector<int>{2}));
  // Off the trace: nothing.
  t.Note(2);
  EXPECT_TRUE(t.Ahead(none, 0, 1000, 1000).empty());
}

TEST(FetchTraceTest, ReuseCountsTheElementsFetchedInBetween) {
  FetchTrace t({10, 20, 30, 40});
  Record(t, kPass);
  for (int u : {0, 1, 2, 3}) t.Note(u);
  // Next calls: 3 (distance 0), 2 (after 40), 1 (after 40 + 30).
  EXPECT_TRUE(t.ReusedWithin(3, 0, 1000, 0));
  EXPECT_TRUE(t.ReusedWithin(2, 0, 1000, 40));
  EXPECT_FALSE(t.ReusedWithin(2, 0, 1000, 39));
  EXPECT_TRUE(t.ReusedWithin(1, 0, 1000, 70));
  EXPECT_FALSE(t.ReusedWithin(1, 0, 1000, 69));
  EXPECT_FALSE(t.ReusedWithin(0, 0, 1000, 1000)) << "not fetched again this micro-step";
  EXPECT_FALSE(t.ReusedWithin(3, 1001, 1000, 1000)) << "over the live cap";
}

}  // namespace
}  // namespace zinf::sched
