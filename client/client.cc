#include "client/client.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/core.h"
#include "client/status.h"
#include "grpcpp/client_context.h"
#include "base/status_macros.h"
#include "radixkv/defaults.h"

#include "gpu/mapped_pool.h"

namespace radixkv {
namespace {

using SteadyClock = std::chrono::steady_clock;

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

SteadyClock::duration ToSteady(absl::Duration d) {
  return std::chrono::duration_cast<SteadyClock::duration>(
      absl::ToChronoNanoseconds(d));
}

// Until when a lease acquired by a call sent at `sent` may hand out page
// access: its expiry (the earlier of the daemon's deadline, read against
// this host's clock, and `sent` + the session's lease TTL) less the safety
// margin min(1 s, TTL / 10). time_point::max() when the daemon names
// neither.
SteadyClock::time_point UsableUntil(SteadyClock::time_point sent,
                                    absl::Duration ttl,
                                    uint64_t expires_unix_ms) {
  const SteadyClock::time_point now = SteadyClock::now();
  SteadyClock::time_point deadline = SteadyClock::time_point::max();
  if (expires_unix_ms > 0) {
    deadline = now + ToSteady(absl::FromUnixMillis(
                                  static_cast<int64_t>(expires_unix_ms)) -
                              absl::Now());
  }
  if (ttl > absl::ZeroDuration()) {
    deadline = std::min(deadline, sent + ToSteady(ttl));
  }
  if (deadline == SteadyClock::time_point::max()) return deadline;
  const absl::Duration span =
      ttl > absl::ZeroDuration() ? ttl : absl::FromChrono(deadline - sent);
  const absl::Duration margin = std::min(absl::Seconds(1), span / 10);
  return deadline - ToSteady(std::max(margin, absl::ZeroDuration()));
}

// Errors that mean the request itself is wrong: the worker must hear about
// them. Everything else (unreachable, late, daemon trouble) degrades.
bool IsCallerError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument ||
         s.code() == absl::StatusCode::kFailedPrecondition ||
         s.code() == absl::StatusCode::kOutOfRange;
}

// Puts `tokens` into a request (AcquireRequest or MatchRequest): as
// little-endian u32 bytes in tokens_le, or as repeated uint32 tokens.
template <typename Request>
void SetPromptTokens(absl::Span<const uint32_t> tokens, bool legacy,
                     Request* req) {
  if (legacy) {
    req->mutable_tokens()->Add(tokens.begin(), tokens.end());
    return;
  }
  std::string* le = req->mutable_tokens_le();
  if constexpr (std::endian::native == std::endian::little) {
    // One copy; resize-then-copy would first zero the whole prompt.
    if (!tokens.empty()) {
      le->assign(reinterpret_cast<const char*>(tokens.data()),
                 tokens.size() * sizeof(uint32_t));
    }
  } else {
    le->resize(tokens.size() * sizeof(uint32_t));
    for (size_t i = 0; i < tokens.size(); ++i) {
      const uint32_t v = __builtin_bswap32(tokens[i]);
      std::memcpy(le->data() + i * sizeof(v), &v, sizeof(v));
    }
  }
}

// Puts `keys` into a request: concatenated canonical forms in
// block_keys_packed, or one repeated block_keys entry each.
template <typename Request>
void SetPromptKeys(absl::Span<const BlockKey> keys, bool legacy, Request* req) {
  if (legacy) {
    for (const BlockKey& k : keys) req->add_block_keys(k.ToCanonical());
    return;
  }
  std::string* packed = req->mutable_block_keys_packed();
  packed->resize(keys.size() * BlockKey::kBytes);
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i].ToCanonical(packed->data() + i * BlockKey::kBytes);
  }
}

}  // namespace

