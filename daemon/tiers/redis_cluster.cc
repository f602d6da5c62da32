#include "daemon/tiers/redis_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace radixkv::daemon {
namespace {

constexpr int kMaxHops = 4;  // redirections followed per command

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis
// Cluster hashes keys.
uint16_t Crc16(absl::string_view s) {
  uint16_t crc = 0;
  for (unsigned char c : s) {
    crc ^= static_cast<uint16_t>(c) << 8;
    for (int i = 0; i < 8; ++i) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

int MillisLeft(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60 * 60 * 1000));
}

RedisReply Convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) {
        out.elements.push_back(Convert(r->element[i]));
      }
      break;
    default:
      out.type = RedisReply::Type::kNil;
      break;
  }
  return out;
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381".
bool ParseRedirect(absl::string_view msg, absl::string_view word,
                   uint16_t* slot, RedisEndpoint* to) {
  std::vector<absl::string_view> parts =
      absl::StrSplit(msg, ' ', absl::SkipEmpty());
  uint32_t s = 0;
  if (parts.size() != 3 || parts[0] != word || !absl::SimpleAtoi(parts[1], &s) ||
      s >= 16384) {
    return false;
  }
  absl::StatusOr<RedisEndpoint> e = ParseRedisEndpoint(parts[2]);
  if (!e.ok()) return false;
  *slot = static_cast<uint16_t>(s);
  *to = *std::move(e);
  return true;
}

std::string SslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "no detail";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

bool IsIpAddress(const std::string& host) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 ||
         inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

// Commands as RESP arrays of bulk strings, ready to send: small parts are
// gathered into buffers of its own, arguments of kByReference bytes or
// more (a block's value) are sent from where they are, so the caller's
// arguments must outlive the Wire.
class Wire {
 public:
  static constexpr size_t kByReference = 16 << 10;

  void Add(absl::Span<const absl::string_view> argv) {
    absl::StrAppend(&tail_, "*", argv.size(), "\r\n");
    for (absl::string_view a : argv) {
      absl::StrAppend(&tail_, "$", a.size(), "\r\n");
      if (a.size() >= kByReference) {
        Seal();
        pieces_.push_back(a);
      } else {
        tail_.append(a.data(), a.size());
      }
      tail_ += "\r\n";
    }
  }
  // Every byte to send, in order.
  const std::vector<absl::string_view>& pieces() {
    Seal();
    return pieces_;
  }

 private:
  void Seal() {
    if (tail_.empty()) return;
    owned_.push_back(std::move(tail_));
    tail_.clear();
    pieces_.push_back(owned_.back());
  }

  std::deque<std::string> owned_;  // stable addresses for pieces_
  std::vector<absl::string_view> pieces_;
  std::string tail_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<ssl_ctx_st>> MakeRedisTlsContext(
    const std::string& ca_file, const std::string& cert_file,
    const std::string& key_file) {
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  if (ctx == nullptr) {
    return absl::InternalError(absl::StrCat("SSL_CTX_new: ", SslError()));
  }
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (ca_file.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx.get()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tls: the system's CA certificates: ", SslError()));
    }
  } else if (SSL_CTX_load_verify_locations(ctx.get(), ca_file.c_str(),
                                           nullptr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls_ca=", ca_file, ": not a readable PEM certificate file (",
        SslError(), ")"));
  }
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert= and tls_key= go together (a client certificate and its key)");
  }
  if (!cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx.get(), cert_file.c_str()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tls_cert=", cert_file, ": not a readable PEM certificate (",
          SslError(), ")"));
    }
    if (SSL_CTX_use_PrivateKey_file(ctx.get(), key_file.c_str(),
                                    SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx.get()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tls_key=", key_file, ": not the PEM key of tls_cert= (",
          SslError(), ")"));
    }
  }
  return ctx;
}

