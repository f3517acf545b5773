// LocalRanksFromEnvironment: the launchers' word for how many ranks share
// this machine, and the default Communicator::local_size built on it.
#include "common/communicator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace zinf {
namespace {

constexpr const char* kVars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE",
                                 "SLURM_NTASKS_PER_NODE"};

// Clears the four variables for the test and puts back what was there.
class LocalRanksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 4; ++i) {
      const char* v = std::getenv(kVars[i]);
      saved_[i] = v ? std::make_pair(true, std::string(v)) : std::make_pair(false, std::string());
      ::unsetenv(kVars[i]);
    }
  }
  void TearDown() override {
    for (int i = 0; i < 4; ++i) {
      if (saved_[i].first)
        ::setenv(kVars[i], saved_[i].second.c_str(), 1);
      else
        ::unsetenv(kVars[i]);
    }
  }
  std::pair<bool, std::string> saved_[4];
};

// A communicator that says nothing of its own about the machine.
class PlainComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 8; }
  Status AllGather(const void*, void*, size_t, DType, Stream&) override { return Status::Ok(); }
  Status ReduceScatter(const void*, void*, size_t, DType, ReduceOp, Stream&) override { return Status::Ok(); }
  Status AllReduce(const void*, void*, size_t, DType, ReduceOp, Stream&) override { return Status::Ok(); }
  Status Broadcast(void*, size_t, DType, int, Stream&) override { return Status::Ok(); }
  Status Barrier(Stream&) override { return Status::Ok(); }
};

TEST_F(LocalRanksTest, EachLauncherIsReadAndTheFirstValidWins) {
  PlainComm comm;
  EXPECT_EQ(LocalRanksFromEnvironment(), 0);
  EXPECT_EQ(comm.local_size(), 1);  // nothing said: alone
  ::setenv("SLURM_NTASKS_PER_NODE", "6", 1);
  EXPECT_EQ(LocalRanksFromEnvironment(), 6);
  ::setenv("LOCAL_WORLD_SIZE", "4", 1);
  EXPECT_EQ(LocalRanksFromEnvironment(), 4);
  ::setenv("MPI_LOCALNRANKS", "3", 1);
  EXPECT_EQ(LocalRanksFromEnvironment(), 3);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  EXPECT_EQ(LocalRanksFromEnvironment(), 2);
  EXPECT_EQ(comm.local_size(), 2);
  // A value that is not a positive integer is skipped.
  for (const char* bad : {"0", "-1", "two", "2(x3)", ""}) {
    ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", bad, 1);
    EXPECT_EQ(LocalRanksFromEnvironment(), 3) << "'" << bad << "'";
  }
}

}  // namespace
}  // namespace zinf
