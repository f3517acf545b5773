// The dead-peer cases of MpiComm, run under mpirun (see tests/cpu/CMakeLists.txt):
//   mpi_comm_failure stop   the last rank SIGSTOPs itself
//   mpi_comm_failure exit   the last rank exits (mpirun needs
//                           --mca orte_abort_on_non_zero_status 0)
//   mpi_comm_failure startup  the last rank never starts MPI: it sleeps
//                           past the deadline and exits. Every survivor's
//                           CreateMpiCommunicator, stuck in MPI's start-up,
//                           must end the process within the 3 s deadline
//                           with StartupWatch's message (ctest counts those)
// In the stop and exit modes the victim stops after the ranks have exchanged
// their pids. Every survivor then runs an
// all-reduce with a 3 s deadline and must get kUnavailable naming the
// collective, its number and the silent rank within the deadline (plus a
// small margin), and a later call must fail at once. Each survivor prints
// "rank R: survivor ok ..." or "rank R: survivor FAILED ..."; ctest counts
// the ok lines (exit codes say nothing here: mpirun's reflects the victim).
//
// Cleanup: rank 0 sends SIGCONT to a stopped victim, which then exits by
// itself (SIGKILLing a stopped rank makes Open MPI 4.1's mpirun hang). The
// ctest TIMEOUT is the backstop; mpirun kills its children when it is killed.
// Processes that never finalize MPI exit non-zero: with Open MPI, a zero exit
// without MPI_Finalize aborts the whole job, survivors included.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/communicator.h"
#include "cpu/host_device.h"
#include "cpu/mpi_comm.h"

namespace zinf::cpu {
namespace {

constexpr double kTimeoutSeconds = 3.0;
constexpr double kMarginSeconds = 2.0;  // polling, a loaded 2-core machine
constexpr int kExitVictim = 9;
constexpr int kExitSurvivor = 3;  // non-zero on purpose, see above

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "mpi_comm_failure: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

int Main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "stop" && mode != "exit" && mode != "startup") Die("usage: mpi_comm_failure stop|exit|startup");
  if (mode == "startup") {
    const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
    const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
    if (!r || !s) Die("startup mode runs under Open MPI's mpirun");
    if (std::atoi(r) == std::atoi(s) - 1) {
      usleep(static_cast<useconds_t>((kTimeoutSeconds + 3) * 1e6));
      std::_Exit(kExitVictim);
    }
    auto comm = CreateMpiCommunicator(CommOptions{.timeout_seconds = kTimeoutSeconds, .checking = false});
    std::printf("rank %s: survivor FAILED: start-up returned without the missing rank: %s\n", r,
                comm.ok() ? "ok" : comm.status().ToString().c_str());
    std::fflush(stdout);
    std::_Exit(kExitSurvivor);
  }
  auto device = CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 16 << 20, .checking = true});
  if (!device.ok()) Die(device.status().ToString());
  auto stream = (*device)->CreateStream();
  if (!stream.ok()) Die(stream.status().ToString());
  auto created = CreateMpiCommunicator(CommOptions{.timeout_seconds = kTimeoutSeconds, .checking = false});
  if (!created.ok()) Die(created.status().ToString());
  Communicator& comm = **created;
  const int rank = comm.rank(), n = comm.size(), victim = n - 1;
  if (n < 2) Die("needs 2 or more ranks");

  // Collective #1: everyone's pid.
  auto pids_dev = (*device)->Allocate(4 * n, **stream);
  auto pid_dev = (*device)->Allocate(4, **stream);
  if (!pids_dev.ok() || !pid_dev.ok()) Die("allocate");
  const int32_t pid = static_cast<int32_t>(getpid());
  std::vector<int32_t> pids(n);
  Status st = (*device)->CopyToDevice(*pid_dev, &pid, 4, **stream);
  if (st.ok()) st = comm.AllGather(*pid_dev, *pids_dev, 1, DType::kFloat32, **stream);  // raw 4-byte elements
  if (st.ok()) st = (*device)->CopyToHost(pids.data(), *pids_dev, 4 * n, **stream);
  if (st.ok()) st = (**stream).Synchronize();
  if (!st.ok()) Die("exchanging pids: " + st.ToString());

  if (rank == victim) {
    if (mode == "stop") raise(SIGSTOP);  // until a survivor sends SIGCONT
    std::_Exit(kExitVictim);
  }

  // Collective #2, which the victim never joins.
  const size_t count = 1024;
  auto buf = (*device)->Allocate(4 * count, **stream);
  if (!buf.ok()) Die("allocate");
  if (!(st = (*device)->Memset(*buf, 0, 4 * count, **stream)).ok() || !(st = (**stream).Synchronize()).ok())
    Die(st.ToString());
  const auto t0 = std::chrono::steady_clock::now();
  st = comm.AllReduce(*buf, *buf, count, DType::kFloat32, ReduceOp::kSum, **stream);
  if (st.ok()) st = (**stream).Synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Collective #3 must fail at enqueue, at once.
  const Status later = comm.Barrier(**stream);

  if (mode == "stop" && rank == 0) kill(pids[victim], SIGCONT);

  const std::string want =
      "all_reduce #2 (fp32, 1024 elements): no progress after 3.0 s; silent ranks: " + std::to_string(victim);
  std::string problem;
  if (st.code() != StatusCode::kUnavailable) problem += " wanted kUnavailable;";
  if (st.message() != want) problem += " wanted the message '" + want + "';";
  if (seconds < kTimeoutSeconds || seconds > kTimeoutSeconds + kMarginSeconds)
    problem += " returned after " + std::to_string(seconds) + " s;";
  if (later.code() != StatusCode::kUnavailable || later.message().find("barrier") == std::string::npos ||
      later.message().find(want) == std::string::npos)
    problem += " the next call gave '" + later.ToString() + "';";
  if (problem.empty())
    std::printf("rank %d: survivor ok after %.2f s: %s | next call: %s\n", rank, seconds, st.ToString().c_str(),
                later.ToString().c_str());
  else
    std::printf("rank %d: survivor FAILED:%s got '%s' after %.2f s\n", rank, problem.c_str(), st.ToString().c_str(),
                seconds);
  std::fflush(stdout);
  // Skip the destructors (streams, device) and MPI_Finalize alike: a broken
  // communicator is left as it is, and the process ends here.
  std::_Exit(kExitSurvivor);
}

}  // namespace
}  // namespace zinf::cpu

int main(int argc, char** argv) { return zinf::cpu::Main(argc, argv); }