std::string RedisEndpoint::ToString() const {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<RedisEndpoint> ParseRedisEndpoint(absl::string_view s) {
  RedisEndpoint e;
  absl::string_view port;
  const bool bracketed = absl::ConsumePrefix(&s, "[");
  if (bracketed) {
    const size_t close = s.find("]:");
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"[", s, "\": expected [ADDRESS]:PORT"));
    }
    e.host = std::string(s.substr(0, close));
    port = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == absl::string_view::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", s, "\": expected HOST:PORT"));
    }
    e.host = std::string(s.substr(0, colon));
    port = s.substr(colon + 1);
  }
  // A name or IPv4 address, or (bracketed) an IPv6 address.
  const bool v6 = bracketed && !e.host.empty() &&
                  e.host.find_first_not_of("0123456789abcdefABCDEF:.%") ==
                      std::string::npos &&
                  e.host.find(':') != std::string::npos;
  const bool name = !bracketed && !e.host.empty() &&
                    e.host.find_first_not_of(
                        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                        "0123456789.-_") == std::string::npos;
  if (!v6 && !name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", e.host, "\" is not a host name or address (IPv6 goes in [])"));
  }
  if (!absl::SimpleAtoi(port, &e.port) || e.port < 1 || e.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", port, "\": the port must be a number in 1..65535"));
  }
  return e;
}

