// File: tests/daemon/test_util.h
//
// Helpers shared by the daemon tests: short /tmp socket paths, a test
// namespace, token generators, a blocking Session-stream client, and a
// polling wait with a generous deadline (the machine is a loaded 2-core box).
#ifndef RADIXKV_TESTS_DAEMON_TEST_UTIL_H_
#define RADIXKV_TESTS_DAEMON_TEST_UTIL_H_

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "radixkv/v1/radixkv.grpc.pb.h"

namespace radixkv::testing {

namespace v1 = ::radixkv::v1;

// "/tmp/rkd_<tag>_<pid>_<n>.sock": short enough for sun_path.
inline std::string TempSocketPath(const char* tag) {
  static std::atomic<int> counter{0};
  return absl::StrCat("/tmp/rkd_", tag, "_", getpid(), "_", counter++, ".sock");
}

// 1 layer x 2 x 1 head x page_size x 8 dims x fp16: 32 * page_size bytes.
inline v1::Namespace TestNamespace(uint32_t page_size = 4,
                                   const std::string& model = "test-model") {
  v1::Namespace ns;
  ns.set_model(model);
  ns.set_num_layers(1);
  ns.set_num_kv_heads(1);
  ns.set_head_dim(8);
  ns.set_page_size(page_size);
  ns.set_dtype(v1::DTYPE_FLOAT16);
  ns.set_tp_size(1);
  return ns;
}

// n tokens, distinct per seed.
inline std::vector<uint32_t> Tokens(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = seed * 100000u + static_cast<uint32_t>(i);
  return t;
}

template <typename Req>
void SetTokens(Req* req, const std::vector<uint32_t>& tokens) {
  req->mutable_tokens()->Assign(tokens.begin(), tokens.end());
}

// The tokens_le wire form of `tokens`: 4 little-endian bytes per id, written
// byte by byte so the test does not depend on the host's order.
inline std::string TokensLe(const std::vector<uint32_t>& tokens) {
  std::string b;
  b.reserve(tokens.size() * 4);
  for (uint32_t t : tokens) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>(t >> (8 * i)));
  }
  return b;
}

template <typename Req>
void SetTokensLe(Req* req, const std::vector<uint32_t>& tokens) {
  const std::string b = TokensLe(tokens);
  req->set_tokens_le(b.data(), b.size());
}

inline std::chrono::system_clock::time_point Deadline(int seconds = 30) {
  return std::chrono::system_clock::now() + std::chrono::seconds(seconds);
}

// Polls `pred` until it holds or `seconds` pass; returns its last value.
inline bool WaitFor(const std::function<bool()>& pred, int seconds = 30) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

// A Session stream kept open for the life of the object.
class SessionStream {
 public:
  SessionStream(v1::KvCache::Stub* stub, const v1::Namespace& ns,
                const std::string& client_name = "test") {
    ctx_.set_deadline(Deadline(300));
    stream_ = stub->Session(&ctx_);
    v1::SessionRequest req;
    *req.mutable_open()->mutable_namespace_() = ns;
    req.mutable_open()->set_client_name(client_name);
    v1::SessionResponse resp;
    if (stream_->Write(req) && stream_->Read(&resp) && resp.has_session()) {
      info_ = resp.session();
      ok_ = true;
    } else {
      stream_->WritesDone();
      status_ = stream_->Finish();
      finished_ = true;
    }
  }
  ~SessionStream() { Close(); }

  bool ok() const { return ok_; }
  const v1::SessionInfo& info() const { return info_; }
  const std::string& id() const { return info_.session_id(); }
  const grpc::Status& status() const { return status_; }

  // Sends a heartbeat and waits for its ack; false on any failure.
  bool Heartbeat(uint64_t nonce) {
    v1::SessionRequest req;
    req.mutable_heartbeat()->set_nonce(nonce);
    v1::SessionResponse resp;
    return stream_->Write(req) && stream_->Read(&resp) && resp.has_heartbeat() &&
           resp.heartbeat().nonce() == nonce;
  }

  grpc::Status Close() {
    if (!finished_) {
      stream_->WritesDone();
      v1::SessionResponse drain;
      while (stream_->Read(&drain)) {
      }
      status_ = stream_->Finish();
      finished_ = true;
    }
    return status_;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>>
      stream_;
  v1::SessionInfo info_;
  grpc::Status status_;
  bool ok_ = false;
  bool finished_ = false;
};

}  // namespace radixkv::testing

#endif  // RADIXKV_TESTS_DAEMON_TEST_UTIL_H_
