// The process-wide side of MpiComm (mpi_comm.h): who initialized MPI, at
// which thread level, whether MPI_Finalize runs at exit, and the one lock
// that serializes every MPI call zinf makes below MPI_THREAD_MULTIPLE. Also
// MPI error codes turned into text and a StatusCode. Private to src/cpu.
//
// Thread-safety: everything here may be called from any thread; MpiLock()
// is what makes MPI calls safe below MPI_THREAD_MULTIPLE.
#pragma once

#include <mpi.h>

#include <atomic>
#include <mutex>
#include <string>

#include "zinf/status.h"

namespace zinf::cpu {

// Held around every MPI call: the process-wide lock when MPI runs below
// MPI_THREAD_MULTIPLE (recursive, so error formatting inside a locked
// section can lock again), an empty lock otherwise.
std::unique_lock<std::recursive_mutex> MpiLock();

// "<MPI's text> (MPI error class N)" for an MPI return code.
std::string MpiErrorText(int rc);

// kInvalidArgument for the error classes a caller's arguments cause
// (truncation, count, buffer), kInternal otherwise.
StatusCode MpiErrorCode(int rc);

// Process-wide MPI state, created by the first Get and never deleted (MPI
// lives until exit).
class MpiRuntime {
 public:
  // Initializes MPI unless the caller already did (MPI_Init_thread asking for
  // MPI_THREAD_MULTIPLE, or SERIALIZED when ZINF_MPI_THREAD_LEVEL=serialized),
  // and registers MPI_Finalize at exit if it initialized. kFailedPrecondition
  // below MPI_THREAD_SERIALIZED or after MPI_Finalize.
  static Result<MpiRuntime*> Get();

  // After a deadline failure a finalize would wait for the silent rank.
  static void SkipFinalize() { skip_finalize_.store(true); }

 private:
  MpiRuntime() = default;

  static std::string ThreadLevelName(int level);
  static void FinalizeAtExit();

  int provided_ = MPI_THREAD_SINGLE;
  bool initialized_here_ = false;
  bool serialize_ = false;
  static inline std::atomic<bool> skip_finalize_{false};
};

}  // namespace zinf::cpu
