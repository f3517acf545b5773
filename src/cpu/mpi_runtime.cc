// The process-wide MPI state and the lock around MPI calls: see
// mpi_runtime.h.
#include "cpu/mpi_runtime.h"

#include <cstdlib>
#include <memory>

#include "common/logging.h"

namespace zinf::cpu {
namespace {

// Below MPI_THREAD_MULTIPLE every MPI call zinf makes holds this lock
// (recursive, so error formatting inside a locked section can lock again).
std::recursive_mutex mpi_mu;
std::atomic<bool> mpi_serialize{false};

}  // namespace

std::unique_lock<std::recursive_mutex> MpiLock() {
  return mpi_serialize.load() ? std::unique_lock<std::recursive_mutex>(mpi_mu)
                              : std::unique_lock<std::recursive_mutex>();
}

std::string MpiErrorText(int rc) {
  auto lock = MpiLock();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  int error_class = 0;
  if (MPI_Error_class(rc, &error_class) != MPI_SUCCESS) error_class = rc;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, static_cast<size_t>(len)) + " (MPI error class " + std::to_string(error_class) + ")";
}

StatusCode MpiErrorCode(int rc) {
  auto lock = MpiLock();
  int error_class = 0;
  if (MPI_Error_class(rc, &error_class) != MPI_SUCCESS) return StatusCode::kInternal;
  switch (error_class) {
    case MPI_ERR_TRUNCATE:
    case MPI_ERR_COUNT:
    case MPI_ERR_BUFFER:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kInternal;
  }
}

Result<MpiRuntime*> MpiRuntime::Get() {
  static std::mutex init_mu;
  static MpiRuntime* instance = nullptr;  // never deleted: MPI lives until exit
  std::lock_guard<std::mutex> lock(init_mu);
  if (instance) return instance;
  int initialized = 0, finalized = 0;
  if (int rc = MPI_Initialized(&initialized); rc != MPI_SUCCESS)
    return Internal("MPI_Initialized: " + MpiErrorText(rc));
  if (int rc = MPI_Finalized(&finalized); rc != MPI_SUCCESS) return Internal("MPI_Finalized: " + MpiErrorText(rc));
  if (finalized) return FailedPrecondition("MPI communicator: MPI has already been finalized in this process");
  const char* level_env = std::getenv("ZINF_MPI_THREAD_LEVEL");
  const bool force_serialized = level_env && std::string(level_env) == "serialized";
  auto runtime = std::unique_ptr<MpiRuntime>(new MpiRuntime());
  if (!initialized) {
    const int requested = force_serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE;
    if (int rc = MPI_Init_thread(nullptr, nullptr, requested, &runtime->provided_); rc != MPI_SUCCESS)
      return Unavailable("MPI_Init_thread: " + MpiErrorText(rc));
    runtime->initialized_here_ = true;
  } else if (int rc = MPI_Query_thread(&runtime->provided_); rc != MPI_SUCCESS) {
    return Internal("MPI_Query_thread: " + MpiErrorText(rc));
  }
  if (runtime->provided_ < MPI_THREAD_SERIALIZED) {
    return FailedPrecondition("MPI communicator: MPI provides thread level " + ThreadLevelName(runtime->provided_) +
                              "; zinf runs collectives on stream threads and needs at least MPI_THREAD_SERIALIZED");
  }
  runtime->serialize_ = force_serialized || runtime->provided_ < MPI_THREAD_MULTIPLE;
  mpi_serialize.store(runtime->serialize_);
  instance = runtime.release();
  if (instance->initialized_here_) std::atexit(&MpiRuntime::FinalizeAtExit);
  ZINF_LOG_DEBUG("MPI: initialized by {}, thread level {}{}", instance->initialized_here_ ? "zinf" : "the caller",
                 ThreadLevelName(instance->provided_), instance->serialize_ ? ", calls serialized" : "");
  return instance;
}

std::string MpiRuntime::ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return std::to_string(level);
}

void MpiRuntime::FinalizeAtExit() {
  if (skip_finalize_.load()) return;
  int finalized = 0;
  if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
}

}  // namespace zinf::cpu