absl::StatusOr<std::string> GrpcTargetForEndpoint(absl::string_view endpoint) {
  if (endpoint.empty()) return UnixTarget(DefaultSocketPath());
  if (endpoint[0] == '/' || absl::StartsWith(endpoint, "./") ||
      absl::StartsWith(endpoint, "../")) {
    return UnixTarget(std::string(endpoint));
  }
  if (absl::StartsWith(endpoint, "unix:")) {
    if (endpoint.size() == 5) {
      return absl::InvalidArgumentError(
          "endpoint: \"unix:\" needs a socket path, e.g. unix:/tmp/r.sock");
    }
    return std::string(endpoint);
  }
  // Other gRPC URI schemes (dns:, ipv4:, ipv6:, unix-abstract:) pass through.
  for (absl::string_view scheme :
       {"dns:", "ipv4:", "ipv6:", "unix-abstract:", "vsock:"}) {
    if (absl::StartsWith(endpoint, scheme)) return std::string(endpoint);
  }
  // host:port, [v6]:port
  const size_t colon = endpoint.rfind(':');
  uint32_t port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port == 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "endpoint: \"", endpoint,
        "\" is not a socket path (/path, unix:/path) or host:port with a port "
        "in 1..65535"));
  }
  return std::string(endpoint);
}

absl::Status ValidateNamespaceSpec(const NamespaceSpec& spec) {
  auto positive = [](const char* field, uint32_t v) {
    return v == 0 ? absl::InvalidArgumentError(absl::StrCat(
                        "namespace.", field, " must be at least 1, got 0"))
                  : absl::OkStatus();
  };
  RETURN_IF_ERROR(positive("num_layers", spec.num_layers));
  RETURN_IF_ERROR(positive("num_kv_heads", spec.num_kv_heads));
  RETURN_IF_ERROR(positive("head_dim", spec.head_dim));
  RETURN_IF_ERROR(positive("page_size", spec.page_size));
  if (DTypeBytes(spec.dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace.dtype: unknown or unspecified dtype value ",
                     static_cast<uint32_t>(spec.dtype)));
  }
  const uint32_t tp_size = spec.tp_size == 0 ? 1 : spec.tp_size;
  if (spec.tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace.tp_rank (", spec.tp_rank,
                     ") must be below namespace.tp_size (", tp_size, ")"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Lease
// ---------------------------------------------------------------------------

Lease::Lease(Lease&& other) noexcept { *this = std::move(other); }

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this == &other) return *this;
  ReleaseBestEffort();
  writing_ = std::exchange(other.writing_, false);
  core_ = std::move(other.core_);
  pool_ = std::move(other.pool_);
  life_ = std::move(other.life_);
  usable_until_ = other.usable_until_;
  session_id_ = std::move(other.session_id_);
  session_generation_ = other.session_generation_;
  lease_id_ = std::exchange(other.lease_id_, 0);
  degraded_ = other.degraded_;
  total_blocks_ = other.total_blocks_;
  matched_blocks_ = other.matched_blocks_;
  matched_tokens_ = other.matched_tokens_;
  promoted_blocks_ = other.promoted_blocks_;
  new_blocks_ = other.new_blocks_;
  committed_blocks_ = other.committed_blocks_;
  pages_ = std::move(other.pages_);
  return *this;
}

Lease::~Lease() { ReleaseBestEffort(); }

void Lease::EndWrites() const {
  if (!writing_) return;
  writing_ = false;
  life_->writers.fetch_sub(1);
}

void Lease::ReleaseBestEffort() {
  EndWrites();
  if (lease_id_ == 0) return;
  const bool current = core_->IsCurrent(session_generation_);
  if (!current && !core_->Stopped()) {
    // A lost session: the next open acknowledges all of its leases.
    lease_id_ = 0;
    return;
  }
  if (current && core_->options().release_delay > absl::ZeroDuration()) {
    core_->DeferRelease(session_generation_, std::exchange(lease_id_, 0));
    return;
  }
  // Errors are deliberately ignored: the daemon also ends the lease with the
  // session or at its TTL.
  absl::Status ignored = Release();
  (void)ignored;
  lease_id_ = 0;
}

void* Lease::page_address(size_t i) const {
  if (pool_ == nullptr || i >= pages_.size() || !live()) return nullptr;
  if (i >= matched_blocks_ && !writing_) {
    // Count this lease as a writer, then look at the session's end again
    // (SessionLife: the end's acknowledgement waits for writers).
    life_->writers.fetch_add(1);
    if (life_->ended.load()) {
      life_->writers.fetch_sub(1);
      return nullptr;
    }
    writing_ = true;
  }
  return pool_->page_address(pages_[i]);
}

