"""Clients of radixkvd that are not radixkv's own.

  PYTHON generic_client.py [stubs] STUB_DIR TARGET
      a worker's request with nothing but grpcio and the stubs that
      `PYTHON -m grpc_tools.protoc` generated from
      proto/radixkv/v1/radixkv.proto into STUB_DIR (docs/API.md shows how);
  PYTHON generic_client.py reflection TARGET
      grpc_requests, a generic client that learns every service and message
      from the daemon's server reflection (no .proto, no stubs): the errors
      a generic client gives for an unknown service or method, a request
      field the message lacks, malformed JSON, and a bad namespace (the
      daemon's INVALID_ARGUMENT names the field).

TARGET is a gRPC target such as unix:/tmp/radixkv-1000/radixkvd.sock.
Exits non-zero (AssertionError) when an answer is not what the API promises.
"""
import queue
import sys

import grpc


def stubs(stub_dir, target):
    sys.path.insert(0, stub_dir)
    from radixkv.v1 import radixkv_pb2 as pb
    from radixkv.v1 import radixkv_pb2_grpc as rpc

    channel = grpc.insecure_channel(target)
    kv, admin = rpc.KvCacheStub(channel), rpc.AdminStub(channel)
    ns = pb.Namespace(model="demo", num_layers=2, num_kv_heads=2, head_dim=64,
                      page_size=16, dtype=pb.DTYPE_FLOAT16)

    # 1. Session: open, keep the stream open while working.
    outbox = queue.Queue()
    outbox.put(pb.SessionRequest(open=pb.OpenSession(namespace=ns, client_name="py")))
    stream = kv.Session(iter(outbox.get, None))
    info = next(stream).session
    print("session", info.session_id, "pool", info.pool.backend,
          info.pool.capacity_pages, "pages")

    # 2. Acquire: nothing cached yet, 6 full blocks of 16 tokens to write.
    tokens = list(range(100))
    a = kv.Acquire(pb.AcquireRequest(session_id=info.session_id, tokens=tokens,
                                     allocate=True))
    print("matched", a.matched_blocks, "new", a.new_blocks, "pages", list(a.pages))
    assert (a.matched_blocks, a.new_blocks) == (0, 6)

    # 3. (prefill writes K/V into the new pages) then Commit and release.
    c = kv.Commit(pb.CommitRequest(session_id=info.session_id, lease_id=a.lease_id,
                                   blocks=a.new_blocks, release=True))
    print("inserted", c.inserted)
    assert c.inserted == 6 and c.released

    # 4. The next request with this prefix hits.
    m = kv.Match(pb.MatchRequest(namespace=ns, tokens=tokens))
    print("matched_tokens", m.matched_tokens)
    assert m.matched_tokens == 96

    # 5. Bad input names the field.
    try:
        kv.Acquire(pb.AcquireRequest(session_id=info.session_id))
        raise AssertionError("empty Acquire accepted")
    except grpc.RpcError as e:
        print("error", e.code().name, e.details())
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "tokens" in e.details()

    stats = admin.GetStats(pb.GetStatsRequest()).stats
    assert stats.cached_pages == 6 and stats.sessions == 1 and stats.invariants_ok
    outbox.put(None)  # ends the Session stream: the daemon closes the session
    for _ in stream:  # the daemon then finishes the stream with OK
        pass
    assert stream.code() == grpc.StatusCode.OK, stream.code()
    channel.close()
    print("ok")


def expect_error(what, call, error_type, *needles):
    """`call` must raise `error_type` whose text holds every needle."""
    try:
        got = call()
    except error_type as e:
        text = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.RpcError) else str(e)
        print(f"{what}: {type(e).__name__}: {text.splitlines()[0]}")
        for n in needles:
            assert n in text, f"{what}: {n!r} not in {text!r}"
        return
    raise AssertionError(f"{what}: accepted, answered {got!r}")


def reflection(target):
    from google.protobuf import json_format
    from grpc_requests import Client

    c = Client(target)
    services = set(c.service_names)
    print("services", sorted(services))
    assert {"radixkv.v1.KvCache", "radixkv.v1.Admin", "grpc.health.v1.Health"} <= services
    # Every radixkv type came from reflection: no stub was imported.
    assert not any(m.startswith("radixkv") for m in sys.modules), "radixkv stubs imported"

    stats = c.request("radixkv.v1.Admin", "GetStats", {})
    print("GetStats", stats)
    assert stats["stats"]["invariants_ok"] is True

    ns = {"model": "m", "page_size": 4}
    expect_error("unknown method", lambda: c.request("radixkv.v1.KvCache", "Matchh", {}),
                 ValueError, "Matchh")
    expect_error("unknown service", lambda: c.request("radixkv.v1.KvCach", "Match", {}),
                 ValueError, "radixkv.v1.KvCach")
    expect_error("a field the message lacks",
                 lambda: c.request("radixkv.v1.KvCache", "Match",
                                   {"namespace": {"modle": "m", "page_size": 4}, "tokens": [1]}),
                 json_format.ParseError, "modle", "radixkv.v1.Namespace")
    match_type = c.get_method_meta("radixkv.v1.KvCache", "Match").input_type
    expect_error("malformed JSON",
                 lambda: c.request("radixkv.v1.KvCache", "Match",
                                   json_format.Parse('{"namespace": {"model": "m",', match_type())),
                 json_format.ParseError)
    expect_error("a string where a number belongs",
                 lambda: c.request("radixkv.v1.KvCache", "Match",
                                   {"namespace": ns, "tokens": ["one"]}),
                 json_format.ParseError, "tokens")
    expect_error("page_size 0", lambda: c.request(
        "radixkv.v1.KvCache", "Match",
        {"namespace": dict(ns, page_size=0), "tokens": [1]}),
        grpc.RpcError, "INVALID_ARGUMENT", "namespace.page_size")
    # A valid request still answers after the refusals.
    m = c.request("radixkv.v1.KvCache", "Match", {"namespace": ns, "tokens": list(range(1, 10))})
    print("Match", m)
    assert m["total_blocks"] == 2 and "matched_blocks" not in m
    print("ok")


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "stubs":
        stubs(args[1], args[2])
    elif len(args) == 2 and args[0] == "reflection":
        reflection(args[1])
    elif len(args) == 2:  # STUB_DIR TARGET, as docs/API.md runs it
        stubs(args[0], args[1])
    else:
        sys.exit(__doc__)
