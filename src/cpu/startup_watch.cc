// StartupWatch: see startup_watch.h.
#include "cpu/startup_watch.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace zinf::cpu {
namespace {

// The watch in force, for the exit handler: one at a time (MPI starts once).
std::atomic<StartupWatch*> g_active{nullptr};

}  // namespace

void StartupWatch::AtExit() {
  StartupWatch* w = g_active.load();
  if (w == nullptr) return;
  std::fprintf(stderr,
               "zinf: %s: the MPI library ended this process inside its start-up (MPI start-up (%s) had not "
               "finished): a rank of the job died or never started\n",
               w->who_.c_str(), w->phase_atomic_.load());
  std::fflush(stderr);
}

StartupWatch::StartupWatch(std::string who, double seconds, std::string setting)
    : who_(std::move(who)), setting_(std::move(setting)), seconds_(seconds) {
  static const bool registered = std::atexit(&StartupWatch::AtExit) == 0;
  (void)registered;
  g_active.store(this);
  thread_ = std::thread([this] { Watch(); });
}

StartupWatch::~StartupWatch() { Done(); }

void StartupWatch::Phase(const char* phase) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  phase_atomic_.store(phase);
}

void StartupWatch::Done() {
  StartupWatch* self = this;
  g_active.compare_exchange_strong(self, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StartupWatch::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds_);
  if (cv_.wait_until(lock, deadline, [this] { return done_; })) return;
  std::fprintf(stderr,
               "zinf: %s: MPI start-up (%s) has not finished after %g s (%s): a rank of the job died or never "
               "started. MPI offers no way out of this call, so this process exits (status 1)\n",
               who_.c_str(), phase_, seconds_, setting_.c_str());
  std::fflush(stderr);
  std::_Exit(EXIT_FAILURE);
}

}  // namespace zinf::cpu
