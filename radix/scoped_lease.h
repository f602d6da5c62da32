// File: radix/scoped_lease.h
//
// ScopedLease: a move-only owner of one RadixTree lease for in-process users
// (tests, benchmarks, an embedded index). It ends the lease on destruction
// unless it was already ended through it (Commit with release, Release) or
// handed off with TakeId().
//
//   ASSIGN_OR_RETURN(AcquireResult a, tree.Acquire(req));
//   ScopedLease lease(&tree, a.lease);
//   ... write the new pages ...
//   ASSIGN_OR_RETURN(CommitResult c, lease.Commit(a.new_blocks, true));
//
// Ownership: borrows the tree, which must outlive the ScopedLease.
// Thread safety: a ScopedLease is not shared between threads without
// external locking; the tree itself is thread-safe.
#ifndef RADIXKV_RADIX_SCOPED_LEASE_H_
#define RADIXKV_RADIX_SCOPED_LEASE_H_

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "radix/radix_tree.h"

namespace radixkv {

class ScopedLease {
 public:
  ScopedLease() = default;
  // Takes ownership of `id` (0: owns nothing) on `tree`.
  ScopedLease(RadixTree* tree, LeaseId id) : tree_(tree), id_(id) {}
  ~ScopedLease() { Reset(); }

  ScopedLease(ScopedLease&& other) noexcept
      : tree_(other.tree_), id_(std::exchange(other.id_, 0)) {}
  ScopedLease& operator=(ScopedLease&& other) noexcept {
    if (this != &other) {
      Reset();
      tree_ = other.tree_;
      id_ = std::exchange(other.id_, 0);
    }
    return *this;
  }
  ScopedLease(const ScopedLease&) = delete;
  ScopedLease& operator=(const ScopedLease&) = delete;

  LeaseId id() const { return id_; }
  bool active() const { return id_ != 0; }

  // RadixTree::Commit on the owned lease; with release (and success) this
  // object no longer owns it. NOT_FOUND when it owns none.
  absl::StatusOr<CommitResult> Commit(uint32_t blocks, bool release) {
    if (id_ == 0) return absl::NotFoundError("ScopedLease: no lease held");
    absl::StatusOr<CommitResult> r = tree_->Commit(id_, blocks, release);
    if (r.ok() && r->released) id_ = 0;
    return r;
  }

  // Ends the lease now. NOT_FOUND when it owns none.
  absl::Status Release() {
    if (id_ == 0) return absl::NotFoundError("ScopedLease: no lease held");
    return tree_->Release(std::exchange(id_, 0));
  }

  // Gives up ownership without ending the lease; the caller must end it.
  LeaseId TakeId() { return std::exchange(id_, 0); }

 private:
  void Reset() {
    if (id_ != 0) tree_->Release(std::exchange(id_, 0)).IgnoreError();
  }

  RadixTree* tree_ = nullptr;
  LeaseId id_ = 0;
};

}  // namespace radixkv

#endif  // RADIXKV_RADIX_SCOPED_LEASE_H_