uint16_t RedisKeySlot(absl::string_view key) {
  const size_t open = key.find('{');
  if (open != absl::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & 16383;
}

// One connection: a non-blocking socket and hiredis's reply reader.
class RedisCluster::Conn {
 public:
  explicit Conn(RedisEndpoint e) : endpoint_(std::move(e)) {}
  ~Conn() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) close(fd_);
    if (reader_ != nullptr) redisReaderFree(reader_);
  }

  absl::Status Open(const RedisAuth& auth, const RedisTls& tls,
                    absl::Time deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string port = absl::StrCat(endpoint_.port);
    const int gai = getaddrinfo(endpoint_.host.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) {
      return absl::UnavailableError(absl::StrCat(
          "cannot resolve ", endpoint_.ToString(), ": ", gai_strerror(gai)));
    }
    absl::Status last = absl::UnavailableError(
        absl::StrCat("cannot connect to ", endpoint_.ToString()));
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      int rc = connect(fd, a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
        rc = poll(&p, 1, MillisLeft(deadline));
        if (rc == 0) {
          close(fd);
          last = absl::DeadlineExceededError(absl::StrCat(
              "connecting to ", endpoint_.ToString(), ": no answer by the deadline"));
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc != 0) {
        last = absl::UnavailableError(absl::StrCat(
            "cannot connect to ", endpoint_.ToString(), ": ", strerror(errno)));
        close(fd);
        continue;
      }
      fd_ = fd;
      break;
    }
    freeaddrinfo(res);
    if (fd_ < 0) return last;
    if (tls.ctx != nullptr) {
      absl::Status st = Handshake(tls, deadline);
      if (!st.ok()) return st;
    }
    reader_ = redisReaderCreate();
    if (reader_ == nullptr) return absl::ResourceExhaustedError("redisReaderCreate");
    if (auth.password.empty()) return absl::OkStatus();
    std::vector<absl::string_view> argv = {"AUTH"};
    if (!auth.user.empty()) argv.push_back(auth.user);
    argv.push_back(auth.password);
    Wire wire;
    wire.Add(argv);
    absl::Status s = Send(wire, deadline);
    RedisReply r;
    if (s.ok()) s = Receive(&r, deadline);
    if (!s.ok()) return s;
    if (r.type == RedisReply::Type::kError) {
      return absl::PermissionDeniedError(absl::StrCat(
          endpoint_.ToString(), " refused AUTH",
          auth.user.empty() ? "" : absl::StrCat(" of user \"", auth.user, "\""),
          ": ", r.str));
    }
    return absl::OkStatus();
  }

  absl::Status Handshake(const RedisTls& tls, absl::Time deadline) {
    ssl_ = SSL_new(tls.ctx.get());
    if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) {
      return absl::InternalError(absl::StrCat("SSL_new: ", SslError()));
    }
    const std::string& name =
        tls.server_name.empty() ? endpoint_.host : tls.server_name;
    if (IsIpAddress(name)) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), name.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl_, name.c_str());
      SSL_set1_host(ssl_, name.c_str());
    }
    for (;;) {
      const int rc = SSL_connect(ssl_);
      if (rc == 1) return absl::OkStatus();
      const int err = SSL_get_error(ssl_, rc);
      if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
        const long verify = SSL_get_verify_result(ssl_);
        return absl::UnavailableError(absl::StrCat(
            "TLS with ", endpoint_.ToString(), " failed: ",
            verify != X509_V_OK ? X509_verify_cert_error_string(verify)
                                : SslError().c_str()));
      }
      pollfd p{.fd = fd_,
               .events = static_cast<short>(err == SSL_ERROR_WANT_READ ? POLLIN
                                                                     : POLLOUT),
               .revents = 0};
      if (poll(&p, 1, MillisLeft(deadline)) == 0) {
        return absl::DeadlineExceededError(absl::StrCat(
            "TLS with ", endpoint_.ToString(), ": no handshake by the deadline"));
      }
    }
  }

  // One read or write: bytes moved (> 0), 0 at end of stream, or -1 with
  // *wait set to POLLIN / POLLOUT to wait for, or 0 for an error (errno).
  ssize_t Io(bool write, void* buf, size_t n, short* wait) {
    *wait = 0;
    if (ssl_ == nullptr) {
      const ssize_t r = write ? send(fd_, buf, n, MSG_NOSIGNAL) : recv(fd_, buf, n, 0);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        *wait = write ? POLLOUT : POLLIN;
      } else if (r < 0 && errno == EINTR) {
        *wait = write ? POLLOUT : POLLIN;
      }
      return r;
    }
    const int len = static_cast<int>(std::min<size_t>(n, 1 << 30));
    const int r = write ? SSL_write(ssl_, buf, len) : SSL_read(ssl_, buf, len);
    if (r > 0) return r;
    switch (SSL_get_error(ssl_, r)) {
      case SSL_ERROR_WANT_READ:
        *wait = POLLIN;
        return -1;
      case SSL_ERROR_WANT_WRITE:
        *wait = POLLOUT;
        return -1;
      case SSL_ERROR_ZERO_RETURN:
        return 0;
      default:
        errno = EPROTO;
        return -1;
    }
  }

  absl::Status Send(Wire& wire, absl::Time deadline) {
    for (absl::string_view piece : wire.pieces()) {
      absl::Status s = Send(piece, deadline);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Send(absl::string_view bytes, absl::Time deadline) {
    while (!bytes.empty()) {
      short wait = 0;
      const ssize_t n = Io(true, const_cast<char*>(bytes.data()), bytes.size(), &wait);
      if (n > 0) {
        bytes.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && wait != 0) {
        pollfd p{.fd = fd_, .events = wait, .revents = 0};
        const int rc = poll(&p, 1, MillisLeft(deadline));
        if (rc == 0) {
          return absl::DeadlineExceededError(absl::StrCat(
              "writing to ", endpoint_.ToString(), ": not done by the deadline"));
        }
        continue;
      }
      return absl::UnavailableError(absl::StrCat(
          "writing to ", endpoint_.ToString(), ": ", strerror(errno)));
    }
    return absl::OkStatus();
  }

  absl::Status Receive(RedisReply* out, absl::Time deadline) {
    char buf[64 * 1024];
    for (;;) {
      void* reply = nullptr;
      if (redisReaderGetReply(reader_, &reply) != REDIS_OK) {
        return absl::DataLossError(absl::StrCat(
            "a malformed reply from ", endpoint_.ToString(), ": ", reader_->errstr));
      }
      if (reply != nullptr) {
        *out = Convert(static_cast<redisReply*>(reply));
        freeReplyObject(reply);
        return absl::OkStatus();
      }
      short wait = 0;
      const ssize_t n = Io(false, buf, sizeof(buf), &wait);
      if (n > 0) {
        if (redisReaderFeed(reader_, buf, static_cast<size_t>(n)) != REDIS_OK) {
          return absl::DataLossError(absl::StrCat(
              "a malformed reply from ", endpoint_.ToString()));
        }
        continue;
      }
      if (n == 0) {
        return absl::UnavailableError(
            absl::StrCat(endpoint_.ToString(), " closed the connection"));
      }
      if (wait != 0) {
        pollfd p{.fd = fd_, .events = wait, .revents = 0};
        if (poll(&p, 1, MillisLeft(deadline)) == 0) {
          return absl::DeadlineExceededError(absl::StrCat(
              "no reply from ", endpoint_.ToString(), " by the deadline"));
        }
        continue;
      }
      return absl::UnavailableError(absl::StrCat(
          "reading from ", endpoint_.ToString(), ": ", strerror(errno)));
    }
  }

 private:
  const RedisEndpoint endpoint_;
  int fd_ = -1;
  SSL* ssl_ = nullptr;
  redisReader* reader_ = nullptr;
};

RedisCluster::RedisCluster(Options options) : options_(std::move(options)) {
  slot_node_.fill(-1);
  for (const RedisEndpoint& e : options_.seeds) NodeIndex(e);
}

RedisCluster::~RedisCluster() = default;

int RedisCluster::NodeIndex(const RedisEndpoint& e) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].endpoint == e) return static_cast<int>(i);
  }
  nodes_.push_back({e, nullptr});
  return static_cast<int>(nodes_.size() - 1);
}

