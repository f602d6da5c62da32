// In-process radixkvd over a real Unix-socket gRPC channel: sessions,
// leases, dedupe, eviction, Match/Explain and WatchEvents.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/daemon/server_fixture.h"

namespace radixkv::testing {
namespace {

TEST_F(ServerTest, SessionOpenHeartbeatAndCloseReleasesLeases) {
  StartServer();
  const v1::Namespace ns = TestNamespace();
  auto session = std::make_unique<SessionStream>(kv_.get(), ns, "worker-1");
  ASSERT_TRUE(session->ok()) << session->status().error_message();
  EXPECT_EQ(session->id().size(), 32u);
  EXPECT_EQ(session->info().namespace_id().size(), 16u);
  EXPECT_EQ(session->info().pool().backend(), "none");
  EXPECT_EQ(session->info().pool().capacity_pages(), 64u);
  EXPECT_TRUE(session->Heartbeat(7));
  EXPECT_TRUE(session->Heartbeat(8));

  v1::AcquireResponse a;
  ASSERT_TRUE(Acquire(session->id(), Tokens(16, 1), true, &a).ok());
  EXPECT_EQ(a.new_blocks(), 4u);
  v1::Stats s = Stats();
  EXPECT_EQ(s.sessions(), 1u);
  EXPECT_EQ(s.leases(), 1u);
  EXPECT_EQ(s.writing_pages(), 4u);

  v1::ListSessionsResponse list;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->ListSessions(&ctx, v1::ListSessionsRequest(), &list).ok());
  }
  ASSERT_EQ(list.sessions_size(), 1);
  EXPECT_EQ(list.sessions(0).client_name(), "worker-1");
  EXPECT_EQ(list.sessions(0).leases(), 1u);

  EXPECT_TRUE(session->Close().ok());
  ASSERT_TRUE(WaitFor([&] {
    v1::Stats t = Stats();
    return t.sessions() == 0 && t.leases() == 0 && t.writing_pages() == 0;
  }));
  s = Stats();
  EXPECT_EQ(s.free_pages(), 64u);
  ExpectInvariants(s);
  // The lease died with its session.
  EXPECT_EQ(Release(session->id(), a.lease_id()).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, FirstSessionMessageMustBeOpen) {
  StartServer();
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  auto stream = kv_->Session(&ctx);
  v1::SessionRequest req;
  req.mutable_heartbeat()->set_nonce(1);
  stream->Write(req);
  v1::SessionResponse resp;
  EXPECT_FALSE(stream->Read(&resp));
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("open"), std::string::npos) << s.error_message();
  EXPECT_EQ(Stats().sessions(), 0u);
}

