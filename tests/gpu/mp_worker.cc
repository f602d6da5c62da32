// mp_worker: an inference-worker stand-in for the multi-process tests. It
// talks to a live radixkvd through the generated gRPC stub and maps the pool
// through client/attach.h. Page contents are a function of (seed, block,
// byte), so any process can check what another wrote.
//
//   mp_worker write SOCKET SEED BLOCKS [hang]
//       open a session, Acquire(allocate) the prompt of SEED, fill the new
//       pages, Commit(release). With `hang`: fill half of the first page,
//       print "writing ..." and sleep until killed.
//   mp_worker read SOCKET SEED BLOCKS
//       open a session, Acquire without allocate, attach, check every
//       matched page, Release.
//   mp_worker hold SOCKET SEED BLOCKS
//       like read, then print "ready", wait for a line on stdin (the test
//       kills the daemon meanwhile), check the pages again through the
//       mapping and make one more Acquire, which must fail UNAVAILABLE.
//
// Every mode prints one line "pages=P0,P1,.. matched=M new=N" (plus the
// extra lines above) on stdout. Exit codes: 0 ok; 2 usage; 3 RPC error;
// 4 attach error; 5 page contents differ; 6 the last Acquire in `hold` did
// not report UNAVAILABLE.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "client/attach.h"
#include "grpcpp/grpcpp.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace {

using radixkv::v1::KvCache;

constexpr uint32_t kPageSize = 4;  // tokens per block

void FillNamespace(radixkv::v1::Namespace* ns) {
  ns->set_model("mp-test-model");
  ns->set_num_layers(2);
  ns->set_num_kv_heads(2);
  ns->set_head_dim(16);
  ns->set_page_size(kPageSize);
  ns->set_dtype(radixkv::v1::DTYPE_FLOAT32);  // page_bytes = 2048
}

unsigned char PatternByte(uint64_t seed, uint64_t block, uint64_t i) {
  return static_cast<unsigned char>((seed * 131 + block * 29 + i * 7 + 3) &
                                    0xff);
}

int Fail(int code, const std::string& what) {
  std::fprintf(stderr, "mp_worker: %s\n", what.c_str());
  return code;
}

struct Session {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<radixkv::v1::SessionRequest,
                                           radixkv::v1::SessionResponse>>
      stream;
  radixkv::v1::SessionInfo info;
};

bool Open(KvCache::Stub* stub, Session* s) {
  s->stream = stub->Session(&s->ctx);
  radixkv::v1::SessionRequest req;
  FillNamespace(req.mutable_open()->mutable_namespace_());
  req.mutable_open()->set_client_name("mp_worker");
  if (!s->stream->Write(req)) return false;
  radixkv::v1::SessionResponse resp;
  if (!s->stream->Read(&resp) || !resp.has_session()) return false;
  s->info = resp.session();
  return true;
}

grpc::Status Acquire(KvCache::Stub* stub, const std::string& session,
                     uint64_t seed, uint32_t blocks, bool allocate,
                     radixkv::v1::AcquireResponse* resp) {
  radixkv::v1::AcquireRequest req;
  req.set_session_id(session);
  for (uint32_t t = 0; t < blocks * kPageSize; ++t) {
    req.add_tokens(static_cast<uint32_t>(seed * 100000 + t));
  }
  req.set_allocate(allocate);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return stub->Acquire(&ctx, req, resp);
}

void PrintPages(const radixkv::v1::AcquireResponse& r) {
  std::string pages;
  for (int i = 0; i < r.pages_size(); ++i) {
    if (i) pages += ",";
    pages += std::to_string(r.pages(i));
  }
  std::printf("pages=%s matched=%u new=%u\n", pages.c_str(), r.matched_blocks(),
              r.new_blocks());
  std::fflush(stdout);
}

// Checks the matched pages; returns the index of the first bad one or -1.
int CheckPages(const radixkv::gpu::MappedPool& pool,
               const radixkv::v1::AcquireResponse& r, uint64_t seed) {
  for (uint32_t b = 0; b < r.matched_blocks(); ++b) {
    const unsigned char* p =
        static_cast<const unsigned char*>(pool.page_address(r.pages(b)));
    if (p == nullptr) return static_cast<int>(b);
    for (uint64_t i = 0; i < pool.page_bytes(); ++i) {
      if (p[i] != PatternByte(seed, b, i)) return static_cast<int>(b);
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5)
    return Fail(2,
                "usage: mp_worker write|read|hold SOCKET SEED BLOCKS [hang]");
  std::string mode = argv[1];
  std::string socket = argv[2];
  uint64_t seed = std::strtoull(argv[3], nullptr, 10);
  uint32_t blocks = static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10));
  bool hang = argc > 5 && std::string(argv[5]) == "hang";

  auto channel =
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  std::unique_ptr<KvCache::Stub> stub = KvCache::NewStub(channel);
  Session session;
  if (!Open(stub.get(), &session)) return Fail(3, "session open failed");
  const std::string& sid = session.info.session_id();

  radixkv::v1::AcquireResponse acq;
  grpc::Status st =
      Acquire(stub.get(), sid, seed, blocks, mode == "write", &acq);
  if (!st.ok()) return Fail(3, "Acquire: " + st.error_message());
  PrintPages(acq);

  absl::StatusOr<std::unique_ptr<radixkv::gpu::MappedPool>> pool =
      radixkv::AttachPool(session.info.pool().attach_socket(), sid,
                          absl::Seconds(20));
  if (!pool.ok()) return Fail(4, pool.status().ToString());

  if (mode == "write") {
    for (uint32_t k = 0; k < acq.new_blocks(); ++k) {
      uint32_t block = acq.matched_blocks() + k;
      unsigned char* p =
          static_cast<unsigned char*>((*pool)->page_address(acq.pages(block)));
      if (p == nullptr) return Fail(4, "page out of range");
      uint64_t n = (*pool)->page_bytes();
      if (hang && k == 0) n /= 2;
      for (uint64_t i = 0; i < n; ++i) p[i] = PatternByte(seed, block, i);
      if (hang) {
        std::printf("writing\n");
        std::fflush(stdout);
        while (true) ::pause();  // the test SIGKILLs us here
      }
    }
    radixkv::v1::CommitRequest req;
    req.set_session_id(sid);
    req.set_lease_id(acq.lease_id());
    req.set_blocks(acq.new_blocks());
    req.set_release(true);
    radixkv::v1::CommitResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    st = stub->Commit(&ctx, req, &resp);
    if (!st.ok()) return Fail(3, "Commit: " + st.error_message());
    std::printf("inserted=%u\n", resp.inserted());
    return 0;
  }

  int bad = CheckPages(**pool, acq, seed);
  if (bad >= 0)
    return Fail(5, "page of block " + std::to_string(bad) + " differs");
  if (mode == "read") {
    if (acq.lease_id() != 0) {
      radixkv::v1::ReleaseRequest req;
      req.set_session_id(sid);
      req.set_lease_id(acq.lease_id());
      radixkv::v1::ReleaseResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(20));
      stub->Release(&ctx, req, &resp);
    }
    return 0;
  }
  if (mode != "hold") return Fail(2, "unknown mode " + mode);
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);  // the daemon is dead once this returns
  bad = CheckPages(**pool, acq, seed);
  if (bad >= 0)
    return Fail(5, "after daemon exit: block " + std::to_string(bad));
  radixkv::v1::AcquireResponse again;
  st = Acquire(stub.get(), sid, seed, blocks, false, &again);
  std::printf("after_daemon_exit code=%d\n", static_cast<int>(st.error_code()));
  std::fflush(stdout);
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ? 0 : 6;
}
