#include "daemon/cache.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "daemon/log.h"
#include "radix/status_macros.h"
#include "radixkv/namespace_spec.h"

namespace radixkv::daemon {
namespace {

// The block keys of the prompt this thread is serving: filled by
// ValidatePrompt (key mode) or ResolveKeys (token mode) and viewed by
// Prompt::keys, so neither mode allocates a key vector per request once the
// thread is warm. One RPC handler validates one prompt at a time per thread.
// Its size is bounded by --max_prompt_tokens / page_size keys.
std::vector<BlockKey>& ThreadKeyScratch() {
  thread_local std::vector<BlockKey> scratch;
  return scratch;
}
// The pages ResolveKeys's token walk found (Prompt::known_pages), likewise.
std::vector<PageId>& ThreadPageScratch() {
  thread_local std::vector<PageId> scratch;
  return scratch;
}

// NamespaceRoot(spec), remembering the last spec this thread saw: Match
// names its namespace on every call (no session), and a router asks about
// the same one again and again; comparing the spec is cheaper than hashing
// it.
BlockKey ThreadCachedRoot(const NamespaceSpec& spec) {
  thread_local NamespaceSpec last_spec;
  thread_local BlockKey last_root;
  thread_local bool valid = false;
  if (!valid || !(spec == last_spec)) {
    last_root = NamespaceRoot(spec);
    last_spec = spec;
    valid = true;
  }
  return last_root;
}

// tokens_le is read and pages_le written in place as host u32 values; a
// big-endian host would have to byte-swap copies instead.
static_assert(std::endian::native == std::endian::little,
              "radixkvd reads tokens_le in place: little-endian hosts only");
static_assert(sizeof(PageId) == 4, "AcquireResponse.pages_le holds u32");

// Largest page a layout may describe; anything above is surely a typo.
constexpr unsigned __int128 kMaxPageBytes = uint64_t{1} << 40;
// DumpTree bounds (documented in the .proto).
constexpr uint32_t kDefaultDumpLimit = 100;
constexpr uint32_t kMaxDumpLimit = 10000;

absl::Status CheckString(absl::string_view field, const std::string& value,
                         uint32_t limit) {
  if (value.size() > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value.size(),
                     " bytes exceed the limit --max_string_bytes=", limit));
  }
  return absl::OkStatus();
}

// Prefixes a status message with the field it is about, keeping the code.
absl::Status WithField(absl::string_view field, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
}

v1::BlockState ToProto(BlockStatus s) {
  switch (s) {
    case BlockStatus::kCached: return v1::BLOCK_STATE_CACHED;
    case BlockStatus::kNotPresent: return v1::BLOCK_STATE_NOT_PRESENT;
    case BlockStatus::kEvicted: return v1::BLOCK_STATE_EVICTED;
    case BlockStatus::kTokenMismatch: return v1::BLOCK_STATE_TOKEN_MISMATCH;
    case BlockStatus::kParentMissing: return v1::BLOCK_STATE_PARENT_MISSING;
  }
  return v1::BLOCK_STATE_UNSPECIFIED;
}

const char* Reason(v1::BlockState s) {
  switch (s) {
    case v1::BLOCK_STATE_CACHED: return "cached";
    case v1::BLOCK_STATE_NOT_PRESENT: return "not present (never cached, or forgotten)";
    case v1::BLOCK_STATE_EVICTED: return "evicted (LRU, Evict or Clear)";
    case v1::BLOCK_STATE_TOKEN_MISMATCH:
      return "key cached with different tokens (hash collision)";
    case v1::BLOCK_STATE_WRONG_NAMESPACE:
      return "these tokens are cached under another namespace";
    case v1::BLOCK_STATE_PARENT_MISSING:
      return "an earlier block of the prompt is not cached";
    default: return "";
  }
}

}  // namespace

absl::Span<const uint32_t> TokensLeView(absl::string_view bytes,
                                        std::vector<uint32_t>* copy) {
  const size_t n = bytes.size() / sizeof(uint32_t);
  // The wire form is the host's form (little-endian, asserted above), so the
  // ids are used in place when the bytes are aligned, which protobuf's string
  // storage is in practice; otherwise they are copied once.
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint32_t) == 0) {
    return absl::MakeConstSpan(reinterpret_cast<const uint32_t*>(bytes.data()),
                               n);
  }
  copy->resize(n);
  if (n > 0) std::memcpy(copy->data(), bytes.data(), n * sizeof(uint32_t));
  return *copy;
}

Cache::Cache(const CacheOptions& options)
    : options_(options),
      started_(absl::Now()),
      events_(options.event_buffer),
      sessions_(options.sessions) {
  sweeper_ = std::thread([this] { SweeperLoop(); });
}

