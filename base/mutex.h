// File: base/mutex.h
//
// SharedMutex: a reader/writer mutex, and Mutex: an exclusive one that can
// wait for a condition, both with Abseil thread-safety annotations and
// visible to ThreadSanitizer.
//
// Normal builds use absl::Mutex. Debian's Abseil is a shared library built
// without TSan instrumentation, so under -fsanitize=thread TSan cannot see
// absl::Mutex's synchronisation and reports every critical section as a
// race. TSan builds therefore use std::shared_mutex (pthread_rwlock, which
// TSan intercepts) behind the same annotated interface, so the tsan preset
// checks the real locking discipline of the code; Mutex there is a
// std::mutex with a std::condition_variable that every Unlock notifies.
//
//   mutable SharedMutex mu_;
//   int x_ ABSL_GUARDED_BY(mu_);
//   void Set(int v) { WriterMutexLock l(&mu_); x_ = v; }
//   int Get() const { ReaderMutexLock l(&mu_); return x_; }
//
//   mutable Mutex m_;
//   int n_ ABSL_GUARDED_BY(m_);
//   void WaitForZero() { MutexLock l(&m_); m_.Await([&] { return n_ == 0; }); }
//
// Thread safety: that is its purpose. Not copyable or movable.
#ifndef RADIXKV_BASE_MUTEX_H_
#define RADIXKV_BASE_MUTEX_H_

#include "absl/base/config.h"
#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

#if defined(ABSL_HAVE_THREAD_SANITIZER)
#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#define RADIXKV_MUTEX_USES_STD 1
#else
#include "absl/synchronization/mutex.h"
#define RADIXKV_MUTEX_USES_STD 0
#endif

namespace radixkv {

class ABSL_LOCKABLE SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

#if RADIXKV_MUTEX_USES_STD
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
#else
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.Lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.Unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.ReaderLock(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.ReaderUnlock(); }

 private:
  absl::Mutex mu_;
#endif
};

// Holds `mu` exclusively for its scope.
class ABSL_SCOPED_LOCKABLE WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu)
      : mu_(mu) {
    mu_->Lock();
  }
  ~WriterMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds `mu` shared for its scope.
class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu)
      : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// An exclusive mutex whose holder can wait for a condition of the state it
// guards (Await), as absl::Mutex::Await does.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

#if RADIXKV_MUTEX_USES_STD
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    mu_.unlock();
    cv_.notify_all();
  }
  // Returns once `ready()` holds, evaluating it with the mutex held; the
  // mutex is released while waiting. REQUIRES: held.
  template <typename Pred>
  void Await(Pred ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> l(mu_, std::adopt_lock);
    cv_.wait(l, ready);
    l.release();
  }
  // Await until `deadline` at the latest; whether `ready()` holds.
  template <typename Pred>
  bool AwaitWithDeadline(Pred ready, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> l(mu_, std::adopt_lock);
    const bool ok = cv_.wait_until(l, absl::ToChronoTime(deadline), ready);
    l.release();
    return ok;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
#else
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.Lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.Unlock(); }
  template <typename Pred>
  void Await(Pred ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    mu_.Await(absl::Condition(&ready));
  }
  template <typename Pred>
  bool AwaitWithDeadline(Pred ready, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    return mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  }

 private:
  absl::Mutex mu_;
#endif
};

// Holds `mu` for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace radixkv

#endif  // RADIXKV_BASE_MUTEX_H_