absl::Status RedisCluster::EnsureConnected(Node& node, absl::Time deadline) {
  if (node.conn != nullptr) return absl::OkStatus();
  auto conn = std::make_unique<Conn>(node.endpoint);
  absl::Status s = conn->Open(options_.auth, options_.tls, deadline);
  if (!s.ok()) return s;
  node.conn = std::move(conn);
  return absl::OkStatus();
}

absl::Status RedisCluster::LoadSlotsFrom(Node& node, absl::Time deadline) {
  absl::Status s = EnsureConnected(node, deadline);
  if (!s.ok()) return s;
  const RedisEndpoint from = node.endpoint;  // nodes_ may grow below
  RedisReply r;
  Wire wire;
  wire.Add({"CLUSTER", "SLOTS"});
  s = node.conn->Send(wire, deadline);
  if (s.ok()) s = node.conn->Receive(&r, deadline);
  if (!s.ok()) {
    node.conn.reset();
    return s;
  }
  if (r.type == RedisReply::Type::kError) {
    if (r.str.find("cluster support disabled") != std::string::npos) {
      cluster_mode_ = false;
      slot_node_.fill(static_cast<int16_t>(NodeIndex(from)));
      slots_loaded_ = true;
      return absl::OkStatus();
    }
    return absl::UnavailableError(
        absl::StrCat("CLUSTER SLOTS on ", from.ToString(), ": ", r.str));
  }
  if (r.type != RedisReply::Type::kArray) {
    return absl::DataLossError(absl::StrCat(
        "CLUSTER SLOTS on ", from.ToString(), ": not an array"));
  }
  std::array<int16_t, 16384> map;
  map.fill(-1);
  for (const RedisReply& range : r.elements) {
    if (range.type != RedisReply::Type::kArray || range.elements.size() < 3 ||
        range.elements[0].type != RedisReply::Type::kInteger ||
        range.elements[1].type != RedisReply::Type::kInteger ||
        range.elements[2].type != RedisReply::Type::kArray ||
        range.elements[2].elements.size() < 2) {
      continue;
    }
    const RedisReply& master = range.elements[2];
    RedisEndpoint e;
    e.host = master.elements[0].str;
    if (e.host.empty() || e.host == "?") e.host = from.host;  // "this node"
    e.port = static_cast<int>(master.elements[1].integer);
    const int idx = NodeIndex(e);
    const int64_t lo = std::max<int64_t>(0, range.elements[0].integer);
    const int64_t hi = std::min<int64_t>(16383, range.elements[1].integer);
    for (int64_t slot = lo; slot <= hi; ++slot) {
      map[static_cast<size_t>(slot)] = static_cast<int16_t>(idx);
    }
  }
  slot_node_ = map;
  cluster_mode_ = true;
  slots_loaded_ = true;
  return absl::OkStatus();
}

absl::Status RedisCluster::RefreshSlots(absl::Time deadline) {
  absl::Status last = absl::UnavailableError("no store node is configured");
  // Seeds first, then every node learnt since.
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (absl::Now() >= deadline) break;
    absl::Status s = LoadSlotsFrom(nodes_[i], deadline);
    if (s.ok()) return s;
    if (s.code() == absl::StatusCode::kPermissionDenied) return s;
    last = s;
  }
  return last;
}

absl::Status RedisCluster::Connect(absl::Time deadline) {
  return RefreshSlots(deadline);
}