Cache::~Cache() {
  {
    absl::MutexLock lock(&sweeper_mu_);
    stop_sweeper_ = true;
  }
  sweeper_.join();
  events_.Shutdown();
}

void Cache::SweeperLoop() {
  absl::MutexLock lock(&sweeper_mu_);
  while (true) {
    const absl::Condition stopping(&stop_sweeper_);
    if (sweeper_mu_.AwaitWithTimeout(stopping, options_.sweep_interval)) return;
    sweeper_mu_.Unlock();
    SweepExpiredLeases();
    sweeper_mu_.Lock();
  }
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

absl::StatusOr<NamespaceSpec> Cache::ValidateNamespace(
    const v1::Namespace& ns) const {
  const uint32_t lim = options_.max_string_bytes;
  RETURN_IF_ERROR(CheckString("namespace.model", ns.model(), lim));
  RETURN_IF_ERROR(CheckString("namespace.model_revision", ns.model_revision(), lim));
  RETURN_IF_ERROR(CheckString("namespace.lora", ns.lora(), lim));
  RETURN_IF_ERROR(CheckString("namespace.cache_salt", ns.cache_salt(), lim));
  if (ns.page_size() == 0 || ns.page_size() > options_.max_page_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace.page_size: ", ns.page_size(), " is outside 1..",
        options_.max_page_size, " (--max_page_size)"));
  }
  if (!v1::DType_IsValid(ns.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace.dtype: unknown value ", static_cast<int>(ns.dtype()),
        " (see enum radixkv.v1.DType)"));
  }
  const uint32_t tp_size = ns.tp_size() == 0 ? 1 : ns.tp_size();
  if (ns.tp_rank() >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace.tp_rank: ", ns.tp_rank(),
                     " must be below namespace.tp_size=", tp_size));
  }
  NamespaceSpec spec = NamespaceFromProto(ns);
  const unsigned __int128 bytes = static_cast<unsigned __int128>(spec.num_layers) *
                                  2 * spec.num_kv_heads * spec.page_size *
                                  spec.head_dim * DTypeBytes(spec.dtype);
  if (bytes > kMaxPageBytes) {
    return absl::InvalidArgumentError(
        "namespace: num_layers x 2 x num_kv_heads x page_size x head_dim x "
        "dtype bytes exceeds the 1 TiB page limit");
  }
  return spec;
}

absl::StatusOr<Cache::Prompt> Cache::ValidatePrompt(const PromptFields& f,
                                                    uint32_t page_size) const {
  const uint32_t max_tokens = options_.max_prompt_tokens;
  const int forms = int{!f.tokens.empty()} + int{!f.tokens_le.empty()} +
                    int{!f.block_keys.empty()} +
                    int{!f.block_keys_packed.empty()};
  if (forms > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens, tokens_le, block_keys, block_keys_packed: set exactly one "
        "(got ", f.tokens.size(), " tokens, ", f.tokens_le.size(),
        " bytes of tokens_le, ", f.block_keys.size(), " block_keys and ",
        f.block_keys_packed.size(), " bytes of block_keys_packed)"));
  }
  Prompt p;
  if (!f.block_keys.empty() || !f.block_keys_packed.empty()) {
    const bool packed = !f.block_keys_packed.empty();
    const char* field = packed ? "block_keys_packed" : "block_keys";
    if (!options_.allow_key_mode) {
      return absl::FailedPreconditionError(absl::StrCat(
          field, ": key mode is disabled on this daemon (unverifiable hits); "
          "send tokens, or start radixkvd with --allow_key_mode"));
    }
    if (packed && f.block_keys_packed.size() % BlockKey::kBytes != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block_keys_packed: ", f.block_keys_packed.size(),
          " bytes is not a multiple of ", BlockKey::kBytes,
          " (one 16-byte key per block)"));
    }
    const uint64_t count = packed ? f.block_keys_packed.size() / BlockKey::kBytes
                                  : static_cast<uint64_t>(f.block_keys.size());
    const uint32_t max_keys = std::max<uint32_t>(1, max_tokens / page_size);
    if (count > max_keys) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", count, " keys exceed the limit ", max_keys,
          " (--max_prompt_tokens=", max_tokens, " / page_size ", page_size,
          ")"));
    }
    // Reused per thread: key mode then allocates nothing once warm.
    std::vector<BlockKey>& scratch = ThreadKeyScratch();
    scratch.clear();
    scratch.reserve(count);
    if (packed) {
      const char* data = f.block_keys_packed.data();
      for (uint64_t i = 0; i < count; ++i) {
        scratch.push_back(BlockKey::FromCanonical(
            absl::string_view(data + i * BlockKey::kBytes, BlockKey::kBytes)));
      }
    } else {
      for (int i = 0; i < f.block_keys.size(); ++i) {
        const std::string& k = f.block_keys[i];
        if (k.size() != BlockKey::kBytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              "block_keys[", i, "]: ", k.size(),
              " bytes; a block key is exactly ", BlockKey::kBytes, " bytes"));
        }
        scratch.push_back(BlockKey::FromCanonical(k));
      }
    }
    p.key_mode = true;
    p.keys = scratch;
    return p;
  }
  if (!f.tokens_le.empty()) {
    const std::string& le = f.tokens_le;
    if (le.size() % sizeof(uint32_t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens_le: ", le.size(),
          " bytes is not a multiple of 4 (little-endian u32 token ids)"));
    }
    const size_t n = le.size() / sizeof(uint32_t);
    if (n > max_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens_le: ", n,
                       " ids exceed the limit --max_prompt_tokens=", max_tokens));
    }
    p.tokens = TokensLeView(le, &p.tokens_copy);
    return p;
  }
  if (f.tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens: empty; send 1..", max_tokens,
        " token ids (--max_prompt_tokens) in tokens or tokens_le"));
  }
  if (static_cast<uint64_t>(f.tokens.size()) > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens: ", f.tokens.size(),
                     " ids exceed the limit --max_prompt_tokens=", max_tokens));
  }
  p.tokens = absl::MakeConstSpan(f.tokens.data(),
                                 static_cast<size_t>(f.tokens.size()));
  return p;
}

