"""A worker's request through radixkvd with nothing but grpcio and stubs
generated from proto/radixkv/v1/radixkv.proto (docs/API.md shows how).

  /usr/bin/python3 generic_client.py STUB_DIR TARGET

Exits non-zero (AssertionError) when an answer is not what the API promises.
"""
import queue
import sys

import grpc

sys.path.insert(0, sys.argv[1])
from radixkv.v1 import radixkv_pb2 as pb  # noqa: E402
from radixkv.v1 import radixkv_pb2_grpc as rpc  # noqa: E402

channel = grpc.insecure_channel(sys.argv[2])
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