bool Lease::live() const {
  return lease_id_ != 0 && life_ != nullptr &&
         !life_->ended.load(std::memory_order_acquire) &&
         SteadyClock::now() < usable_until_;
}

absl::Duration Lease::time_left() const {
  if (!live()) return absl::ZeroDuration();
  if (usable_until_ == SteadyClock::time_point::max()) {
    return absl::InfiniteDuration();
  }
  return absl::FromChrono(usable_until_ - SteadyClock::now());
}

absl::Status Lease::ConfirmRead() const {
  if (degraded_) {
    return absl::FailedPreconditionError(
        "Lease::ConfirmRead: degraded lease holds no pages");
  }
  if (lease_id_ == 0) {
    return absl::FailedPreconditionError(
        "Lease::ConfirmRead: the lease has ended; what was read is not "
        "pinned");
  }
  if (life_ == nullptr || life_->ended.load(std::memory_order_acquire)) {
    return absl::UnavailableError(
        "Lease::ConfirmRead: the session of this lease ended; discard what "
        "was read");
  }
  if (SteadyClock::now() >= usable_until_) {
    return absl::DeadlineExceededError(
        "Lease::ConfirmRead: the lease expired (less its safety margin) "
        "before the read finished; discard what was read");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CommitResponse> Lease::Commit(uint32_t blocks,
                                                 bool release) {
  EndWrites();  // the writes of the blocks to commit have finished
  if (lease_id_ == 0) {
    return absl::FailedPreconditionError(
        degraded_ ? "Lease::Commit: degraded lease holds no pages"
                  : "Lease::Commit: lease is not held");
  }
  if (blocks > uncommitted_blocks()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Lease::Commit: blocks (", blocks, ") exceeds the lease's ",
        uncommitted_blocks(), " uncommitted new pages"));
  }
  if (!core_->IsCurrent(session_generation_)) {
    // The daemon ended it with the session (its pages were fenced if the
    // daemon still runs): say they will not be written, cache nothing.
    Release().IgnoreError();
    return absl::UnavailableError(
        "Lease::Commit: the session of this lease ended (daemon restart); "
        "the pages were not cached");
  }
  v1::CommitRequest req;
  req.set_session_id(session_id_);
  req.set_lease_id(lease_id_);
  req.set_blocks(blocks);
  req.set_release(release);
  v1::CommitResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, core_->options().call_timeout);
  absl::Status s = FromGrpcStatus(core_->stub()->Commit(&ctx, req, &resp));
  if (!s.ok()) {
    if (s.code() == absl::StatusCode::kNotFound) {
      core_->UntrackLease(session_generation_, std::exchange(lease_id_, 0));
    }
    return s;
  }
  committed_blocks_ += blocks;
  if (release || resp.released()) {
    core_->UntrackLease(session_generation_, std::exchange(lease_id_, 0));
  }
  return resp;
}

absl::Status Lease::Release() {
  EndWrites();
  if (lease_id_ == 0) return absl::OkStatus();
  const uint64_t id = std::exchange(lease_id_, 0);
  core_->UntrackLease(session_generation_, id);
  // Sent even when the session has ended: for a daemon that fenced the
  // lease's pages with the session, it says they will not be written again.
  const bool current = core_->IsCurrent(session_generation_);
  v1::ReleaseRequest req;
  req.set_session_id(session_id_);
  req.set_lease_id(id);
  v1::ReleaseResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, core_->options().release_timeout);
  absl::Status s = FromGrpcStatus(core_->stub()->Release(&ctx, req, &resp));
  // NOT_FOUND: already gone (TTL, session end): the goal is reached. A
  // lease of an ended session is gone whatever the answer.
  if (s.code() == absl::StatusCode::kNotFound || !current) {
    return absl::OkStatus();
  }
  return s;
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    const ClientOptions& options) {
  ASSIGN_OR_RETURN(std::string target,
                   GrpcTargetForEndpoint(options.endpoint));
  RETURN_IF_ERROR(ValidateNamespaceSpec(options.ns));
  if (options.call_timeout <= absl::ZeroDuration() ||
      options.connect_timeout <= absl::ZeroDuration() ||
      options.heartbeat_interval <= absl::ZeroDuration() ||
      options.release_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "call_timeout, connect_timeout, heartbeat_interval and "
        "release_timeout must be positive");
  }
  if (options.release_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "release_delay must not be negative, got ",
        absl::FormatDuration(options.release_delay)));
  }
  if (options.reconnect_initial_backoff <= absl::ZeroDuration() ||
      options.reconnect_max_backoff < options.reconnect_initial_backoff) {
    return absl::InvalidArgumentError(
        "reconnect_initial_backoff must be positive and at most "
        "reconnect_max_backoff");
  }
  auto core = std::make_shared<client_internal::Core>(options, target);
  core->Start();
  std::unique_ptr<Client> client(
      new Client(options, NamespaceRoot(options.ns), std::move(core)));
  if (options.initial_wait > absl::ZeroDuration()) {
    // Not being connected yet is not an error: the client degrades.
    absl::Status ignored = client->WaitForSession(options.initial_wait);
    (void)ignored;
  }
  return client;
}

