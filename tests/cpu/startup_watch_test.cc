// StartupWatch: a section that finishes in time is left alone; one that
// does not ends the process with status 1 and a message naming the caller,
// the call it was stuck in and the deadline.
#include "cpu/startup_watch.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace zinf::cpu {
namespace {

TEST(StartupWatchTest, ASectionThatFinishesInTimeGoesOn) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    StartupWatch watch("rank 2", 30.0, "zinf.comm_timeout_s");
    watch.Phase("MPI_Init_thread");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    watch.Done();
    watch.Done();  // twice is fine; so is the destructor after it
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0)
      << "Done must wake the watch, not wait out its deadline";
}

TEST(StartupWatchTest, AStuckSectionEndsTheProcessNamingTheCall) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StartupWatch watch("rank 3", 0.2, "zinf.comm_timeout_s");
        watch.Phase("MPI_Comm_dup");
        std::this_thread::sleep_for(std::chrono::seconds(20));  // a call that never returns
      },
      ::testing::ExitedWithCode(1),
      "zinf: rank 3: MPI start-up \\(MPI_Comm_dup\\) has not finished after 0.2 s \\(zinf.comm_timeout_s\\)");
}

// When the MPI library calls exit() with its own status inside MPI_Init
// (a peer is gone), the exit handler still names the call.
TEST(StartupWatchTest, AnExitInsideTheSectionIsNamed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StartupWatch watch("rank 2", 30.0, "zinf.comm_timeout_s");
        watch.Phase("MPI_Init_thread");
        std::exit(195);
      },
      ::testing::ExitedWithCode(195),
      "zinf: rank 2: the MPI library ended this process inside its start-up \\(MPI start-up \\(MPI_Init_thread\\)");
}

// After the section, an exit is the program's own business: nothing is said.
TEST(StartupWatchTest, AnExitAfterTheSectionSaysNothing) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        { StartupWatch watch("rank 2", 30.0, "zinf.comm_timeout_s"); }
        std::fputs("plain exit\n", stderr);
        std::exit(3);
      },
      ::testing::ExitedWithCode(3), "^plain exit\n$");
}

}  // namespace
}  // namespace zinf::cpu