absl::Status RedisCluster::SendToNode(int node,
                                      absl::Span<const Command> commands,
                                      const std::vector<size_t>& idx,
                                      const std::vector<bool>& asking,
                                      absl::Time deadline) {
  Node& n = nodes_[static_cast<size_t>(node)];
  absl::Status s = EnsureConnected(n, deadline);
  if (!s.ok()) return s;
  Wire wire;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (asking[i]) wire.Add({"ASKING"});
    wire.Add(commands[idx[i]].argv);
  }
  return n.conn->Send(wire, deadline);
}

void RedisCluster::ReceiveFromNode(int node, absl::Status s,
                                   const std::vector<size_t>& idx,
                                   const std::vector<bool>& asking,
                                   absl::Time deadline,
                                   std::vector<Result>* out) {
  Node& n = nodes_[static_cast<size_t>(node)];
  size_t i = 0;
  for (; s.ok() && i < idx.size(); ++i) {
    Result& r = (*out)[idx[i]];
    if (asking[i]) {
      RedisReply ok;
      s = n.conn->Receive(&ok, deadline);
      if (!s.ok()) break;
    }
    s = n.conn->Receive(&r.reply, deadline);
    if (!s.ok()) break;
    r.status = absl::OkStatus();
  }
  if (!s.ok()) {
    // The connection's state is unknown: replies may still be on the way.
    n.conn.reset();
    for (; i < idx.size(); ++i) (*out)[idx[i]].status = s;
  }
}

void RedisCluster::Run(absl::Span<const Command> commands, absl::Time deadline,
                       std::vector<Result>* out) {
  out->assign(commands.size(), Result{});
  if (!slots_loaded_) {
    absl::Status s = RefreshSlots(deadline);
    if (!s.ok()) {
      for (Result& r : *out) r.status = s;
      return;
    }
  }
  // Each command's target: the slot map's node, or an ASK's.
  std::vector<int> target(commands.size(), -1);
  std::vector<bool> ask(commands.size(), false);
  std::vector<size_t> pending(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) pending[i] = i;
  bool moved = false;
  for (int hop = 0; hop <= kMaxHops && !pending.empty(); ++hop) {
    std::vector<std::vector<size_t>> by_node(nodes_.size());
    std::vector<std::vector<bool>> asking(nodes_.size());
    for (size_t i : pending) {
      int node = target[i];
      if (node < 0) node = slot_node_[RedisKeySlot(commands[i].key)];
      if (node < 0) {
        (*out)[i].status = absl::UnavailableError(absl::StrCat(
            "no store node serves slot ", RedisKeySlot(commands[i].key),
            " (the cluster's slots are not all assigned)"));
        continue;
      }
      by_node[static_cast<size_t>(node)].push_back(i);
      asking[static_cast<size_t>(node)].push_back(ask[i]);
    }
    std::vector<absl::Status> sent(by_node.size());
    for (size_t node = 0; node < by_node.size(); ++node) {
      if (by_node[node].empty()) continue;
      sent[node] = SendToNode(static_cast<int>(node), commands, by_node[node],
                              asking[node], deadline);
    }
    for (size_t node = 0; node < by_node.size(); ++node) {
      if (by_node[node].empty()) continue;
      ReceiveFromNode(static_cast<int>(node), sent[node], by_node[node],
                      asking[node], deadline, out);
    }
    std::vector<size_t> again;
    for (size_t i : pending) {
      Result& r = (*out)[i];
      if (!r.status.ok() || r.reply.type != RedisReply::Type::kError) continue;
      uint16_t slot = 0;
      RedisEndpoint to;
      if (ParseRedirect(r.reply.str, "MOVED", &slot, &to)) {
        slot_node_[slot] = static_cast<int16_t>(NodeIndex(to));
        target[i] = -1;
        ask[i] = false;
        moved = true;
        again.push_back(i);
      } else if (ParseRedirect(r.reply.str, "ASK", &slot, &to)) {
        target[i] = NodeIndex(to);
        ask[i] = true;
        again.push_back(i);
      } else if (absl::StartsWith(r.reply.str, "TRYAGAIN")) {
        again.push_back(i);
      }
    }
    pending = std::move(again);
  }
  // A MOVED means the slots changed hands: learn the whole new map for
  // the next call (this one has followed its redirections already).
  if (moved) RefreshSlots(deadline).IgnoreError();
}

}  // namespace radixkv::daemon
