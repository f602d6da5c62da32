"""Typed errors of the radixkv Python client.

Every error is an `Error` with the gRPC status `code` (grpc.StatusCode),
the daemon's `message`, and, when the daemon attached one, the
radixkv.v1.ErrorDetail of the failed field: `field` ("release_leases",
"namespace.page_size", ...) and `reason` (a radixkv.v1.ErrorReason number:
REASON_INVALID, REASON_SESSION_NOT_FOUND, REASON_LEASE_NOT_FOUND,
REASON_LIMIT). The detail travels in the `grpc-status-details-bin`
trailer as a serialized radixkv.v1.RpcStatus (docs/API.md "Errors").
Programs decide from `code`, `field` and `reason`, never from the message.

    Error
    ├── InvalidArgument      INVALID_ARGUMENT (and OUT_OF_RANGE)
    ├── NotFound             NOT_FOUND
    │   └── LeaseLost        the lease is not live: reason LEASE_NOT_FOUND
    ├── FailedPrecondition   FAILED_PRECONDITION
    ├── ResourceExhausted    RESOURCE_EXHAUSTED
    ├── Unavailable          UNAVAILABLE, CANCELLED: the daemon did not answer
    │   └── DeadlineExceeded DEADLINE_EXCEEDED
    └── AttachError          mapping the pool failed (attach socket, mmap)

Thread safety: plain values.
"""
from typing import Optional, Tuple

import grpc

__all__ = [
    "Error", "InvalidArgument", "NotFound", "LeaseLost", "FailedPrecondition",
    "ResourceExhausted", "Unavailable", "DeadlineExceeded", "AttachError",
    "from_rpc_error", "error_detail", "REASON_UNSPECIFIED", "REASON_INVALID",
    "REASON_SESSION_NOT_FOUND", "REASON_LEASE_NOT_FOUND", "REASON_LIMIT",
]

# radixkv.v1.ErrorReason values (fixed by the proto; they never change).
REASON_UNSPECIFIED = 0
REASON_INVALID = 1
REASON_SESSION_NOT_FOUND = 2
REASON_LEASE_NOT_FOUND = 3
REASON_LIMIT = 4
_REASON_NAMES = {
    REASON_UNSPECIFIED: "ERROR_REASON_UNSPECIFIED",
    REASON_INVALID: "ERROR_REASON_INVALID",
    REASON_SESSION_NOT_FOUND: "ERROR_REASON_SESSION_NOT_FOUND",
    REASON_LEASE_NOT_FOUND: "ERROR_REASON_LEASE_NOT_FOUND",
    REASON_LIMIT: "ERROR_REASON_LIMIT",
}

STATUS_DETAILS_KEY = "grpc-status-details-bin"
ERROR_DETAIL_TYPE_URL = "type.googleapis.com/radixkv.v1.ErrorDetail"


class Error(Exception):
    """A radixkv call failed. `code` is a grpc.StatusCode; `field` and
    `reason` come from the daemon's ErrorDetail ("" and 0 without one)."""

    default_code = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None,
                 field: str = "", reason: int = REASON_UNSPECIFIED):
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.field = field
        self.reason = int(reason)

    @property
    def reason_name(self) -> str:
        return _REASON_NAMES.get(self.reason, f"ERROR_REASON_{self.reason}")

    def __str__(self) -> str:
        text = f"{self.code.name}: {self.message}"
        if self.field or self.reason:
            text += f" [field={self.field!r} reason={self.reason_name}]"
        return text

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.message!r}, code={self.code}, "
                f"field={self.field!r}, reason={self.reason_name})")


class InvalidArgument(Error):
    """The request is malformed or out of range: fix the caller."""
    default_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(Error):
    """An unknown session or lease (see `reason`)."""
    default_code = grpc.StatusCode.NOT_FOUND


class LeaseLost(NotFound):
    """The lease is no longer live: ended (released, committed with release,
    left its `with` block), expired (--lease_ttl), or its session ended
    (daemon restart). Raised with reason REASON_LEASE_NOT_FOUND and field
    "lease_id", whether the daemon said so or the client already knew."""


class FailedPrecondition(Error):
    """The current state forbids the request (e.g. committing more blocks
    than the lease has uncommitted, key mode disabled, other page_bytes)."""
    default_code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(Error):
    """A daemon limit is reached (--max_sessions, --max_leases_per_session)."""
    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(Error):
    """The daemon did not answer (down, restarting, draining, cancelled)."""
    default_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(Unavailable):
    """The call missed its deadline (a hung or overloaded daemon)."""
    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class AttachError(Error):
    """The pool could not be mapped: no attach socket, refused (code
    PERMISSION_DENIED), a reply that is no mappable pool, mmap failure, or a
    cuda pool this process cannot map."""
    default_code = grpc.StatusCode.UNAVAILABLE


_CLASS_OF_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.CANCELLED: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def error_detail(trailing_metadata) -> Tuple[str, int]:
    """(field, reason) of the radixkv.v1.ErrorDetail in a call's trailing
    metadata; ("", 0) when there is none or it does not parse."""
    if not trailing_metadata:
        return "", REASON_UNSPECIFIED
    for key, value in trailing_metadata:
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        from radixkv import pb  # pylint: disable=import-outside-toplevel
        from google.protobuf.message import DecodeError  # pylint: disable=import-outside-toplevel
        try:
            status = pb.RpcStatus.FromString(value)
            for any_detail in status.details:
                if any_detail.type_url == ERROR_DETAIL_TYPE_URL:
                    detail = pb.ErrorDetail.FromString(any_detail.value)
                    return detail.field, int(detail.reason)
        except DecodeError:
            pass
    return "", REASON_UNSPECIFIED


def from_rpc_error(e: grpc.RpcError) -> Error:
    """The typed Error for a failed grpc call (`grpc.RpcError` that is also
    a grpc.Call, as every error of a stub call is)."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    message = (e.details() if hasattr(e, "details") else None) or str(e)
    trailers = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    field, reason = error_detail(trailers)
    if code == grpc.StatusCode.NOT_FOUND and reason == REASON_LEASE_NOT_FOUND:
        cls = LeaseLost
    else:
        cls = _CLASS_OF_CODE.get(code, Error)
    return cls(message, code=code, field=field, reason=reason)


def is_caller_error(err: Error) -> bool:
    """Whether `err` is about the request itself (the worker must hear of
    it) rather than about the daemon (which degrades)."""
    return err.code in (grpc.StatusCode.INVALID_ARGUMENT,
                        grpc.StatusCode.FAILED_PRECONDITION,
                        grpc.StatusCode.OUT_OF_RANGE)