void Cache::ResolveKeys(const BlockKey& root, uint32_t page_size,
                        const RadixTree* tree, NamespaceId ns, bool all_keys,
                        Prompt* p) {
  if (p->key_mode) {
    p->total_blocks = static_cast<uint32_t>(p->keys.size());
    return;
  }
  std::vector<BlockKey>& scratch = ThreadKeyScratch();
  std::vector<PageId>& pages = ThreadPageScratch();
  p->total_blocks = static_cast<uint32_t>(p->tokens.size() / page_size);
  size_t known = 0;
  if (tree != nullptr) {
    known = tree->ResolveTokenKeys(ns, p->tokens, /*stop_at_missing=*/!all_keys,
                                   &scratch, &pages, &p->known_epoch);
  } else {
    ComputeBlockKeys(root, page_size, p->tokens, &scratch);
    pages.clear();
  }
  p->known_pages = pages;
  p->walked_blocks = static_cast<uint32_t>(known);
  p->hashed_blocks = static_cast<uint32_t>(scratch.size() - known);
  p->keys = scratch;
  p->tokens = p->tokens.first(scratch.size() * page_size);
}

void Cache::CountResolved(const Prompt& p) {
  if (p.walked_blocks != 0) {
    walked_blocks_.fetch_add(p.walked_blocks, std::memory_order_relaxed);
  }
  if (p.hashed_blocks != 0) {
    hashed_blocks_.fetch_add(p.hashed_blocks, std::memory_order_relaxed);
  }
}

// ---------------------------------------------------------------------------
// Namespaces and the pool
// ---------------------------------------------------------------------------