Client::Client(const ClientOptions& options, BlockKey root,
               std::shared_ptr<client_internal::Core> core)
    : options_(options), root_(root), core_(std::move(core)) {}

Client::~Client() { core_->Stop(); }

absl::StatusOr<Lease> Client::Acquire(absl::Span<const uint32_t> tokens,
                                      const AcquireOptions& options) {
  if (tokens.empty()) {
    return absl::InvalidArgumentError("tokens: must hold at least 1 token");
  }
  v1::AcquireRequest req;
  SetPromptTokens(tokens, options_.legacy_prompt_fields, &req);
  req.set_allocate(options.allocate);
  req.set_max_new_blocks(options.max_new_blocks);
  return AcquireImpl(std::move(req), tokens.size() / options_.ns.page_size);
}

absl::StatusOr<Lease> Client::AcquireKeys(absl::Span<const BlockKey> keys,
                                          const AcquireOptions& options) {
  if (keys.empty()) {
    return absl::InvalidArgumentError("block_keys: must hold at least 1 key");
  }
  v1::AcquireRequest req;
  SetPromptKeys(keys, options_.legacy_prompt_fields, &req);
  req.set_allocate(options.allocate);
  req.set_max_new_blocks(options.max_new_blocks);
  return AcquireImpl(std::move(req), keys.size());
}

absl::StatusOr<Lease> Client::AcquireImpl(v1::AcquireRequest req,
                                          uint32_t total_blocks) {
  req.set_pages_le(!options_.legacy_prompt_fields);
  Lease lease;
  lease.core_ = core_;
  lease.total_blocks_ = total_blocks;
  client_internal::SessionSnapshot session = core_->Current();
  if (!session.usable) {
    lease.degraded_ = true;
    return lease;
  }
  req.set_session_id(session.session_id);
  // Leases dropped since the last call end with this one.
  const std::vector<uint64_t> carried =
      core_->TakeDeferred(session.generation, kMaxReleaseLeasesPerAcquire);
  req.mutable_release_leases()->Add(carried.begin(), carried.end());
  v1::AcquireResponse resp;
  SteadyClock::time_point sent;
  auto call = [&] {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, options_.call_timeout);
    sent = SteadyClock::now();
    return FromGrpcStatus(core_->stub()->Acquire(&ctx, req, &resp));
  };
  absl::Status s = call();
  if (!s.ok() && !carried.empty()) {
    // The daemon released none of them (all or nothing). When one of them
    // is the reason (it expired meanwhile), release them one by one and try
    // the Acquire on its own.
    const bool their_fault =
        ErrorReasonOf(s) == v1::ERROR_REASON_LEASE_NOT_FOUND &&
        ErrorFieldOf(s) == "release_leases";
    core_->RequeueDeferred(session.generation, carried,
                           /*release_now=*/their_fault);
    if (their_fault) {
      req.clear_release_leases();
      s = call();
    }
  }
  if (!s.ok()) {
    if (IsCallerError(s)) return s;
    if (ErrorReasonOf(s) == v1::ERROR_REASON_SESSION_NOT_FOUND) {
      core_->ReportSessionLost(session.generation);
    }
    lease.degraded_ = true;
    return lease;
  }
  return LeaseFromResponse(resp, std::move(session), sent, std::move(lease));
}

