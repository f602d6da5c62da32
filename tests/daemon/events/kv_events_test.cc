// Unit tests of the KV-event pieces below the wire: the tree's event fields
// (token ids, block size, what a Clear leaves), DumpTreePage's cursor, the
// msgpack encoding of batches, and the publisher's sequence numbers and
// replay answers over a real ZMQ socket (ipc) in process.
#include <unistd.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/events/kv_events.h"
#include "daemon/events/kv_events_encode.h"
#include "gtest/gtest.h"
#include "msgpack.hpp"
#include "radix/radix_tree.h"
#include "zmq.hpp"

namespace radixkv::daemon {
namespace {

constexpr uint32_t kPage = 4;

NamespaceSpec Spec() {
  NamespaceSpec s;
  s.model = "m";
  s.num_layers = 1;
  s.num_kv_heads = 1;
  s.head_dim = 8;
  s.page_size = kPage;
  s.dtype = DType::kFloat16;
  s.tp_size = 1;
  return s;
}

// Keeps copies of every event, with its tokens.
struct Recorder : EventListener {
  struct Copy {
    TreeEvent e;
    std::vector<uint32_t> tokens;
  };
  std::vector<Copy> events;
  void OnTreeEvents(absl::Span<const TreeEvent> batch) override {
    for (const TreeEvent& e : batch) {
      Copy c{e, {}};
      if (e.tokens != nullptr) c.tokens.assign(e.tokens, e.tokens + e.block_size);
      c.e.tokens = nullptr;
      events.push_back(c);
    }
  }
};

void Insert(RadixTree& t, NamespaceId ns, const std::vector<uint32_t>& tokens,
            OwnerId owner = kNoOwner, bool release = true) {
  auto a = t.Acquire({.ns = ns, .tokens = tokens, .allocate = true,
                      .owner = owner});
  ASSERT_TRUE(a.ok()) << a.status();
  if (a->lease == 0) return;
  ASSERT_TRUE(t.Commit(a->lease, a->new_blocks, release, owner).ok());
}

TEST(TreeEventsTest, StoredCarriesTokensAndClearSaysWhatRemains) {
  Recorder rec;
  auto tree = RadixTree::Create({.capacity_pages = 16, .listener = &rec});
  ASSERT_TRUE(tree.ok());
  auto ns = (*tree)->RegisterNamespace(Spec());
  ASSERT_TRUE(ns.ok());
  Insert(**tree, *ns, {1, 2, 3, 4, 5, 6, 7, 8});
  ASSERT_EQ(rec.events.size(), 2u);
  EXPECT_EQ(rec.events[0].e.block_size, kPage);
  EXPECT_EQ(rec.events[0].tokens, (std::vector<uint32_t>{1, 2, 3, 4}));
  EXPECT_EQ(rec.events[1].tokens, (std::vector<uint32_t>{5, 6, 7, 8}));
  EXPECT_EQ(rec.events[1].e.parent_key, rec.events[0].e.key);
  // A pinned path survives a Clear: kCleared says how much is left.
  auto held = (*tree)->Acquire({.ns = *ns, .tokens = {{1, 2, 3, 4}},
                                .allocate = false});
  ASSERT_TRUE(held.ok());
  (*tree)->Clear();
  EXPECT_EQ(rec.events.back().e.type, TreeEvent::Type::kCleared);
  EXPECT_EQ(rec.events.back().e.remaining, 1u);
  ASSERT_TRUE((*tree)->Release(held->lease).ok());
  (*tree)->Clear();
  EXPECT_EQ(rec.events.back().e.remaining, 0u);
}

TEST(DumpTreePageTest, PagesCoverEveryNodeOnceInPageOrder) {
  auto tree = RadixTree::Create({.capacity_pages = 300});
  ASSERT_TRUE(tree.ok());
  auto ns = (*tree)->RegisterNamespace(Spec());
  ASSERT_TRUE(ns.ok());
  for (uint32_t i = 0; i < 60; ++i) {
    std::vector<uint32_t> p;
    for (uint32_t b = 0; b < 1 + i % 5; ++b) {
      for (uint32_t j = 0; j < kPage; ++j) p.push_back(b == 0 ? i % 7 : i * 10 + b);
    }
    Insert(**tree, *ns, p);
  }
  const auto all = (*tree)->DumpTree(~0u, ~0u);
  std::map<std::string, NodeInfo> want;
  for (const NodeInfo& n : all) want[n.key.ToCanonical()] = n;
  std::set<std::string> got;
  PageId start = 0, next = 0;
  PageId last_page = 0;
  int pages = 0;
  while (start < (*tree)->capacity()) {
    const auto page = (*tree)->DumpTreePage(~0u, start, 7, true, &next);
    ASSERT_GT(next, start);
    for (const NodeInfo& n : page) {
      EXPECT_TRUE(got.insert(n.key.ToCanonical()).second);
      EXPECT_GE(n.page, last_page);
      last_page = n.page;
      const NodeInfo& w = want.at(n.key.ToCanonical());
      EXPECT_EQ(n.depth, w.depth);
      EXPECT_EQ(n.parent_key, w.parent_key);
      EXPECT_EQ(n.tokens.size(), kPage);
    }
    start = next;
    ++pages;
  }
  EXPECT_EQ(got.size(), want.size());
  EXPECT_GT(pages, 5);
  // Depth filter, and a start past the end.
  for (const NodeInfo& n : (*tree)->DumpTreePage(0, 0, 1000, false, &next)) {
    EXPECT_EQ(n.depth, 0u);
    EXPECT_TRUE(n.tokens.empty());
  }
  EXPECT_TRUE((*tree)->DumpTreePage(~0u, 5000, 10, false, &next).empty());
  EXPECT_EQ(next, (*tree)->capacity());
}

BlockKey Key(uint64_t hi, uint64_t lo) {
  BlockKey k;
  k.hi = hi;
  k.lo = lo;
  return k;
}

msgpack::object_handle Unpack(const std::string& s) {
  return msgpack::unpack(s.data(), s.size());
}

// The map's value under `key` (nil object when absent).
msgpack::object Field(const msgpack::object& map, const std::string& key) {
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    if (map.via.map.ptr[i].key.as<std::string>() == key) {
      return map.via.map.ptr[i].val;
    }
  }
  return msgpack::object();
}

TEST(EncodeTest, RunsBecomeEventsInVllmShape) {
  std::vector<KvRecord> r(6);
  std::vector<uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const BlockKey root = Key(9, 9), a = Key(1, 0xfffffffffffffff1ull),
                 b = Key(2, 22), c = Key(3, 33);
  r[0] = {KvRecord::Kind::kStored, 0, 0, kPage, a, root, 0, kPage};
  r[1] = {KvRecord::Kind::kStored, 0, 1, kPage, b, a, 4, kPage};
  r[2] = {KvRecord::Kind::kStored, 0, 1, kPage, c, a, 0, 0};  // not chained to b
  r[3] = {KvRecord::Kind::kRemoved, 0, 0, 0, a};
  r[4] = {KvRecord::Kind::kRemoved, 0, 0, 0, b};
  r[5] = {KvRecord::Kind::kCleared};
  EXPECT_EQ(CountKvEvents(r), 4u);
  const std::string lora = "ad";
  KvEncodeOptions o;
  o.medium = "GPU";
  const std::string payload = EncodeKvEventBatch(
      o, 12.5, r, tokens, [&](const BlockKey&) { return &lora; });
  auto h = Unpack(payload);
  const msgpack::object& batch = h.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_EQ(batch.via.array.ptr[0].as<double>(), 12.5);
  EXPECT_EQ(batch.via.array.ptr[2].as<int>(), 0);
  const msgpack::object& ev = batch.via.array.ptr[1];
  ASSERT_EQ(ev.via.array.size, 4u);
  const msgpack::object& s0 = ev.via.array.ptr[0];
  EXPECT_EQ(Field(s0, "type").as<std::string>(), "BlockStored");
  EXPECT_EQ(Field(s0, "block_hashes").as<std::vector<uint64_t>>(),
            (std::vector<uint64_t>{0xfffffffffffffff1ull, 22}));
  EXPECT_TRUE(Field(s0, "parent_block_hash").is_nil());
  EXPECT_EQ(Field(s0, "token_ids").as<std::vector<uint32_t>>(), tokens);
  EXPECT_EQ(Field(s0, "block_size").as<uint32_t>(), kPage);
  EXPECT_TRUE(Field(s0, "lora_id").is_nil());
  EXPECT_EQ(Field(s0, "medium").as<std::string>(), "GPU");
  EXPECT_EQ(Field(s0, "lora_name").as<std::string>(), "ad");
  const msgpack::object& s1 = ev.via.array.ptr[1];
  EXPECT_EQ(Field(s1, "parent_block_hash").as<uint64_t>(), a.lo);
  EXPECT_TRUE(Field(s1, "token_ids").via.array.size == 0);
  const msgpack::object& rm = ev.via.array.ptr[2];
  EXPECT_EQ(Field(rm, "type").as<std::string>(), "BlockRemoved");
  EXPECT_EQ(Field(rm, "block_hashes").via.array.size, 2u);
  EXPECT_EQ(Field(ev.via.array.ptr[3], "type").as<std::string>(),
            "AllBlocksCleared");

  // Bytes hashes and the positional form.
  o.hash = KvHashForm::kBytes;
  o.encoding = KvEventEncoding::kArray;
  auto h2 = Unpack(EncodeKvEventBatch(o, 1.0, absl::MakeSpan(r).first(1),
                                      tokens, [](const BlockKey&) {
                                        return static_cast<const std::string*>(
                                            nullptr);
                                      }));
  const msgpack::object& e0 = h2.get().via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(e0.type, msgpack::type::ARRAY);
  ASSERT_EQ(e0.via.array.size, 8u);
  EXPECT_EQ(e0.via.array.ptr[0].as<std::string>(), "BlockStored");
  const msgpack::object& hash = e0.via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(hash.type, msgpack::type::BIN);
  EXPECT_EQ(std::string(hash.via.bin.ptr, hash.via.bin.size), a.ToCanonical());
  EXPECT_TRUE(e0.via.array.ptr[7].is_nil());  // lora_name
}

TEST(EncodeTest, TokenIdsOfEveryWidthRoundTrip) {
  const std::vector<uint32_t> tokens = {0,     127,   128,        255,
                                        256,   65535, 65536,      0x7fffffff,
                                        1u << 31, 0xffffffff, 5, 300};
  std::vector<KvRecord> r(3);
  for (int i = 0; i < 3; ++i) {
    r[i].kind = KvRecord::Kind::kStored;
    r[i].depth = i;
    r[i].block_size = kPage;
    r[i].key = Key(0, i + 1);
    r[i].parent_key = Key(0, i);
    r[i].token_offset = 4 * i;
    r[i].token_count = kPage;
  }
  auto h = Unpack(EncodeKvEventBatch(KvEncodeOptions(), 0.5, r, tokens,
                                     [](const BlockKey&) {
                                       return static_cast<const std::string*>(
                                           nullptr);
                                     }));
  const msgpack::object& ev = h.get().via.array.ptr[1];
  ASSERT_EQ(ev.via.array.size, 1u);
  EXPECT_EQ(Field(ev.via.array.ptr[0], "token_ids").as<std::vector<uint32_t>>(),
            tokens);
}

TEST(EncodeTest, ParseFlags) {
  EXPECT_EQ(*ParseKvHashForm("bytes", "f"), KvHashForm::kBytes);
  EXPECT_FALSE(ParseKvHashForm("sha", "kv_events_hash").ok());
  EXPECT_EQ(*ParseKvEventEncoding("array", "f"), KvEventEncoding::kArray);
  EXPECT_FALSE(ParseKvEventEncoding("json", "f").ok());
  EXPECT_EQ(*ParseKvMediaNames("vllm", "f"), KvMediaNames::kVllm);
  EXPECT_EQ(*ParseKvMediaNames("radixkv", "f"), KvMediaNames::kRadixkv);
  const absl::Status bad = ParseKvMediaNames("VLLM", "kv_events_media").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(bad.message());
  for (const char* want : {"--kv_events_media=VLLM", "expected vllm", "radixkv"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
}

// The medium of `kind`'s blocks under `media`, below a cuda pool or a host
// pool.
std::string EventMedium(TierKind kind, KvMediaNames media, bool host_pool) {
  KvEncodeOptions o;
  o.media = media;
  o.medium = host_pool ? "CPU" : "GPU";
  o.pool_is_host = host_pool;
  return std::string(o.MediumName(TierKindInfoOf(kind).medium));
}

TEST(EncodeTest, MediaNames) {
  using M = KvMediaNames;
  KvEncodeOptions o;  // the default is vLLM's names
  EXPECT_EQ(o.media, M::kVllm);
  o.medium = "GPU";
  EXPECT_EQ(o.MediumName(kMediumPool), "GPU");
  EXPECT_EQ(o.MediumName(200), "GPU");  // no tier kind: the pool's
  // vLLM's names: its CPU offloading tier, its storage tier.
  EXPECT_EQ(EventMedium(TierKind::kHost, M::kVllm, false), "CPU");
  EXPECT_EQ(EventMedium(TierKind::kHost, M::kVllm, true), "CPU_TIER1");
  EXPECT_EQ(EventMedium(TierKind::kDisk, M::kVllm, false), "STORAGE");
  EXPECT_EQ(EventMedium(TierKind::kDisk, M::kVllm, true), "STORAGE");
  // radixkv's own names.
  EXPECT_EQ(EventMedium(TierKind::kHost, M::kRadixkv, false), "CPU");
  EXPECT_EQ(EventMedium(TierKind::kHost, M::kRadixkv, true), "CPU_TIER");
  EXPECT_EQ(EventMedium(TierKind::kDisk, M::kRadixkv, false), "DISK");
  EXPECT_EQ(EventMedium(TierKind::kDisk, M::kRadixkv, true), "DISK");
  // Every kind, in both namings: a name of its own, never the pool's
  // below a host pool (a router keeps one index per medium).
  for (const TierKindInfo& k : kTierKinds) {
    for (M media : {M::kVllm, M::kRadixkv}) {
      for (bool host_pool : {false, true}) {
        const std::string m = EventMedium(k.kind, media, host_pool);
        EXPECT_FALSE(m.empty()) << k.name;
        EXPECT_NE(m, host_pool ? "CPU" : "GPU") << k.name;
      }
    }
    EXPECT_EQ(EventMedium(k.kind, M::kRadixkv, false), k.event_medium);
    EXPECT_EQ(EventMedium(k.kind, M::kRadixkv, true),
              k.event_medium_under_host_pool);
  }
  // The remote tier, where this build has one.
  TierKind remote;
  if (ParseTierKind("remote", &remote)) {
    EXPECT_EQ(EventMedium(remote, M::kVllm, false), "EXTERNAL");
    EXPECT_EQ(EventMedium(remote, M::kRadixkv, false), "REMOTE");
  }
}

uint64_t Seq(const zmq::message_t& m) {
  uint64_t v = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    v = (v << 8) | static_cast<const uint8_t*>(m.data())[i];
  }
  return v;
}

TEST(PublisherTest, SequenceFromZeroAndASkippedNumberAtTheQueueBound) {
  const std::string ep = absl::StrCat("ipc:///tmp/rkv_evtest_", getpid());
  KvEventsOptions o;
  o.endpoint = ep + ".pub";
  o.replay_endpoint = ep + ".rep";
  o.topic = "kv@node@m";
  auto pub = KvEventPublisher::Start(o, nullptr);
  ASSERT_TRUE(pub.ok()) << pub.status();
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv@");
  sub.set(zmq::sockopt::rcvtimeo, 10000);
  sub.connect(o.endpoint);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  TreeEvent stored;
  stored.type = TreeEvent::Type::kStored;
  stored.key = Key(1, 2);
  stored.block_size = kPage;
  const uint32_t toks[kPage] = {7, 7, 7, 7};
  stored.tokens = toks;
  (*pub)->OnTreeEvents({&stored, 1});
  // The start's AllBlocksCleared (0) reaches the subscriber too when the
  // publisher sent it after the subscription took effect: skip it.
  std::vector<zmq::message_t> parts;
  do {
    parts.clear();
    for (int i = 0; i < 3; ++i) {
      zmq::message_t m;
      ASSERT_TRUE(sub.recv(m));
      parts.push_back(std::move(m));
    }
  } while (Seq(parts[1]) == 0);
  EXPECT_EQ(parts[0].to_string(), o.topic);
  EXPECT_EQ(Seq(parts[1]), 1u);  // 0 is the start's AllBlocksCleared
  EXPECT_EQ((*pub)->next_seq(), 2u);

  // Replay from 0: both batches, then the empty end marker.
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 10000);
  dealer.connect(o.replay_endpoint);
  const std::string zero(8, '\0');
  dealer.send(zmq::buffer(std::string()), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(zero), zmq::send_flags::none);
  std::vector<uint64_t> seqs;
  while (true) {
    zmq::message_t delim, seq, payload;
    ASSERT_TRUE(dealer.recv(delim));
    ASSERT_TRUE(dealer.recv(seq));
    ASSERT_TRUE(dealer.recv(payload));
    if (seq.to_string() == std::string(8, '\xff')) {
      EXPECT_EQ(payload.size(), 0u);
      break;
    }
    seqs.push_back(Seq(seq));
  }
  EXPECT_EQ(seqs, (std::vector<uint64_t>{0, 1}));
  (*pub)->Stop();
  (*pub)->OnTreeEvents({&stored, 1});  // ignored after Stop
  EXPECT_EQ((*pub)->stats().batches, 2u);
}

TEST(PublisherTest, OverflowSkipsOneNumber) {
  const std::string ep = absl::StrCat("ipc:///tmp/rkv_evtest2_", getpid());
  KvEventsOptions o;
  o.endpoint = ep + ".pub";
  o.queue_bytes = 1;  // nothing fits: every batch of events is dropped
  auto pub = KvEventPublisher::Start(o, nullptr);
  ASSERT_TRUE(pub.ok()) << pub.status();
  for (int i = 0; i < 50 && (*pub)->next_seq() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (*pub)->Stop();
  const KvEventsStats s = (*pub)->stats();
  EXPECT_EQ(s.batches, 0u);
  EXPECT_EQ(s.skipped_seqs, 1u);
  EXPECT_EQ(s.dropped_blocks, 1u);
  EXPECT_EQ((*pub)->next_seq(), 1u);
}

TEST(PublisherTest, BadEndpointsAreNamed) {
  KvEventsOptions o;
  o.endpoint = "udp://x";
  auto p = KvEventPublisher::Start(o, nullptr);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(p.status()));
  EXPECT_NE(p.status().message().find("--kv_events_endpoint"), std::string::npos);
  o.endpoint = "tcp://not a host";
  p = KvEventPublisher::Start(o, nullptr);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("--kv_events_endpoint"), std::string::npos);
}

}  // namespace
}  // namespace radixkv::daemon