absl::StatusOr<Cache::NamespaceEntry> Cache::BindNamespace(
    const NamespaceSpec& spec) {
  const BlockKey root = NamespaceRoot(spec);
  absl::MutexLock lock(&ns_mu_);
  if (auto it = namespaces_.find(root); it != namespaces_.end()) {
    return it->second;
  }
  const uint64_t page_bytes = spec.PageBytes();
  const bool needs_memory = options_.pool.backend != gpu::Backend::kNone;
  if (tree_owner_ == nullptr) {
    if (needs_memory && page_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "namespace: num_layers, num_kv_heads, head_dim and dtype must all be "
          "set for a ", gpu::BackendName(options_.pool.backend),
          " pool (page_bytes would be 0)"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<gpu::PagePool> pool,
                     gpu::CreatePagePool(options_.pool, page_bytes));
    if (pool->capacity_pages() == 0 || pool->capacity_pages() >= kNoPage) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pool: ", pool->capacity_pages(), " pages of ", page_bytes,
          " bytes; the pool must hold 1..", kNoPage - 1, " pages"));
    }
    RadixTreeOptions topts;
    topts.capacity_pages = static_cast<uint32_t>(pool->capacity_pages());
    topts.max_page_size = options_.max_page_size;
    topts.remembered_evictions = options_.remembered_evictions;
    topts.listener = &events_;
    auto tree = std::make_unique<RadixTree>(topts);
    ASSIGN_OR_RETURN(NamespaceId id, tree->RegisterNamespace(spec));
    pool_owner_ = std::move(pool);
    tree_owner_ = std::move(tree);
    pool_.store(pool_owner_.get(), std::memory_order_release);
    tree_.store(tree_owner_.get(), std::memory_order_release);
    first_model_ = spec.model;
    first_page_bytes_ = page_bytes;
    Log(LogLevel::kInfo,
        absl::StrCat("pool ", gpu::BackendName(options_.pool.backend), ": ",
                     topts.capacity_pages, " pages of ", page_bytes,
                     " bytes, layout fixed by model '", spec.model,
                     "' (page_size ", spec.page_size, "), ",
                     tree_owner_->vector_walk(spec.page_size) ? "AVX2"
                                                              : "portable",
                     " token walk"));
    NamespaceEntry e{id, spec, root};
    namespaces_[root] = e;
    roots_[id] = root;
    events_.SetNamespaceRoot(id, root);
    return e;
  }
  // A none pool has no page memory, but its layout is still fixed by the
  // first namespace so that moving to a real pool changes nothing.
  const uint64_t pool_bytes =
      needs_memory ? pool_owner_->page_bytes() : first_page_bytes_;
  const bool mismatch = needs_memory ? page_bytes != pool_bytes
                                     : (page_bytes != 0 && pool_bytes != 0 &&
                                        page_bytes != pool_bytes);
  if (mismatch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "namespace: page_bytes ", page_bytes,
        " (num_layers x 2 x num_kv_heads x page_size x head_dim x dtype bytes)"
        " differs from the pool's page_bytes ", pool_bytes,
        ", fixed by the first namespace bound to it (model '", first_model_,
        "'); run another radixkvd for this layout"));
  }
  ASSIGN_OR_RETURN(NamespaceId id, tree_owner_->RegisterNamespace(spec));
  NamespaceEntry e{id, spec, root};
  namespaces_[root] = e;
  roots_[id] = root;
  events_.SetNamespaceRoot(id, root);
  return e;
}

bool Cache::FindNamespace(const BlockKey& root, NamespaceEntry* out) const {
  absl::ReaderMutexLock lock(&ns_mu_);
  auto it = namespaces_.find(root);
  if (it == namespaces_.end()) return false;
  *out = it->second;
  return true;
}

void Cache::FillPoolInfo(v1::PoolInfo* info) const {
  const gpu::PagePool* pool = pool_.load(std::memory_order_acquire);
  const char* backend = gpu::BackendName(options_.pool.backend);
  info->set_backend(backend);
  info->set_device(options_.pool.backend == gpu::Backend::kCuda
                       ? options_.pool.device
                       : -1);
  if (pool == nullptr) {
    if (options_.pool.backend == gpu::Backend::kNone) {
      info->set_capacity_pages(options_.pool.pages);
    }
    return;
  }
  info->set_page_bytes(pool->page_bytes());
  info->set_capacity_pages(pool->capacity_pages());
  info->set_pages_per_chunk(pool->pages_per_chunk());
  info->set_device(pool->device());
  if (pool->backend() != gpu::Backend::kNone) {
    info->set_attach_socket(options_.attach_socket);
  }
}

const gpu::PagePool* Cache::PoolForSession(absl::string_view session_id) const {
  const gpu::PagePool* pool = pool_.load(std::memory_order_acquire);
  if (pool == nullptr || pool->backend() == gpu::Backend::kNone) return nullptr;
  return sessions_.Exists(session_id) ? pool : nullptr;
}

// ---------------------------------------------------------------------------
// KvCache
// ---------------------------------------------------------------------------

absl::Status Cache::OpenSession(const v1::OpenSession& open,
                                absl::string_view peer, v1::SessionInfo* info) {
  if (!open.has_namespace_()) {
    return absl::InvalidArgumentError(
        "open.namespace: required (model, layout, page_size ...)");
  }
  const uint32_t version =
      open.block_key_version() == 0 ? kBlockKeyVersion : open.block_key_version();
  if (version != kBlockKeyVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "open.block_key_version: ", version, " is not supported; this daemon "
        "computes block-key contract version ", kBlockKeyVersion));
  }
  RETURN_IF_ERROR(CheckString("open.client_name", open.client_name(),
                              options_.max_string_bytes));
  ASSIGN_OR_RETURN(NamespaceSpec spec, ValidateNamespace(open.namespace_()));
  if (sessions_.session_count() >= options_.sessions.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sessions: the limit --max_sessions=", options_.sessions.max_sessions,
        " is reached"));
  }
  ASSIGN_OR_RETURN(NamespaceEntry ns, BindNamespace(spec));
  SessionBinding binding{ns.id, ns.root, spec.page_size};
  ASSIGN_OR_RETURN(std::string id, sessions_.Create(binding, open.client_name(),
                                                    peer, open.device()));
  info->Clear();
  info->set_session_id(id);
  info->set_namespace_id(ns.root.ToCanonical());
  FillPoolInfo(info->mutable_pool());
  info->set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.sessions.lease_ttl));
  info->set_max_prompt_tokens(options_.max_prompt_tokens);
  info->set_key_mode_allowed(options_.allow_key_mode);
  return absl::OkStatus();
}

