// Locking written in code: clang's thread-safety attributes
// (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html) as macros, and
// Mutex / MutexLock, a std::mutex and its scoped lock annotated as a
// capability, so that clang's -Wthread-safety checks what a comment would
// only claim: a GUARDED_BY member is touched only with its mutex held, a
// REQUIRES function is called only with it held. Under other compilers the
// macros expand to nothing (the build option ZINF_THREAD_SAFETY_ANALYSIS
// turns the check on with clang). Thread-safety: Mutex is a mutex.
#pragma once

#include <mutex>

#if defined(__clang__)
#define ZINF_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define ZINF_THREAD_ANNOTATION_(x)
#endif

#define CAPABILITY(x) ZINF_THREAD_ANNOTATION_(capability(x))
#define SCOPED_CAPABILITY ZINF_THREAD_ANNOTATION_(scoped_lockable)
#define GUARDED_BY(x) ZINF_THREAD_ANNOTATION_(guarded_by(x))
#define PT_GUARDED_BY(x) ZINF_THREAD_ANNOTATION_(pt_guarded_by(x))
#define REQUIRES(...) ZINF_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) ZINF_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) ZINF_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define EXCLUDES(...) ZINF_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) ZINF_THREAD_ANNOTATION_(assert_capability(x))
#define RETURN_CAPABILITY(x) ZINF_THREAD_ANNOTATION_(lock_returned(x))
// Turns the analysis off for one function; say why beside it.
#define NO_THREAD_SAFETY_ANALYSIS ZINF_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace zinf {

// std::mutex as a capability the analysis knows.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // Tells the analysis the caller holds this mutex (nothing is checked at
  // run time): for code it cannot follow, e.g. a lambda that runs at once
  // under its caller's lock.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

}  // namespace zinf