TEST_F(ServerTest, AcquireCommitReleaseAndHit) {
  StartServer();
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  const auto tokens = Tokens(18, 2);  // 4 full blocks + a partial tail

  v1::AcquireResponse a;
  ASSERT_TRUE(Acquire(session.id(), tokens, true, &a).ok());
  EXPECT_NE(a.lease_id(), 0u);
  EXPECT_EQ(a.total_blocks(), 4u);
  EXPECT_EQ(a.matched_blocks(), 0u);
  EXPECT_EQ(a.new_blocks(), 4u);
  ASSERT_EQ(a.pages_size(), 4);
  EXPECT_GT(a.lease_expires_unix_ms(), 0u);

  // Chunked prefill: commit 2 blocks, then the other 2 with release.
  v1::CommitResponse c1, c2;
  ASSERT_TRUE(Commit(session.id(), a.lease_id(), 2, false, &c1).ok());
  EXPECT_EQ(c1.inserted(), 2u);
  EXPECT_FALSE(c1.released());
  ASSERT_TRUE(Commit(session.id(), a.lease_id(), 2, true, &c2).ok());
  EXPECT_EQ(c2.inserted(), 2u);
  EXPECT_TRUE(c2.released());
  v1::Stats s = Stats();
  EXPECT_EQ(s.cached_pages(), 4u);
  EXPECT_EQ(s.writing_pages(), 0u);
  EXPECT_EQ(s.leases(), 0u);
  ExpectInvariants(s);

  v1::AcquireResponse hit;
  ASSERT_TRUE(Acquire(session.id(), tokens, false, &hit).ok());
  EXPECT_EQ(hit.matched_blocks(), 4u);
  EXPECT_EQ(hit.matched_tokens(), 16u);
  std::vector<uint64_t> committed(c1.pages().begin(), c1.pages().end());
  committed.insert(committed.end(), c2.pages().begin(), c2.pages().end());
  EXPECT_EQ(std::vector<uint64_t>(hit.pages().begin(), hit.pages().end()), committed);
  EXPECT_EQ(Stats().pinned_pages(), 4u);
  ASSERT_TRUE(Release(session.id(), hit.lease_id()).ok());
  s = Stats();
  EXPECT_EQ(s.pinned_pages(), 0u);
  EXPECT_EQ(s.hit_tokens(), 16u);
  EXPECT_EQ(s.lookup_tokens(), 32u);
  // Ended leases are gone.
  EXPECT_EQ(Release(session.id(), hit.lease_id()).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// AcquireRequest.release_leases ends earlier leases of the session before the
// new Acquire, as Release would, so a worker needs one RPC per request.
TEST_F(ServerTest, AcquireEndsTheLeasesItIsAskedToRelease) {
  StartServer();
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  const auto tokens = Tokens(16, 3);  // 4 full blocks
  v1::AcquireResponse first;
  ASSERT_TRUE(Acquire(session.id(), tokens, true, &first).ok());
  v1::CommitResponse c;
  ASSERT_TRUE(Commit(session.id(), first.lease_id(), 4, true, &c).ok());

  v1::AcquireResponse hit1;
  ASSERT_TRUE(Acquire(session.id(), tokens, false, &hit1).ok());
  ASSERT_EQ(hit1.matched_blocks(), 4u);
  EXPECT_EQ(Stats().leases(), 1u);

  // The next request's Acquire ends hit1's lease: still one lease, and it
  // is the new one.
  v1::AcquireRequest req;
  req.set_session_id(session.id());
  SetTokens(&req, tokens);
  req.add_release_leases(hit1.lease_id());
  v1::AcquireResponse hit2;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    ASSERT_TRUE(kv_->Acquire(&ctx, req, &hit2).ok());
  }
  EXPECT_EQ(hit2.matched_blocks(), 4u);
  EXPECT_NE(hit2.lease_id(), hit1.lease_id());
  v1::Stats s = Stats();
  EXPECT_EQ(s.leases(), 1u);
  EXPECT_EQ(s.pinned_pages(), 4u);
  ExpectInvariants(s);
  EXPECT_EQ(Release(session.id(), hit1.lease_id()).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // A list with one bad lease releases none of them.
  req.clear_release_leases();
  req.add_release_leases(hit2.lease_id());
  req.add_release_leases(hit1.lease_id());  // already ended
  v1::AcquireResponse refused;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    grpc::Status st = kv_->Acquire(&ctx, req, &refused);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(st.error_message().find("release_leases"), std::string::npos)
        << st.error_message();
  }
  s = Stats();
  EXPECT_EQ(s.leases(), 1u);
  EXPECT_EQ(s.pinned_pages(), 4u);
  // So does a call that fails for another reason (two prompt forms).
  req.clear_release_leases();
  req.add_release_leases(hit2.lease_id());
  SetTokensLe(&req, tokens);  // with `tokens` still set
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    EXPECT_EQ(kv_->Acquire(&ctx, req, &refused).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  s = Stats();
  EXPECT_EQ(s.leases(), 1u);
  EXPECT_EQ(s.pinned_pages(), 4u);
  ASSERT_TRUE(Release(session.id(), hit2.lease_id()).ok());
  EXPECT_EQ(Stats().leases(), 0u);
}

// The four prompt forms name the same blocks: tokens and tokens_le give the
// same keys, matches and pages; block_keys and block_keys_packed too.
TEST_F(ServerTest, PromptFormsAreEquivalent) {
  StartServer([](daemon::ServerOptions& o) {
    o.cache.allow_key_mode = true;
    o.cache.max_prompt_tokens = 64;
  });
  const v1::Namespace ns = TestNamespace();
  SessionStream session(kv_.get(), ns);
  ASSERT_TRUE(session.ok());
  const auto tokens = Tokens(18, 5);  // 4 full blocks + a partial tail

  auto acquire = [&](const std::function<void(v1::AcquireRequest*)>& fill,
                     bool allocate, v1::AcquireResponse* resp) {
    v1::AcquireRequest req;
    req.set_session_id(session.id());
    req.set_allocate(allocate);
    fill(&req);
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    return kv_->Acquire(&ctx, req, resp);
  };
  auto match = [&](const std::function<void(v1::MatchRequest*)>& fill,
                   v1::MatchResponse* resp) {
    v1::MatchRequest req;
    *req.mutable_namespace_() = ns;
    fill(&req);
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    return kv_->Match(&ctx, req, resp);
  };
  auto explain = [&](const std::function<void(v1::ExplainRequest*)>& fill) {
    v1::ExplainRequest req;
    *req.mutable_namespace_() = ns;
    fill(&req);
    v1::ExplainResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    EXPECT_TRUE(admin_->Explain(&ctx, req, &resp).ok());
    return resp;
  };
  auto pages = [](const v1::AcquireResponse& r) {
    return std::vector<uint64_t>(r.pages().begin(), r.pages().end());
  };
  // pages_le: 4 little-endian bytes per page.
  auto pages_le = [](const v1::AcquireResponse& r) {
    std::vector<uint64_t> out;
    const std::string& b = r.pages_le();
    EXPECT_EQ(b.size() % 4, 0u);
    for (size_t i = 0; i + 4 <= b.size(); i += 4) {
      const auto* u = reinterpret_cast<const unsigned char*>(b.data() + i);
      out.push_back(uint64_t{u[0]} | uint64_t{u[1]} << 8 |
                    uint64_t{u[2]} << 16 | uint64_t{u[3]} << 24);
    }
    return out;
  };

  // Cache the prompt through tokens_le.
  v1::AcquireResponse a;
  ASSERT_TRUE(acquire([&](auto* r) { SetTokensLe(r, tokens); }, true, &a).ok());
  ASSERT_EQ(a.total_blocks(), 4u);
  ASSERT_EQ(a.new_blocks(), 4u);
  v1::CommitResponse c;
  ASSERT_TRUE(Commit(session.id(), a.lease_id(), 4, true, &c).ok());
  const std::vector<uint64_t> committed(c.pages().begin(), c.pages().end());
  ASSERT_EQ(committed.size(), 4u);

  // Explain: the same keys from both token forms.
  const v1::ExplainResponse e_tokens =
      explain([&](auto* r) { SetTokens(r, tokens); });
  const v1::ExplainResponse e_le = explain([&](auto* r) { SetTokensLe(r, tokens); });
  ASSERT_EQ(e_tokens.blocks_size(), 4);
  ASSERT_EQ(e_le.blocks_size(), 4);
  std::vector<std::string> keys;
  std::string packed;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(e_tokens.blocks(i).key(), e_le.blocks(i).key()) << i;
    EXPECT_EQ(e_le.blocks(i).state(), v1::BLOCK_STATE_CACHED) << i;
    keys.push_back(e_le.blocks(i).key());
    packed += e_le.blocks(i).key();
  }
  ASSERT_EQ(packed.size(), 64u);

  // Acquire: a hit through each of the four forms pins the committed pages.
  const std::vector<std::function<void(v1::AcquireRequest*)>> forms = {
      [&](auto* r) { SetTokens(r, tokens); },
      [&](auto* r) { SetTokensLe(r, tokens); },
      [&](auto* r) {
        for (const std::string& k : keys) r->add_block_keys(k);
      },
      [&](auto* r) { r->set_block_keys_packed(packed); },
  };
  // Asked for pages_le, the same pages come as bytes and `pages` is empty.
  for (size_t f = 0; f < forms.size(); ++f) {
    for (bool le : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "form " << f << " pages_le " << le);
      v1::AcquireResponse hit;
      ASSERT_TRUE(acquire(
                      [&](v1::AcquireRequest* r) {
                        forms[f](r);
                        r->set_pages_le(le);
                      },
                      false, &hit)
                      .ok());
      EXPECT_EQ(hit.total_blocks(), 4u);
      EXPECT_EQ(hit.matched_blocks(), 4u);
      EXPECT_EQ(le ? pages_le(hit) : pages(hit), committed);
      EXPECT_TRUE(le ? hit.pages().empty() : hit.pages_le().empty());
      ASSERT_TRUE(Release(session.id(), hit.lease_id()).ok());
    }
  }
  // With allocation: the matched pages, then the new ones, in both forms.
  auto longer = tokens;
  for (int i = 0; i < 8; ++i) longer.push_back(100 + i);
  v1::AcquireResponse grow_le;
  ASSERT_TRUE(acquire(
                  [&](v1::AcquireRequest* r) {
                    SetTokensLe(r, longer);
                    r->set_pages_le(true);
                  },
                  true, &grow_le)
                  .ok());
  ASSERT_EQ(grow_le.matched_blocks(), 4u);
  ASSERT_EQ(grow_le.new_blocks(), 2u);
  const std::vector<uint64_t> grown = pages_le(grow_le);
  ASSERT_EQ(grown.size(), 6u);
  EXPECT_EQ(std::vector<uint64_t>(grown.begin(), grown.begin() + 4), committed);
  ASSERT_TRUE(Release(session.id(), grow_le.lease_id()).ok());

  // Match: same answer from each form; a prefix of the keys matches less.
  v1::MatchResponse m_tokens, m_le, m_keys, m_packed, m_short;
  ASSERT_TRUE(match([&](auto* r) { SetTokens(r, tokens); }, &m_tokens).ok());
  ASSERT_TRUE(match([&](auto* r) { SetTokensLe(r, tokens); }, &m_le).ok());
  ASSERT_TRUE(match([&](auto* r) {
                for (const std::string& k : keys) r->add_block_keys(k);
              }, &m_keys).ok());
  ASSERT_TRUE(match([&](auto* r) { r->set_block_keys_packed(packed); }, &m_packed)
                  .ok());
  ASSERT_TRUE(match([&](auto* r) {
                r->set_block_keys_packed(packed.substr(0, 32));
              }, &m_short).ok());
  for (const v1::MatchResponse* m : {&m_tokens, &m_le, &m_keys, &m_packed}) {
    EXPECT_EQ(m->matched_blocks(), 4u);
    EXPECT_EQ(m->total_blocks(), 4u);
    EXPECT_EQ(m->matched_tokens(), 16u);
    EXPECT_EQ(m->namespace_id(), session.info().namespace_id());
  }
  EXPECT_EQ(m_short.matched_blocks(), 2u);
  // A changed token in block 2 breaks the match there in both token forms.
  auto changed = tokens;
  changed[9] += 1;
  ASSERT_TRUE(match([&](auto* r) { SetTokensLe(r, changed); }, &m_le).ok());
  ASSERT_TRUE(match([&](auto* r) { SetTokens(r, changed); }, &m_tokens).ok());
  EXPECT_EQ(m_le.matched_blocks(), 2u);
  EXPECT_EQ(m_tokens.matched_blocks(), 2u);

  // Bad packed keys in key mode: clear errors, nothing changes.
  v1::Stats before = Stats();
  before.clear_uptime_seconds();
  v1::AcquireResponse bad;
  grpc::Status s =
      acquire([&](auto* r) { r->set_block_keys_packed(packed + "x"); }, true, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("block_keys_packed: 65 bytes is not a multiple of 16"),
            std::string::npos)
      << s.error_message();
  // 64 tokens / page_size 4 = at most 16 keys.
  s = acquire([&](auto* r) { r->set_block_keys_packed(std::string(17 * 16, 'k')); },
              true, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("block_keys_packed: 17 keys exceed the limit 16"),
            std::string::npos)
      << s.error_message();
  s = acquire([&](auto* r) {
        r->set_block_keys_packed(packed);
        SetTokens(r, tokens);
      }, true, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("set exactly one"), std::string::npos)
      << s.error_message();
  v1::Stats after = Stats();
  after.clear_uptime_seconds();
  EXPECT_EQ(after.DebugString(), before.DebugString());
}