void Cache::ReleaseLeases(const std::vector<LeaseId>& leases) {
  RadixTree* t = tree();
  if (t == nullptr) return;
  for (LeaseId l : leases) t->Release(l).IgnoreError();  // may have ended
}

void Cache::CloseSession(absl::string_view session_id) {
  ReleaseLeases(sessions_.Remove(session_id));
}

absl::Status Cache::Acquire(const v1::AcquireRequest& req,
                            v1::AcquireResponse* resp) {
  // Ending a lease frees a slot, so a request that ends some needs none.
  ASSIGN_OR_RETURN(SessionBinding b,
                   sessions_.Lookup(req.session_id(),
                                    /*need_lease_slot=*/req.release_leases().empty()));
  ASSIGN_OR_RETURN(Prompt p,
                   ValidatePrompt(FieldsOf(req), b.page_size));
  RETURN_IF_ERROR(CheckReleaseLeases(req));
  RadixTree* t = tree();
  if (t == nullptr) return absl::InternalError("session without a pool");
  // Without allocation only the matched prefix matters: stop hashing at
  // the first block the tree lacks.
  ResolveKeys(b.root, b.page_size, t, b.ns, /*all_keys=*/req.allocate(), &p);
  CountResolved(p);
  AcquireRequest areq;
  areq.ns = b.ns;
  areq.keys = p.keys;
  areq.tokens = p.tokens;
  areq.chain_keys = !p.key_mode;  // keys computed here from the tokens
  areq.known_pages = p.known_pages;
  areq.known_epoch = p.known_epoch;
  if (p.keys.size() < p.total_blocks) areq.prompt_blocks = p.total_blocks;
  areq.allocate = req.allocate();
  areq.max_new_blocks = req.max_new_blocks();
  // The tree ends release_leases within the Acquire (after pinning the
  // match, before allocating), so a prefix both leases hold is not unpinned
  // and pinned again; the session's books follow once it has.
  const auto& carried = req.release_leases();
  areq.end_leases = absl::MakeConstSpan(carried.data(), carried.size());
  absl::StatusOr<AcquireResult> acquired = t->Acquire(areq);
  if (!acquired.ok()) {
    // NOT_FOUND: a listed lease expired since CheckReleaseLeases.
    return absl::IsNotFound(acquired.status())
               ? WithField("release_leases", acquired.status())
               : acquired.status();
  }
  AcquireResult& r = *acquired;
  for (uint64_t lease : carried) sessions_.RemoveLease(lease);
  absl::Time expires = absl::InfinitePast();
  if (r.lease != 0) {
    absl::StatusOr<absl::Time> added =
        sessions_.AddLease(req.session_id(), r.lease, absl::Now());
    if (!added.ok()) {
      t->Release(r.lease).IgnoreError();
      return added.status();
    }
    expires = *added;
  }
  resp->Clear();
  resp->set_lease_id(r.lease);
  resp->set_total_blocks(r.total_blocks);
  resp->set_matched_blocks(r.matched_blocks);
  resp->set_matched_tokens(uint64_t{r.matched_blocks} * b.page_size);
  if (req.pages_le()) {
    // Host order is little-endian (static_assert above).
    if (!r.pages.empty()) {
      resp->mutable_pages_le()->assign(
          reinterpret_cast<const char*>(r.pages.data()),
          r.pages.size() * sizeof(PageId));
    }
  } else {
    resp->mutable_pages()->Reserve(static_cast<int>(r.pages.size()));
    for (PageId page : r.pages) resp->add_pages(page);
  }
  resp->set_new_blocks(r.new_blocks);
  if (r.lease != 0) {
    resp->set_lease_expires_unix_ms(absl::ToUnixMillis(expires));
  }
  return absl::OkStatus();
}

