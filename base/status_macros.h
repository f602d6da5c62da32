// File: base/status_macros.h
//
// RETURN_IF_ERROR and ASSIGN_OR_RETURN: early-return helpers for
// absl::Status / absl::StatusOr. Debian 12's Abseil (20220623) predates
// absl/status/status_macros.h, so the project defines its own pair here.
//
//   absl::Status Foo() {
//     RETURN_IF_ERROR(Bar());                 // returns Bar()'s error, if any
//     ASSIGN_OR_RETURN(int x, ParseInt(s));   // declares x, or returns the error
//     ASSIGN_OR_RETURN(y_, MakeY());          // assigns to an existing lvalue
//     return absl::OkStatus();
//   }
//
// Both work in functions returning absl::Status or any absl::StatusOr<T>
// (a StatusOr is constructible from a non-OK absl::Status).
//
// Thread safety: macros only; no state.
#ifndef RADIXKV_BASE_STATUS_MACROS_H_
#define RADIXKV_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RADIXKV_STATUS_MACROS_CONCAT_INNER_(a, b) a##b
#define RADIXKV_STATUS_MACROS_CONCAT_(a, b) \
  RADIXKV_STATUS_MACROS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing
// function when it is not OK.
#define RETURN_IF_ERROR(expr)                                       \
  do {                                                              \
    ::absl::Status radixkv_status_macros_s_ = (expr);               \
    if (ABSL_PREDICT_FALSE(!radixkv_status_macros_s_.ok())) {       \
      return radixkv_status_macros_s_;                              \
    }                                                               \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>) once; on error returns its status
// from the enclosing function, otherwise moves the value into `lhs`, which
// may be a declaration ("auto x") or an existing lvalue. Expands to several
// statements: do not use it as the body of an unbraced if/else.
#define ASSIGN_OR_RETURN(lhs, rexpr)                                         \
  RADIXKV_ASSIGN_OR_RETURN_IMPL_(                                            \
      RADIXKV_STATUS_MACROS_CONCAT_(radixkv_statusor_, __COUNTER__), lhs,    \
      rexpr)

#define RADIXKV_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) {                  \
    return std::move(statusor).status();                     \
  }                                                          \
  lhs = std::move(statusor).value()

#endif  // RADIXKV_BASE_STATUS_MACROS_H_