TEST_F(ServerTest, DedupeBetweenTwoSessions) {
  StartServer();
  SessionStream a_session(kv_.get(), TestNamespace(), "a");
  SessionStream b_session(kv_.get(), TestNamespace(), "b");
  ASSERT_TRUE(a_session.ok() && b_session.ok());
  EXPECT_EQ(a_session.info().namespace_id(), b_session.info().namespace_id());
  const auto tokens = Tokens(16, 3);
  v1::AcquireResponse a, b;
  ASSERT_TRUE(Acquire(a_session.id(), tokens, true, &a).ok());
  ASSERT_TRUE(Acquire(b_session.id(), tokens, true, &b).ok());
  EXPECT_EQ(b.new_blocks(), 4u);  // both missed: both write
  v1::CommitResponse ca, cb;
  ASSERT_TRUE(Commit(a_session.id(), a.lease_id(), 4, true, &ca).ok());
  ASSERT_TRUE(Commit(b_session.id(), b.lease_id(), 4, true, &cb).ok());
  EXPECT_EQ(ca.inserted(), 4u);
  EXPECT_EQ(cb.inserted(), 0u);
  EXPECT_EQ(cb.deduplicated(), 4u);
  EXPECT_EQ(std::vector<uint64_t>(cb.pages().begin(), cb.pages().end()),
            std::vector<uint64_t>(ca.pages().begin(), ca.pages().end()));
  v1::Stats s = Stats();
  EXPECT_EQ(s.cached_pages(), 4u);
  EXPECT_EQ(s.writing_pages(), 0u);
  EXPECT_EQ(s.free_pages(), 60u);
  ExpectInvariants(s);
  // A lease of session a is not usable by session b.
  v1::AcquireResponse pin;
  ASSERT_TRUE(Acquire(a_session.id(), tokens, false, &pin).ok());
  EXPECT_EQ(Release(b_session.id(), pin.lease_id()).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Stats().leases(), 1u);
  EXPECT_TRUE(Release(a_session.id(), pin.lease_id()).ok());
}