absl::Status Cache::CheckReleaseLeases(const v1::AcquireRequest& req) {
  const auto& leases = req.release_leases();
  if (leases.size() > kMaxReleaseLeases) {
    return absl::InvalidArgumentError(
        absl::StrCat("release_leases: ", leases.size(), " leases, at most ",
                     kMaxReleaseLeases));
  }
  for (int i = 0; i < leases.size(); ++i) {
    for (int j = 0; j < i; ++j) {
      if (leases[i] == leases[j]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "release_leases: lease ", leases[i], " is listed twice"));
      }
    }
  }
  for (uint64_t lease : leases) {
    absl::Status owner = CheckLeaseOwner(req.session_id(), lease);
    if (!owner.ok()) {
      return absl::Status(
          owner.code(),
          absl::StrCat("release_leases: ",
                       absl::StripPrefix(owner.message(), "lease_id: ")));
    }
  }
  return absl::OkStatus();
}

absl::Status Cache::CheckLeaseOwner(absl::string_view session_id,
                                    LeaseId lease) {
  if (session_id.empty()) {
    return absl::InvalidArgumentError(
        "session_id: required (the session that acquired the lease)");
  }
  bool expired = false;
  absl::Status owner =
      sessions_.CheckOwner(session_id, lease, absl::Now(), &expired);
  if (expired) {
    ReleaseLeases({lease});
    lease_expired_.fetch_add(1, std::memory_order_relaxed);
  }
  return owner;
}

absl::Status Cache::Commit(const v1::CommitRequest& req,
                           v1::CommitResponse* resp) {
  RETURN_IF_ERROR(CheckLeaseOwner(req.session_id(), req.lease_id()));
  RadixTree* t = tree();
  if (t == nullptr) return absl::InternalError("lease without a pool");
  absl::StatusOr<CommitResult> r =
      t->Commit(req.lease_id(), req.blocks(), req.release());
  if (!r.ok()) {
    if (absl::IsNotFound(r.status())) sessions_.RemoveLease(req.lease_id());
    return WithField(absl::IsNotFound(r.status()) ? "lease_id" : "blocks",
                     r.status());
  }
  if (r->released) sessions_.RemoveLease(req.lease_id());
  resp->Clear();
  resp->set_inserted(r->inserted);
  resp->set_deduplicated(r->deduplicated);
  resp->set_collided(r->collided);
  resp->set_released(r->released);
  resp->mutable_pages()->Reserve(static_cast<int>(r->pages.size()));
  for (PageId page : r->pages) resp->add_pages(page);
  return absl::OkStatus();
}

absl::Status Cache::Release(const v1::ReleaseRequest& req) {
  RETURN_IF_ERROR(CheckLeaseOwner(req.session_id(), req.lease_id()));
  sessions_.RemoveLease(req.lease_id());
  RadixTree* t = tree();
  if (t == nullptr) return absl::InternalError("lease without a pool");
  return WithField("lease_id", t->Release(req.lease_id()));
}

void Cache::AbandonLease(LeaseId lease) {
  sessions_.RemoveLease(lease);
  RadixTree* t = tree();
  // NOT_FOUND: the session ended (releasing it) or the lease expired first.
  if (t != nullptr && t->Release(lease).ok()) {
    lease_abandoned_.fetch_add(1, std::memory_order_relaxed);
  }
}

