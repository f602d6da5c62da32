"""radixkv.errors without a daemon: the ErrorDetail in the
grpc-status-details-bin trailer, the class of each code; endpoint parsing
and the client's local checks of its namespace."""
import dataclasses
import os

import grpc
import pytest

import radixkv
from radixkv import errors, pb
from radixkv.client import grpc_target, validate_namespace

from rkv_testutil import SMALL


class FakeRpcError(grpc.RpcError, grpc.Call):
    """What a failed stub call raises: an RpcError that is also a Call."""

    def __init__(self, code, details, trailers=()):
        super().__init__()
        self._code, self._details, self._trailers = code, details, tuple(trailers)

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailers

    def initial_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


def trailer(field, reason, extra_any=()):
    status = pb.RpcStatus(code=5, message="m")
    for type_url, value in extra_any:
        status.details.add(type_url=type_url, value=value)
    status.details.add(type_url=errors.ERROR_DETAIL_TYPE_URL,
                       value=pb.ErrorDetail(field=field, reason=reason).SerializeToString())
    return (errors.STATUS_DETAILS_KEY, status.SerializeToString())


def test_detail_is_parsed():
    e = FakeRpcError(grpc.StatusCode.NOT_FOUND, "release_leases[0]: lease 9 ...",
                     [("other", "x"), trailer("release_leases", pb.ERROR_REASON_LEASE_NOT_FOUND,
                                              [("type.googleapis.com/other.Thing", b"\x01")])])
    err = radixkv.from_rpc_error(e)
    assert isinstance(err, radixkv.LeaseLost) and isinstance(err, radixkv.NotFound)
    assert err.code == grpc.StatusCode.NOT_FOUND
    assert (err.field, err.reason) == ("release_leases", errors.REASON_LEASE_NOT_FOUND)
    assert err.reason_name == "ERROR_REASON_LEASE_NOT_FOUND"
    assert "release_leases" in str(err) and err.message.startswith("release_leases[0]")


@pytest.mark.parametrize("code,cls", [
    (grpc.StatusCode.INVALID_ARGUMENT, radixkv.InvalidArgument),
    (grpc.StatusCode.OUT_OF_RANGE, radixkv.InvalidArgument),
    (grpc.StatusCode.NOT_FOUND, radixkv.NotFound),
    (grpc.StatusCode.FAILED_PRECONDITION, radixkv.FailedPrecondition),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, radixkv.ResourceExhausted),
    (grpc.StatusCode.UNAVAILABLE, radixkv.Unavailable),
    (grpc.StatusCode.CANCELLED, radixkv.Unavailable),
    (grpc.StatusCode.DEADLINE_EXCEEDED, radixkv.DeadlineExceeded),
    (grpc.StatusCode.INTERNAL, radixkv.Error),
])
def test_class_of_code(code, cls):
    err = radixkv.from_rpc_error(FakeRpcError(code, "x"))
    assert type(err) is cls and err.code == code
    assert (err.field, err.reason) == ("", errors.REASON_UNSPECIFIED)


def test_session_not_found_is_not_lease_lost():
    err = radixkv.from_rpc_error(FakeRpcError(
        grpc.StatusCode.NOT_FOUND, "session_id: unknown session",
        [trailer("session_id", pb.ERROR_REASON_SESSION_NOT_FOUND)]))
    assert type(err) is radixkv.NotFound
    assert err.reason == errors.REASON_SESSION_NOT_FOUND


def test_decides_from_detail_not_message():
    # A message that names release_leases, without the detail: no reason.
    err = radixkv.from_rpc_error(FakeRpcError(
        grpc.StatusCode.NOT_FOUND, "release_leases[0]: lease 1 is unknown"))
    assert type(err) is radixkv.NotFound and err.field == ""
    # A detail that does not parse is ignored.
    err = radixkv.from_rpc_error(FakeRpcError(
        grpc.StatusCode.INVALID_ARGUMENT, "x", [(errors.STATUS_DETAILS_KEY, b"\xff\xff")]))
    assert (err.field, err.reason) == ("", 0)


def test_grpc_target(monkeypatch):
    monkeypatch.delenv("RADIXKVCTL_ENDPOINT", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert grpc_target(None) == "unix:/run/user/7/radixkv/radixkvd.sock"
    assert grpc_target("") == "unix:/run/user/7/radixkv/radixkvd.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert grpc_target("") == f"unix:/tmp/radixkv-{os.getuid()}/radixkvd.sock"
    monkeypatch.setenv("RADIXKVCTL_ENDPOINT", "/tmp/x.sock")
    assert grpc_target(None) == "unix:/tmp/x.sock"
    assert grpc_target("unix:/a.sock") == "unix:/a.sock"
    assert grpc_target("./a.sock") == "unix:./a.sock"
    assert grpc_target("localhost:50051") == "localhost:50051"
    assert grpc_target("[::1]:9") == "[::1]:9"
    assert grpc_target("dns:///h:1") == "dns:///h:1"
    for bad in ("unix:", "host", "host:0", "host:70000", ":80", "host:x"):
        with pytest.raises(radixkv.InvalidArgument) as e:
            grpc_target(bad)
        assert e.value.field == "endpoint"


@pytest.mark.parametrize("change,field", [
    (dict(num_layers=0), "namespace.num_layers"),
    (dict(num_kv_heads=0), "namespace.num_kv_heads"),
    (dict(head_dim=0), "namespace.head_dim"),
    (dict(page_size=0), "namespace.page_size"),
    (dict(dtype=0), "namespace.dtype"),
    (dict(dtype=7), "namespace.dtype"),
    (dict(tp_rank=1, tp_size=1), "namespace.tp_rank"),
    (dict(tp_rank=1, tp_size=0), "namespace.tp_rank"),
])
def test_client_refuses_bad_namespace(change, field):
    spec = dataclasses.replace(SMALL, **change)
    with pytest.raises(radixkv.InvalidArgument) as e:
        validate_namespace(spec)
    assert e.value.field == field and e.value.reason == errors.REASON_INVALID
    with pytest.raises(radixkv.InvalidArgument) as e:
        radixkv.Client("/nonexistent.sock", namespace=spec, initial_wait=0)
    assert e.value.field == field


def test_client_refuses_bad_options():
    with pytest.raises(ValueError):
        radixkv.Client("/nonexistent.sock", namespace=SMALL, call_timeout=0)
    with pytest.raises(ValueError):
        radixkv.Client("/nonexistent.sock", namespace=SMALL, release_delay=-1)
    with pytest.raises(TypeError):
        radixkv.Client("/nonexistent.sock", namespace=None)


def test_default_socket_follows_the_system_daemon(tmp_path, monkeypatch):
    """The same choice as the C++ client: the system socket when it exists,
    else the per-user one."""
    import socket as socketlib
    from radixkv.client import default_socket_path, user_socket_path
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert default_socket_path(str(tmp_path)) == user_socket_path()
    assert user_socket_path() == str(tmp_path / "xdg" / "radixkv" / "radixkvd.sock")
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    try:
        sock.bind(str(tmp_path / "radixkvd.sock"))
        assert default_socket_path(str(tmp_path)) == str(tmp_path / "radixkvd.sock")
    finally:
        sock.close()