TEST_F(ServerTest, EvictionUnderPressure) {
  StartServer([](daemon::ServerOptions& o) {
    o.pool = "none,pages=8";
    // This session may pin the whole pool (the default is half of it).
    o.cache.sessions.max_pinned_pages_per_session = 1 << 20;
  });
  const v1::Namespace ns = TestNamespace();
  SessionStream session(kv_.get(), ns);
  ASSERT_TRUE(session.ok());
  const auto p1 = Tokens(16, 10), p2 = Tokens(16, 11), p3 = Tokens(16, 12);
  Insert(session.id(), p1);
  Insert(session.id(), p2);
  EXPECT_EQ(Stats().free_pages(), 0u);
  // p2 was used last, so p1 is the LRU victim.
  Insert(session.id(), p3);
  v1::Stats s = Stats();
  EXPECT_EQ(s.evicted_pages(), 4u);
  EXPECT_EQ(s.cached_pages(), 8u);
  ExpectInvariants(s);
  EXPECT_EQ(MatchBlocks(ns, p1), 0);
  EXPECT_EQ(MatchBlocks(ns, p2), 4);
  EXPECT_EQ(MatchBlocks(ns, p3), 4);

  // Everything pinned: a new prompt gets fewer pages than it asks for.
  v1::AcquireResponse pin2, pin3, more;
  ASSERT_TRUE(Acquire(session.id(), p2, false, &pin2).ok());
  ASSERT_TRUE(Acquire(session.id(), p3, false, &pin3).ok());
  ASSERT_TRUE(Acquire(session.id(), Tokens(16, 13), true, &more).ok());
  EXPECT_EQ(more.new_blocks(), 0u);
  EXPECT_EQ(Stats().pinned_pages(), 8u);
  ASSERT_TRUE(Release(session.id(), pin2.lease_id()).ok());
  ASSERT_TRUE(Release(session.id(), pin3.lease_id()).ok());
  if (more.lease_id() != 0) {
    ASSERT_TRUE(Release(session.id(), more.lease_id()).ok());
  }

  // Admin Evict and Clear.
  v1::EvictRequest er;
  er.set_pages(2);
  v1::EvictResponse ev;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->Evict(&ctx, er, &ev).ok());
  }
  EXPECT_EQ(ev.evicted(), 2u);
  v1::ClearResponse cl;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->Clear(&ctx, v1::ClearRequest(), &cl).ok());
  }
  EXPECT_EQ(cl.removed(), 6u);
  EXPECT_EQ(cl.pinned_remaining(), 0u);
  s = Stats();
  EXPECT_EQ(s.cached_pages(), 0u);
  EXPECT_EQ(s.free_pages(), 8u);
  ExpectInvariants(s);
}