absl::Status Cache::Match(const v1::MatchRequest& req, v1::MatchResponse* resp) {
  ASSIGN_OR_RETURN(NamespaceSpec spec, ValidateNamespace(req.namespace_()));
  ASSIGN_OR_RETURN(Prompt p,
                   ValidatePrompt(FieldsOf(req), spec.page_size));
  const BlockKey root = ThreadCachedRoot(spec);
  NamespaceEntry ns;
  RadixTree* t = tree();
  const bool known = t != nullptr && FindNamespace(root, &ns);
  resp->Clear();
  char root_bytes[BlockKey::kBytes];
  root.ToCanonical(root_bytes);
  resp->set_namespace_id(root_bytes, sizeof(root_bytes));
  MatchResult r;
  if (!p.key_mode) {
    // Nothing cached in a namespace the tree has not seen: no key needed.
    r.total_blocks = static_cast<uint32_t>(p.tokens.size() / spec.page_size);
    if (known) {
      ASSIGN_OR_RETURN(r, t->MatchTokens(ns.id, p.tokens));
      p.walked_blocks = r.walked_blocks;
      p.hashed_blocks = r.hashed_blocks;
      CountResolved(p);
    }
  } else {
    r.total_blocks = static_cast<uint32_t>(p.keys.size());
    if (known) {
      ASSIGN_OR_RETURN(r, t->Match(ns.id, p.keys, p.tokens));
    }
  }
  resp->set_total_blocks(r.total_blocks);
  resp->set_matched_blocks(r.matched_blocks);
  resp->set_matched_tokens(uint64_t{r.matched_blocks} * spec.page_size);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Admin
// ---------------------------------------------------------------------------

void Cache::GetStats(v1::Stats* s) const {
  s->Clear();
  RadixTree* t = tree();
  if (t != nullptr) {
    const TreeStats ts = t->GetStats();
    s->set_capacity_pages(ts.capacity_pages);
    s->set_free_pages(ts.free_pages);
    s->set_writing_pages(ts.writing_pages);
    s->set_cached_pages(ts.cached_pages);
    s->set_pinned_pages(ts.pinned_pages);
    s->set_lookup_tokens(ts.lookup_tokens);
    s->set_hit_tokens(ts.hit_tokens);
    s->set_evicted_pages(ts.evicted_pages);
    s->set_leases(ts.leases);
    s->set_hash_collisions(ts.hash_collisions);
    s->set_tree_nodes(ts.nodes);
    s->set_namespaces(ts.namespaces);
    s->set_lookups(ts.lookups);
    s->set_matches(ts.matches);
    s->set_inserted_blocks(ts.inserted_blocks);
    s->set_deduplicated_blocks(ts.deduplicated_blocks);
    s->set_invariants_ok(ts.free_pages + ts.writing_pages + ts.cached_pages ==
                             ts.capacity_pages &&
                         ts.pinned_pages <= ts.cached_pages);
  } else {
    s->set_invariants_ok(true);
  }
  s->set_sessions(sessions_.session_count());
  s->set_lease_expired(lease_expired_total());
  s->set_lease_abandoned(lease_abandoned_total());
  s->set_walked_blocks(walked_blocks_.load(std::memory_order_relaxed));
  s->set_hashed_blocks(hashed_blocks_.load(std::memory_order_relaxed));
  s->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  FillPoolInfo(s->mutable_pool());
  s->set_version(RADIXKV_VERSION_STRING);
}

void Cache::ListNamespaces(v1::ListNamespacesResponse* resp) const {
  resp->Clear();
  RadixTree* t = tree();
  if (t == nullptr) return;
  const auto per_ns = sessions_.SessionsPerNamespace();
  for (const NamespaceInfo& info : t->ListNamespaces()) {
    v1::NamespaceEntry* e = resp->add_namespaces();
    e->set_namespace_id(info.root.ToCanonical());
    NamespaceToProto(info.spec, e->mutable_namespace_());
    e->set_cached_blocks(info.cached_blocks);
    auto it = per_ns.find(info.id);
    e->set_sessions(it == per_ns.end() ? 0 : it->second);
  }
}

absl::Status Cache::DumpTree(const v1::DumpTreeRequest& req,
                             v1::DumpTreeResponse* resp) const {
  const uint32_t limit = req.limit() == 0 ? kDefaultDumpLimit : req.limit();
  if (limit > kMaxDumpLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "limit: ", limit, " exceeds the maximum ", kMaxDumpLimit));
  }
  const uint32_t max_depth = req.has_max_depth()
                                 ? req.max_depth()
                                 : std::numeric_limits<uint32_t>::max();
  resp->Clear();
  RadixTree* t = tree();
  if (t == nullptr) return absl::OkStatus();
  absl::flat_hash_map<NamespaceId, BlockKey> roots;
  {
    absl::ReaderMutexLock lock(&ns_mu_);
    roots = roots_;
  }
  const uint64_t total = t->GetStats().nodes;
  const std::vector<NodeInfo> nodes = t->DumpTree(max_depth, limit);
  for (const NodeInfo& n : nodes) {
    v1::TreeNode* out = resp->add_nodes();
    out->set_key(n.key.ToCanonical());
    out->set_parent_key(n.parent_key.ToCanonical());
    if (auto it = roots.find(n.ns); it != roots.end()) {
      out->set_namespace_id(it->second.ToCanonical());
    }
    out->set_page(n.page);
    out->set_depth(n.depth);
    out->set_refcount(n.refcount);
    out->set_children(n.children);
    out->set_age_seconds(n.age_seconds);
  }
  resp->set_total_nodes(total);
  // Only the limit truncates; a max_depth filter is what was asked for.
  resp->set_truncated(nodes.size() >= limit && nodes.size() < total);
  return absl::OkStatus();
}

