// File: base/mutex.h
//
// SharedMutex: a reader/writer mutex with Abseil thread-safety annotations
// that ThreadSanitizer can see.
//
// Normal builds use absl::Mutex. Debian's Abseil is a shared library built
// without TSan instrumentation, so under -fsanitize=thread TSan cannot see
// absl::Mutex's synchronisation and reports every critical section as a
// race. TSan builds therefore use std::shared_mutex (pthread_rwlock, which
// TSan intercepts) behind the same annotated interface, so the tsan preset
// checks the real locking discipline of the code.
//
//   mutable SharedMutex mu_;
//   int x_ ABSL_GUARDED_BY(mu_);
//   void Set(int v) { WriterMutexLock l(&mu_); x_ = v; }
//   int Get() const { ReaderMutexLock l(&mu_); return x_; }
//
// Thread safety: that is its purpose. Not copyable or movable.
#ifndef RADIXKV_BASE_MUTEX_H_
#define RADIXKV_BASE_MUTEX_H_

#include "absl/base/config.h"
#include "absl/base/thread_annotations.h"

#if defined(ABSL_HAVE_THREAD_SANITIZER)
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

}  // namespace radixkv

#endif  // RADIXKV_BASE_MUTEX_H_