// Lookups that allocate nothing stop hashing at the first block the cache
// lacks; the answer and the statistics still cover the whole prompt.
TEST_F(ServerTest, LookupsWithoutAllocationCoverTheWholePrompt) {
  StartServer();
  const v1::Namespace ns = TestNamespace();
  SessionStream session(kv_.get(), ns);
  ASSERT_TRUE(session.ok());
  auto concat = [](std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const auto prefix = Tokens(16, 30);               // 4 blocks
  const auto x = concat(prefix, Tokens(16, 31));    // 8 blocks
  const auto y = concat(prefix, Tokens(16, 32));    // 8 blocks
  Insert(session.id(), x);
  Insert(session.id(), y);  // y's block 4 is now the prefix's hot child

  const v1::Stats before = Stats();
  v1::AcquireResponse a;
  ASSERT_TRUE(Acquire(session.id(), x, false, &a).ok());
  EXPECT_EQ(a.total_blocks(), 8u);
  EXPECT_EQ(a.matched_blocks(), 8u);  // found past the hot child too
  ASSERT_TRUE(Release(session.id(), a.lease_id()).ok());

  const auto partial = concat(prefix, Tokens(20, 33));  // 4 cached + 5 new
  v1::AcquireResponse p;
  ASSERT_TRUE(Acquire(session.id(), partial, false, &p).ok());
  EXPECT_EQ(p.total_blocks(), 9u);
  EXPECT_EQ(p.matched_blocks(), 4u);
  EXPECT_EQ(p.new_blocks(), 0u);
  EXPECT_EQ(p.pages_size(), 4);
  ASSERT_TRUE(Release(session.id(), p.lease_id()).ok());

  v1::AcquireResponse miss;
  ASSERT_TRUE(Acquire(session.id(), Tokens(40, 34), false, &miss).ok());
  EXPECT_EQ(miss.total_blocks(), 10u);
  EXPECT_EQ(miss.matched_blocks(), 0u);
  EXPECT_EQ(miss.lease_id(), 0u);

  const v1::Stats after = Stats();
  EXPECT_EQ(after.lookup_tokens() - before.lookup_tokens(), (8u + 9u + 10u) * 4u);
  EXPECT_EQ(after.hit_tokens() - before.hit_tokens(), (8u + 4u) * 4u);

  v1::MatchRequest req;
  *req.mutable_namespace_() = ns;
  SetTokens(&req, partial);
  v1::MatchResponse m;
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  ASSERT_TRUE(kv_->Match(&ctx, req, &m).ok());
  EXPECT_EQ(m.total_blocks(), 9u);
  EXPECT_EQ(m.matched_blocks(), 4u);
  EXPECT_EQ(MatchBlocks(ns, Tokens(40, 34)), 0);
  EXPECT_EQ(MatchBlocks(ns, y), 8);
  ExpectInvariants(after);
}

// Cached blocks of a token prompt are found by comparing tokens, not hashed;
// the statistics say which way each block went.
TEST_F(ServerTest, CachedBlocksAreWalkedNotHashed) {
  StartServer();
  const v1::Namespace ns = TestNamespace();
  SessionStream session(kv_.get(), ns);
  ASSERT_TRUE(session.ok());
  const auto x = Tokens(32, 40);  // 8 blocks
  v1::Stats s0 = Stats();
  Insert(session.id(), x);
  v1::Stats s1 = Stats();
  EXPECT_EQ(s1.hashed_blocks() - s0.hashed_blocks(), 8u);
  EXPECT_EQ(s1.walked_blocks() - s0.walked_blocks(), 0u);

  v1::AcquireResponse hit;
  ASSERT_TRUE(Acquire(session.id(), x, true, &hit).ok());
  EXPECT_EQ(hit.matched_blocks(), 8u);
  ASSERT_TRUE(Release(session.id(), hit.lease_id()).ok());
  EXPECT_EQ(MatchBlocks(ns, x), 8);
  v1::Stats s2 = Stats();
  EXPECT_EQ(s2.walked_blocks() - s1.walked_blocks(), 16u);
  EXPECT_EQ(s2.hashed_blocks() - s1.hashed_blocks(), 0u);

  auto longer = x;
  const auto more = Tokens(20, 41);  // 5 more blocks
  longer.insert(longer.end(), more.begin(), more.end());
  v1::AcquireResponse part;
  ASSERT_TRUE(Acquire(session.id(), longer, true, &part).ok());
  EXPECT_EQ(part.matched_blocks(), 8u);
  EXPECT_EQ(part.new_blocks(), 5u);
  v1::Stats s3 = Stats();
  EXPECT_EQ(s3.walked_blocks() - s2.walked_blocks(), 8u);
  EXPECT_EQ(s3.hashed_blocks() - s2.hashed_blocks(), 5u);
  ASSERT_TRUE(Release(session.id(), part.lease_id()).ok());

  // A Match hashes only the block that ends the match.
  EXPECT_EQ(MatchBlocks(ns, longer), 8);
  v1::Stats s4 = Stats();
  EXPECT_EQ(s4.walked_blocks() - s3.walked_blocks(), 8u);
  EXPECT_EQ(s4.hashed_blocks() - s3.hashed_blocks(), 1u);
}

TEST_F(ServerTest, MatchNeedsNoSessionAndChangesNothing) {
  StartServer();
  const v1::Namespace ns = TestNamespace();
  // Unknown namespace: a plain miss, not an error.
  EXPECT_EQ(MatchBlocks(ns, Tokens(16, 20)), 0);
  SessionStream session(kv_.get(), ns);
  ASSERT_TRUE(session.ok());
  Insert(session.id(), Tokens(8, 20));
  const v1::Stats before = Stats();
  EXPECT_EQ(MatchBlocks(ns, Tokens(16, 20)), 2);
  EXPECT_EQ(MatchBlocks(TestNamespace(4, "another-model"), Tokens(16, 20)), 0);
  const v1::Stats after = Stats();
  EXPECT_EQ(after.cached_pages(), before.cached_pages());
  EXPECT_EQ(after.pinned_pages(), 0u);
  EXPECT_EQ(after.leases(), 0u);
  EXPECT_EQ(after.lookup_tokens(), before.lookup_tokens());
}

TEST_F(ServerTest, ExplainEveryState) {
  StartServer();
  const v1::Namespace ns_a = TestNamespace(4, "model-a");
  const v1::Namespace ns_b = TestNamespace(4, "model-b");
  SessionStream a(kv_.get(), ns_a);
  SessionStream b(kv_.get(), ns_b);
  ASSERT_TRUE(a.ok() && b.ok());

  auto explain = [&](const v1::Namespace& ns, const std::vector<uint32_t>& tokens) {
    v1::ExplainRequest req;
    *req.mutable_namespace_() = ns;
    SetTokens(&req, tokens);
    v1::ExplainResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(admin_->Explain(&ctx, req, &resp).ok());
    return resp;
  };

  // CACHED, NOT_PRESENT, PARENT_MISSING.
  const auto cached = Tokens(8, 30);
  Insert(a.id(), cached);
  auto longer = cached;
  for (uint32_t t : Tokens(8, 31)) longer.push_back(t);
  v1::ExplainResponse e = explain(ns_a, longer);
  EXPECT_TRUE(e.namespace_known());
  ASSERT_EQ(e.blocks_size(), 4);
  EXPECT_EQ(e.matched_blocks(), 2u);
  EXPECT_EQ(e.blocks(0).state(), v1::BLOCK_STATE_CACHED);
  EXPECT_EQ(e.blocks(1).state(), v1::BLOCK_STATE_CACHED);
  EXPECT_EQ(e.blocks(2).state(), v1::BLOCK_STATE_NOT_PRESENT);
  EXPECT_EQ(e.blocks(3).state(), v1::BLOCK_STATE_PARENT_MISSING);
  EXPECT_FALSE(e.blocks(2).reason().empty());

  // WRONG_NAMESPACE: the tokens are cached, but under model-b.
  const auto other = Tokens(8, 32);
  Insert(b.id(), other);
  e = explain(ns_a, other);
  ASSERT_EQ(e.blocks_size(), 2);
  EXPECT_EQ(e.blocks(0).state(), v1::BLOCK_STATE_WRONG_NAMESPACE);
  EXPECT_EQ(e.blocks(1).state(), v1::BLOCK_STATE_WRONG_NAMESPACE);
  EXPECT_EQ(e.blocks(0).other_namespace_id(), b.info().namespace_id());
  // Which field differs, and its values.
  ASSERT_EQ(e.blocks(0).differing_fields_size(), 1);
  EXPECT_EQ(e.blocks(0).differing_fields(0), "model");
  EXPECT_NE(e.blocks(0).reason().find(
                "differs in model \"model-b\" there, \"model-a\" here"),
            std::string::npos)
      << e.blocks(0).reason();

  // EVICTED: cached, then evicted by Clear.
  {
    grpc::ClientContext ctx;
    v1::ClearResponse cl;
    ASSERT_TRUE(admin_->Clear(&ctx, v1::ClearRequest(), &cl).ok());
  }
  e = explain(ns_a, cached);
  ASSERT_EQ(e.blocks_size(), 2);
  EXPECT_EQ(e.blocks(0).state(), v1::BLOCK_STATE_EVICTED);
  EXPECT_EQ(e.matched_blocks(), 0u);

  // A namespace nobody registered.
  e = explain(TestNamespace(4, "model-c"), cached);
  EXPECT_FALSE(e.namespace_known());
  EXPECT_EQ(e.blocks(0).state(), v1::BLOCK_STATE_NOT_PRESENT);
}

TEST_F(ServerTest, DumpTreeAndListNamespaces) {
  StartServer();
  SessionStream session(kv_.get(), TestNamespace(), "dump");
  ASSERT_TRUE(session.ok());
  Insert(session.id(), Tokens(12, 35));  // one chain of 3 blocks
  Insert(session.id(), Tokens(4, 36));   // another first block

  v1::DumpTreeRequest req;
  req.set_limit(10);
  v1::DumpTreeResponse tree;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->DumpTree(&ctx, req, &tree).ok());
  }
  EXPECT_EQ(tree.total_nodes(), 4u);
  EXPECT_FALSE(tree.truncated());
  ASSERT_EQ(tree.nodes_size(), 4);
  EXPECT_EQ(tree.nodes(0).depth(), 0u);  // shallowest first
  EXPECT_EQ(tree.nodes(3).depth(), 2u);
  EXPECT_EQ(tree.nodes(0).namespace_id(), session.info().namespace_id());
  req.set_max_depth(0);
  req.set_limit(1);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->DumpTree(&ctx, req, &tree).ok());
  }
  ASSERT_EQ(tree.nodes_size(), 1);
  EXPECT_TRUE(tree.truncated());
  req.set_limit(20000);
  {
    grpc::ClientContext ctx;
    const grpc::Status s = admin_->DumpTree(&ctx, req, &tree);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("limit"), std::string::npos);
  }

  v1::ListNamespacesResponse nss;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->ListNamespaces(&ctx, v1::ListNamespacesRequest(), &nss).ok());
  }
  ASSERT_EQ(nss.namespaces_size(), 1);
  EXPECT_EQ(nss.namespaces(0).namespace_id(), session.info().namespace_id());
  EXPECT_EQ(nss.namespaces(0).namespace_().model(), "test-model");
  EXPECT_EQ(nss.namespaces(0).cached_blocks(), 4u);
  EXPECT_EQ(nss.namespaces(0).sessions(), 1u);
}

