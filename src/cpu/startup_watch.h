// StartupWatch: the deadline for calls that have none. MPI's start-up
// (MPI_Init_thread, and MPI_Comm_dup of MPI_COMM_WORLD) waits for every rank
// of the job without a timeout and cannot be interrupted: a rank that dies
// or never starts leaves the others blocked inside MPI for ever. A watch
// started before such a section ends the process (a message on stderr, then
// exit status 1 without exit handlers, since MPI_Finalize would block too)
// when the section has not called Done within its deadline. It can name the
// call it was in, not the missing rank: MPI does not say who it waits for.
// When the MPI library itself ends the process inside the section with
// exit(), an exit handler says so on stderr, naming the call, before the
// process goes. (Open MPI's runtime has also been seen to end a survivor
// there with no exit handlers run: then nothing can be said.)
//
// Thread-safety: Phase and Done may be called from any thread; the watch
// runs one thread of its own until Done or destruction.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace zinf::cpu {

class StartupWatch {
 public:
  // `who` opens the message ("rank 3"); `seconds` > 0 is the deadline, which
  // `setting` names ("zinf.comm_timeout_s").
  StartupWatch(std::string who, double seconds, std::string setting);
  ~StartupWatch();  // Done
  StartupWatch(const StartupWatch&) = delete;
  StartupWatch& operator=(const StartupWatch&) = delete;

  // What the section is about to call ("MPI_Init_thread"), for the message.
  void Phase(const char* phase);
  // The section finished: the watch stops.
  void Done();

 private:
  void Watch();
  static void AtExit();

  const std::string who_, setting_;
  const double seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;                                  // mu_
  const char* phase_ = "start-up";                     // mu_
  std::atomic<const char*> phase_atomic_{"start-up"};  // phase_, for the exit handler
  std::thread thread_;
};

}  // namespace zinf::cpu