absl::StatusOr<Lease> Client::LeaseFromResponse(
    const v1::AcquireResponse& resp, client_internal::SessionSnapshot session,
    std::chrono::steady_clock::time_point sent, Lease lease) {
  const uint32_t total_blocks = lease.total_blocks_;
  lease.session_id_ = std::move(session.session_id);
  lease.session_generation_ = session.generation;
  lease.pool_ = std::move(session.pool);
  lease.life_ = std::move(session.life);
  lease.usable_until_ =
      UsableUntil(sent, session.lease_ttl, resp.lease_expires_unix_ms());
  lease.lease_id_ = resp.lease_id();
  if (lease.lease_id_ != 0) {
    core_->TrackLease(lease.session_generation_, lease.lease_id_);
  }
  lease.total_blocks_ = resp.total_blocks();
  lease.matched_blocks_ = resp.matched_blocks();
  lease.matched_tokens_ = resp.matched_tokens();
  lease.promoted_blocks_ = resp.promoted_blocks();
  lease.new_blocks_ = resp.new_blocks();
  if (!resp.pages_le().empty()) {
    const std::string& le = resp.pages_le();
    if (le.size() % sizeof(uint32_t) != 0) {
      lease.Release().IgnoreError();
      return absl::InternalError(absl::StrCat(
          "Acquire: daemon returned ", le.size(),
          " bytes of pages_le, not a multiple of 4"));
    }
    lease.pages_.resize(le.size() / sizeof(uint32_t));
    for (size_t i = 0; i < lease.pages_.size(); ++i) {
      uint32_t v;
      std::memcpy(&v, le.data() + i * sizeof(v), sizeof(v));
      if constexpr (std::endian::native == std::endian::big) {
        v = __builtin_bswap32(v);
      }
      lease.pages_[i] = v;
    }
  } else {
    lease.pages_.assign(resp.pages().begin(), resp.pages().end());
  }
  if (lease.pages_.size() !=
      static_cast<size_t>(lease.matched_blocks_) + lease.new_blocks_) {
    // A daemon bug; do not hand out pages we cannot account for.
    lease.Release().IgnoreError();
    return absl::InternalError(absl::StrCat(
        "Acquire: daemon returned ", lease.pages_.size(), " pages for ",
        lease.matched_blocks_, " matched + ", lease.new_blocks_, " new blocks"));
  }
  if (lease.held() && SteadyClock::now() >= lease.usable_until_) {
    // Too late to use (a slow answer): end it now and serve a miss.
    lease.Release().IgnoreError();
    Lease miss;
    miss.core_ = core_;
    miss.degraded_ = true;
    miss.total_blocks_ = total_blocks;
    return miss;
  }
  return lease;
}

absl::StatusOr<v1::MatchResponse> Client::Match(
    absl::Span<const uint32_t> tokens) {
  v1::MatchRequest req;
  *req.mutable_namespace_() = NamespaceToProto(options_.ns);
  SetPromptTokens(tokens, options_.legacy_prompt_fields, &req);
  v1::MatchResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  RETURN_IF_ERROR(FromGrpcStatus(core_->stub()->Match(&ctx, req, &resp)));
  return resp;
}

absl::StatusOr<v1::MatchResponse> Client::MatchKeys(
    absl::Span<const BlockKey> keys) {
  v1::MatchRequest req;
  *req.mutable_namespace_() = NamespaceToProto(options_.ns);
  SetPromptKeys(keys, options_.legacy_prompt_fields, &req);
  v1::MatchResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  RETURN_IF_ERROR(FromGrpcStatus(core_->stub()->Match(&ctx, req, &resp)));
  return resp;
}

std::vector<BlockKey> Client::ComputeKeys(
    absl::Span<const uint32_t> tokens) const {
  return ComputeBlockKeys(root_, options_.ns.page_size, tokens);
}

std::shared_ptr<gpu::MappedPool> Client::pool() const {
  return core_->Current().pool;
}

bool Client::connected() const { return core_->Current().usable; }

ClientState Client::state() const { return core_->State(); }

absl::Status Client::WaitForSession(absl::Duration timeout) const {
  return core_->WaitForSession(timeout);
}

}  // namespace radixkv