// Reads events until `n` arrived or the stream ends.
std::vector<v1::Event> ReadEvents(grpc::ClientReader<v1::Event>* reader, size_t n) {
  std::vector<v1::Event> out;
  v1::Event e;
  while (out.size() < n && reader->Read(&e)) out.push_back(e);
  return out;
}

TEST_F(ServerTest, WatchEventsInOrder) {
  StartServer();
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  v1::AcquireResponse a;
  ASSERT_TRUE(Acquire(session.id(), Tokens(12, 40), true, &a).ok());
  v1::CommitResponse c;
  ASSERT_TRUE(Commit(session.id(), a.lease_id(), 3, true, &c).ok());
  {
    grpc::ClientContext ctx;
    v1::ClearResponse cl;
    ASSERT_TRUE(admin_->Clear(&ctx, v1::ClearRequest(), &cl).ok());
  }

  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  v1::WatchEventsRequest req;
  req.set_start_sequence(1);
  auto reader = admin_->WatchEvents(&ctx, req);
  std::vector<v1::Event> events = ReadEvents(reader.get(), 3);
  ASSERT_EQ(events.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(events[i].sequence(), i + 1);
    ASSERT_TRUE(events[i].has_stored());
    EXPECT_EQ(events[i].stored().page(), c.pages(i));
    EXPECT_EQ(events[i].stored().depth(), i);
    EXPECT_EQ(events[i].stored().namespace_id(), session.info().namespace_id());
  }
  EXPECT_EQ(events[1].stored().parent_key(), events[0].stored().key());
  // Then the Clear: removals and a Cleared marker, in sequence.
  uint64_t seq = 3;
  bool cleared = false;
  v1::Event e;
  while (!cleared && reader->Read(&e)) {
    EXPECT_EQ(e.sequence(), ++seq);
    cleared = e.has_cleared();
  }
  EXPECT_TRUE(cleared);

  // A live event after subscribing arrives too.
  Insert(session.id(), Tokens(4, 41));
  ASSERT_TRUE(reader->Read(&e));
  EXPECT_EQ(e.sequence(), seq + 1);
  EXPECT_TRUE(e.has_stored());
  ctx.TryCancel();
}

