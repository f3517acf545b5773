#include "sched/swap_schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace zinf::sched {
namespace {

// Drives the schedule as the engine's swapper does at a boundary (reads
// issued ahead when a sub-group is needed, the buffer's previous write
// waited first, writes issued after updates; every write waited at the
// end) and records the transfers: "R3" read of 3 issued, "W3" write of 3
// issued, "w3" write of 3 waited, "U3" sub-group 3 updated.
std::vector<std::string> Simulate(const SwapSchedule& s) {
  std::vector<std::string> log;
  std::vector<char> read(s.groups(), 0), written(s.groups(), 0), waited(s.groups(), 0);
  auto wait_write = [&](size_t h) {
    if (written[h] && !waited[h]) {
      waited[h] = 1;
      log.push_back("w" + std::to_string(h));
    }
  };
  for (size_t g = 0; g < s.groups(); ++g) {
    if (auto prev = s.PreviousBatch(g); prev && !read[g]) {
      for (size_t h = prev->first; h < prev->second; ++h) wait_write(h);
    }
    for (size_t h = g; h < s.ReadEnd(g); ++h) {
      if (read[h]) continue;
      if (auto before = s.BufferPredecessor(h)) wait_write(*before);
      read[h] = 1;
      log.push_back("R" + std::to_string(h));
    }
    log.push_back("U" + std::to_string(g));
    if (auto w = s.WritesAfterUpdate(g)) {
      for (size_t h = w->first; h <= w->second; ++h) {
        written[h] = 1;
        log.push_back("W" + std::to_string(h));
      }
    }
  }
  for (size_t h = 0; h < s.groups(); ++h) wait_write(h);
  return log;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : " ") + x;
  return out;
}

TEST(SwapScheduleTest, WithoutPhasesReadsRunAheadBesideWrites) {
  // Three buffers: reads run two sub-groups ahead; the read of 3 reuses 0's
  // buffer, so it waits for 0's write.
  EXPECT_EQ(Join(Simulate(SwapSchedule(5, 3, false))), "R0 R1 U0 W0 R2 U1 W1 w0 R3 U2 W2 w1 R4 U3 W3 U4 W4 w2 w3 w4");
  // One buffer: read, update, write back in place.
  EXPECT_EQ(Join(Simulate(SwapSchedule(2, 1, false))), "R0 U0 W0 w0 R1 U1 W1 w1");
}

TEST(SwapScheduleTest, PhasedBatchesNeverReadBesideAWrite) {
  // Two buffers, five sub-groups: batches {0,1} {2,3} {4}.
  EXPECT_EQ(Join(Simulate(SwapSchedule(5, 2, true))), "R0 R1 U0 U1 W0 W1 w0 w1 R2 R3 U2 U3 W2 W3 w2 w3 R4 U4 W4 w4");
}

TEST(SwapScheduleTest, EveryReadFollowsItsBuffersLastWriteAndPrecedesItsUpdate) {
  for (bool phased : {false, true}) {
    for (size_t buffers : {1, 2, 3, 4, 7}) {
      for (size_t groups : {1, 2, 3, 5, 8, 13}) {
        const SwapSchedule s(groups, buffers, phased);
        SCOPED_TRACE(std::to_string(groups) + " sub-groups, " + std::to_string(buffers) + " buffers" +
                     (phased ? ", phased" : ""));
        const std::vector<std::string> log = Simulate(s);
        auto at = [&](const std::string& e) {
          for (size_t i = 0; i < log.size(); ++i) {
            if (log[i] == e) return static_cast<long>(i);
          }
          return -1L;
        };
        for (size_t g = 0; g < groups; ++g) {
          const std::string n = std::to_string(g);
          ASSERT_GE(at("R" + n), 0);
          EXPECT_LT(at("R" + n), at("U" + n));
          EXPECT_LT(at("U" + n), at("W" + n));
          EXPECT_LT(at("W" + n), at("w" + n));
          if (g >= buffers) {
            EXPECT_LT(at("w" + std::to_string(g - buffers)), at("R" + n)) << "buffer reused early";
          }
        }
        if (phased) {  // no read is issued while a write is in flight
          int writes_in_flight = 0;
          for (const std::string& e : log) {
            if (e[0] == 'W') ++writes_in_flight;
            if (e[0] == 'w') --writes_in_flight;
            if (e[0] == 'R') {
              EXPECT_EQ(writes_in_flight, 0) << e;
            }
          }
        }
      }
    }
  }
}

TEST(SwapScheduleTest, EachBufferFitsOnlyTheSubGroupsThatCycleThroughIt) {
  using V = std::vector<int64_t>;
  // Two full sub-groups and a small last one: the small one shares buffer 0
  // with a full one, so both buffers stay full-size.
  EXPECT_EQ(SwapSchedule::BufferElems(V{100, 100, 10}, 2), (V{100, 100}));
  // Two sub-groups, two buffers: the second buffer is the small group's size.
  EXPECT_EQ(SwapSchedule::BufferElems(V{89, 9}, 2), (V{89, 9}));
  // Sub-group g lives in buffer g % buffers, whatever the sizes' order.
  EXPECT_EQ(SwapSchedule::BufferElems(V{5, 70, 3, 60, 4}, 3), (V{60, 70, 3}));
  EXPECT_EQ(SwapSchedule::BufferElems(V{50}, 1), (V{50}));
  for (size_t g = 0; g < 5; ++g) {
    const V sizes{5, 70, 3, 60, 4};
    const V fit = SwapSchedule::BufferElems(sizes, 3);
    EXPECT_GE(fit[SwapSchedule(sizes.size(), 3, true).BufferOf(g)], sizes[g]) << "sub-group " << g;
  }
}

}  // namespace
}  // namespace zinf::sched
