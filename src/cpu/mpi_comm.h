// MpiComm: the Communicator for HostDevice buffers, between processes started
// by mpirun (Open MPI; `--bind-to none` on small machines). Collectives are
// built from non-blocking point-to-point messages (MPI_Isend/MPI_Irecv,
// tagged with the collective's sequence number) polled against a deadline, so
// a rank that stops or dies makes every survivor fail with kUnavailable
// naming the collective, its number and the silent ranks instead of hanging.
// Reductions are the rank-order all-to-all + local sum of communicator.h.
//
// A process not started by an MPI launcher (no OMPI_COMM_WORLD_SIZE, PMI_SIZE
// or PMIX_RANK in the environment) and with MPI not initialized gets a 1-rank
// communicator that never calls MPI: collectives are local copies.
//
// MPI is initialized here (MPI_Init_thread, asking for MPI_THREAD_MULTIPLE)
// unless the caller already did; with less than MULTIPLE, every MPI call zinf
// makes is serialized by one process-wide lock (then the caller must not call
// MPI while zinf collectives run). MPI_Finalize runs at process exit, only if
// zinf initialized MPI and no communicator hit a deadline (a finalize would
// wait for the silent rank forever). A failed collective lets its transfers
// under way finish before it returns, and memory that a send it could not end
// still reads stays mapped until exit (io_memory.h). Setting
// ZINF_MPI_THREAD_LEVEL=serialized forces the serialized path (for tests).
//
// Start-up has no deadline in MPI: MPI_Init_thread and the MPI_Comm_dup of
// MPI_COMM_WORLD wait for every rank. When creating the communicator takes
// longer than its timeout_seconds (a rank died or never started), a
// StartupWatch (startup_watch.h) prints which call it was stuck in and ends
// the process with status 1: there is no way back from inside those calls.
//
// Thread-safety: as Communicator. Creating one is collective over
// MPI_COMM_WORLD (every rank must call it) and blocks.
#pragma once

#include <memory>

#include "common/communicator.h"

namespace zinf::cpu {

// True when an MPI launcher started this process.
bool StartedByMpiLauncher();

// The world communicator (a duplicate of MPI_COMM_WORLD), or the 1-rank local
// one described above. kInvalidArgument for a non-positive timeout;
// kFailedPrecondition when MPI was initialized by the caller with less than
// MPI_THREAD_SERIALIZED, or already finalized.
Result<std::unique_ptr<Communicator>> CreateMpiCommunicator(const CommOptions& options);

}  // namespace zinf::cpu