absl::Status Cache::Explain(const v1::ExplainRequest& req,
                            v1::ExplainResponse* resp) const {
  ASSIGN_OR_RETURN(NamespaceSpec spec, ValidateNamespace(req.namespace_()));
  ASSIGN_OR_RETURN(Prompt p,
                   ValidatePrompt(FieldsOf(req), spec.page_size));
  const BlockKey root = NamespaceRoot(spec);
  ResolveKeys(root, spec.page_size, /*tree=*/nullptr, 0, /*all_keys=*/true,
              &p);
  resp->Clear();
  resp->set_namespace_id(root.ToCanonical());
  resp->set_total_blocks(static_cast<uint32_t>(p.keys.size()));

  RadixTree* t = tree();
  NamespaceEntry ns;
  const bool known = t != nullptr && FindNamespace(root, &ns);
  resp->set_namespace_known(known);
  std::vector<BlockExplanation> blocks;
  if (known) {
    ASSIGN_OR_RETURN(blocks, t->Explain(ns.id, p.keys, p.tokens));
  } else {
    blocks.resize(p.keys.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      blocks[i].key = p.keys[i];
      blocks[i].status =
          i == 0 ? BlockStatus::kNotPresent : BlockStatus::kParentMissing;
    }
  }

  // Blocks not cached here: are the same tokens cached in another namespace
  // with the same block size? Only tokens can tell (keys are per namespace).
  std::vector<int> other_match(blocks.size(), -1);
  std::vector<BlockKey> other_root;
  if (!p.key_mode && t != nullptr) {
    std::vector<NamespaceEntry> others;
    {
      absl::ReaderMutexLock lock(&ns_mu_);
      for (const auto& [r, e] : namespaces_) {
        if (r != root && e.spec.page_size == spec.page_size) others.push_back(e);
      }
    }
    for (const NamespaceEntry& o : others) {
      const std::vector<BlockKey> keys =
          ComputeBlockKeys(o.root, o.spec.page_size, p.tokens);
      // Explain, not Match: it reads the same and leaves the Match counter
      // (radixkv_matches_total) alone.
      absl::StatusOr<std::vector<BlockExplanation>> m =
          t->Explain(o.id, keys, p.tokens);
      if (!m.ok()) continue;
      for (size_t i = 0; i < m->size() && i < blocks.size(); ++i) {
        if ((*m)[i].status != BlockStatus::kCached) break;
        if (other_match[i] < 0) {
          other_match[i] = static_cast<int>(other_root.size());
        }
      }
      other_root.push_back(o.root);
    }
  }

  uint32_t matched = 0;
  bool prefix = true;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockExplanation& b = blocks[i];
    v1::BlockExplanation* out = resp->add_blocks();
    out->set_index(static_cast<uint32_t>(i));
    out->set_key(b.key.ToCanonical());
    v1::BlockState state = ToProto(b.status);
    if ((state == v1::BLOCK_STATE_NOT_PRESENT ||
         state == v1::BLOCK_STATE_PARENT_MISSING) &&
        other_match[i] >= 0) {
      state = v1::BLOCK_STATE_WRONG_NAMESPACE;
      out->set_other_namespace_id(other_root[other_match[i]].ToCanonical());
    }
    out->set_state(state);
    out->set_reason(Reason(state));
    if (state == v1::BLOCK_STATE_CACHED) {
      out->set_page(b.page);
      out->set_refcount(b.refcount);
      out->set_age_seconds(b.age_seconds);
      if (prefix) ++matched;
    } else {
      prefix = false;
    }
  }
  resp->set_matched_blocks(matched);
  return absl::OkStatus();
}

void Cache::Evict(const v1::EvictRequest& req, v1::EvictResponse* resp) {
  resp->Clear();
  RadixTree* t = tree();
  if (t == nullptr) return;
  resp->set_evicted(t->Evict(req.pages()));
}

void Cache::Clear(v1::ClearResponse* resp) {
  resp->Clear();
  RadixTree* t = tree();
  if (t == nullptr) return;
  resp->set_removed(t->Clear());
  resp->set_pinned_remaining(t->GetStats().cached_pages);
}

void Cache::ListSessions(v1::ListSessionsResponse* resp) const {
  resp->Clear();
  const absl::Time now = absl::Now();
  for (const SessionSnapshot& s : sessions_.List()) {
    v1::SessionEntry* e = resp->add_sessions();
    e->set_session_id(s.id);
    e->set_client_name(s.client_name);
    e->set_namespace_id(s.binding.root.ToCanonical());
    e->set_device(s.device);
    e->set_leases(s.leases);
    e->set_age_seconds(absl::ToDoubleSeconds(now - s.created));
    e->set_peer(s.peer);
  }
}

uint64_t Cache::SweepExpiredLeases() {
  const std::vector<LeaseId> expired = sessions_.TakeExpired(absl::Now());
  ReleaseLeases(expired);
  lease_expired_.fetch_add(expired.size(), std::memory_order_relaxed);
  return expired.size();
}

absl::Status Cache::CheckInvariants() const {
  RadixTree* t = tree();
  return t == nullptr ? absl::OkStatus() : t->CheckInvariants();
}

}  // namespace radixkv::daemon