TEST_F(ServerTest, WatchEventsReportsGap) {
  StartServer([](daemon::ServerOptions& o) { o.cache.event_buffer = 4; });
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  Insert(session.id(), Tokens(16, 50));
  Insert(session.id(), Tokens(16, 51));
  Insert(session.id(), Tokens(16, 52));  // 12 events; the ring holds 9..12

  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  v1::WatchEventsRequest req;
  req.set_start_sequence(1);
  auto reader = admin_->WatchEvents(&ctx, req);
  std::vector<v1::Event> events = ReadEvents(reader.get(), 5);
  ASSERT_EQ(events.size(), 5u);
  ASSERT_TRUE(events[0].has_gap());
  EXPECT_EQ(events[0].gap().first_missing(), 1u);
  EXPECT_EQ(events[0].gap().next_sequence(), 9u);
  for (size_t i = 1; i < 5; ++i) {
    EXPECT_EQ(events[i].sequence(), 8 + i);
    EXPECT_TRUE(events[i].has_stored());
  }
  ctx.TryCancel();
}

// A start past the next event is refused at once instead of waiting for
// events that may never come.
TEST_F(ServerTest, WatchEventsFromTheFutureIsRefused) {
  StartServer();
  for (uint64_t start : {uint64_t{5}, ~uint64_t{0}}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    v1::WatchEventsRequest req;
    req.set_start_sequence(start);
    auto reader = admin_->WatchEvents(&ctx, req);
    v1::Event e;
    EXPECT_FALSE(reader->Read(&e));
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
    EXPECT_NE(s.error_message().find("start_sequence"), std::string::npos)
        << s.error_message();
  }
  // From 1 (the first event) is fine on an empty log: it waits.
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline(1));
  v1::WatchEventsRequest req;
  req.set_start_sequence(1);
  auto reader = admin_->WatchEvents(&ctx, req);
  v1::Event e;
  EXPECT_FALSE(reader->Read(&e));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_F(ServerTest, ShutdownEndsStreamsAndRefusesCalls) {
  StartServer();
  SessionStream session(kv_.get(), TestNamespace());
  ASSERT_TRUE(session.ok());
  Insert(session.id(), Tokens(4, 1));
  grpc::ClientContext wctx;
  wctx.set_deadline(Deadline());
  v1::WatchEventsRequest wreq;
  wreq.set_start_sequence(1);
  auto watch = admin_->WatchEvents(&wctx, wreq);
  v1::Event e;
  ASSERT_TRUE(watch->Read(&e));  // the stream is established
  server_->Shutdown(absl::Seconds(5));
  EXPECT_FALSE(watch->Read(&e));
  const grpc::Status ws = watch->Finish();
  EXPECT_EQ(ws.error_code(), grpc::StatusCode::UNAVAILABLE) << ws.error_message();
  const grpc::Status s = session.Close();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  v1::AcquireResponse a;
  EXPECT_FALSE(Acquire(session.id(), Tokens(4, 1), true, &a).ok());
}

}  // namespace
}  // namespace radixkv::testing
