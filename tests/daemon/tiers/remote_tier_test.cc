// RemoteTier (daemon/tiers/remote_tier.h) and RedisCluster
// (daemon/tiers/redis_cluster.h) against a real three-shard Redis Cluster
// (tests/daemon/tiers/redis_store.py, started by ctest's remote_store
// fixture, whose directory RADIXKV_TEST_REDIS names): slots, redirections,
// credentials, the value check, namespace scoping, and the circuit breaker
// against a store that does not answer.
#include "daemon/tiers/remote_tier.h"

#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "daemon/tiers/redis_cluster.h"
#include "daemon/tiers/tier_chain.h"
#include "daemon/tiers/tier_spec.h"
#include "gmock/gmock.h"
#include "gpu/pool.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kPageBytes = 4096;

BlockKey Key(uint64_t i) { return BlockKey{0x7e40000000000000ull + i, ~i}; }
const BlockKey kRoot{0x1111, 0x2222};
const BlockKey kOtherRoot{0x3333, 0x4444};

TierBlock Block(uint64_t i, const BlockKey& root = kRoot) {
  return TierBlock{.key = Key(i), .parent_key = i == 0 ? root : Key(i - 1),
                   .root = root, .depth = static_cast<uint32_t>(i),
                   .block_size = 16};
}

TEST(RedisKeySlot, MatchesRedisCluster) {
  // CLUSTER KEYSLOT's answers.
  EXPECT_EQ(RedisKeySlot("foo"), 12182);
  EXPECT_EQ(RedisKeySlot("123456789"), 0x31c3 & 16383);
  EXPECT_EQ(RedisKeySlot("{user1000}.following"),
            RedisKeySlot("{user1000}.followers"));
  EXPECT_EQ(RedisKeySlot("foo{}bar"), RedisKeySlot("foo{}bar"));
  EXPECT_NE(RedisKeySlot("foo{}bar"), RedisKeySlot(""));
}

TEST(ParseRedisEndpoint, HostPortAndErrors) {
  auto e = ParseRedisEndpoint("10.0.0.5:7000");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "10.0.0.5");
  EXPECT_EQ(e->port, 7000);
  e = ParseRedisEndpoint("[::1]:6379");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->ToString(), "[::1]:6379");
  EXPECT_THAT(std::string(ParseRedisEndpoint("host").status().message()),
              HasSubstr("HOST:PORT"));
  EXPECT_THAT(std::string(ParseRedisEndpoint("{:1]:1]:9").status().message()),
              HasSubstr("is not a host name or address"));
  EXPECT_THAT(std::string(ParseRedisEndpoint("[::1:9").status().message()),
              HasSubstr("[ADDRESS]:PORT"));
  EXPECT_THAT(std::string(ParseRedisEndpoint("[host]:9").status().message()),
              HasSubstr("is not a host name or address"));
  EXPECT_THAT(std::string(ParseRedisEndpoint("host:0").status().message()),
              HasSubstr("1..65535"));
  EXPECT_THAT(std::string(ParseRedisEndpoint("host:99999").status().message()),
              HasSubstr("1..65535"));
}

TEST(RemoteTierSpec, KeysAndErrorsNameTheKey) {
  auto s = ParseTierSpecs(
      "host,bytes=1MiB;remote,addr=127.0.0.1:7000,addr=[::1]:7001,prefix=fleet-a,"
      "timeout=20ms,ttl=1h,queue=8MiB,writers=3,breaker_failures=2,"
      "breaker_cooldown=250ms,user=rkv,password_file=/etc/radixkv/store.pw,"
      "write=all");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 2u);
  const TierSpec& r = (*s)[1];
  EXPECT_EQ(r.kind, TierKind::kRemote);
  ASSERT_EQ(r.addrs.size(), 2u);
  EXPECT_EQ(r.addrs[1].port, 7001);
  EXPECT_EQ(r.prefix, "fleet-a");
  EXPECT_EQ(r.timeout, absl::Milliseconds(20));
  EXPECT_EQ(r.ttl, absl::Hours(1));
  EXPECT_EQ(r.queue_bytes, 8u << 20);
  EXPECT_EQ(r.writers, 3);
  EXPECT_EQ(r.breaker_failures, 2);
  EXPECT_EQ(r.breaker_cooldown, absl::Milliseconds(250));
  EXPECT_EQ(r.user, "rkv");
  EXPECT_EQ(r.password_file, "/etc/radixkv/store.pw");
  EXPECT_TRUE(r.write_all);

  const std::pair<const char*, const char*> bad[] = {
      {"remote", "remote: addr=HOST:PORT is required"},
      {"remote,addr=nohost", "remote: addr=\"nohost\": expected HOST:PORT"},
      {"remote,addr=h:1,timeout=0ms", "remote: timeout=0ms is not a duration in 1ms..60s"},
      {"remote,addr=h:1,timeout=fast", "remote: timeout=fast"},
      {"remote,addr=h:1,prefix=a:b", "remote: prefix=a:b is not 1..64"},
      {"remote,addr=h:1,writers=0", "remote: writers=0 is not in 1..16"},
      {"remote,addr=h:1,queue=0", "remote: queue=0 is not a size > 0"},
      {"remote,addr=h:1,breaker_failures=0", "breaker_failures=0 is not in 1..1000"},
      {"remote,addr=h:1,bogus=1", "remote: unknown key 'bogus'"},
      {"remote,addr=h:1,bytes=1GiB", "remote: unknown key 'bytes'"},
      {"remote,addr=h:1,write=some", "remote: write=some is not evicted or all"},
      {"remote,addr=h:1,tls=maybe", "remote: tls=maybe is not on or off"},
      {"remote,addr=h:1,tls_ca=", "remote: tls_ca is empty"},
      {"remote,addr=h:1;host,bytes=1MiB", "a host tier goes above a remote tier"},
      {"remote,addr=h:1;remote,addr=h:2", "names the same kind of tier twice"},
  };
  for (const auto& [spec, want] : bad) {
    auto r = ParseTierSpecs(spec);
    ASSERT_FALSE(r.ok()) << spec;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(want)) << spec;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--tier=")) << spec;
  }
}

TEST(RemoteTierValue, CheckRefusesEveryDamage) {
  std::string data(kPageBytes, 'x');
  const std::string v = RemoteTier::EncodeValue(Block(3), data.data(), kPageBytes);
  ASSERT_EQ(v.size(), kRemoteHeaderBytes + kPageBytes);
  TierBlock b;
  absl::string_view d;
  EXPECT_EQ(RemoteTier::CheckValue(v, kRoot, Key(3), kPageBytes, &b, &d),
            RemoteTier::Check::kOk);
  EXPECT_EQ(d, data);
  EXPECT_EQ(b.parent_key, Key(2));
  EXPECT_EQ(b.depth, 3u);
  using C = RemoteTier::Check;
  EXPECT_EQ(RemoteTier::CheckValue(v, kOtherRoot, Key(3), kPageBytes, &b, &d),
            C::kWrongBlock);
  EXPECT_EQ(RemoteTier::CheckValue(v, kRoot, Key(4), kPageBytes, &b, &d),
            C::kWrongBlock);
  EXPECT_EQ(RemoteTier::CheckValue(v, kRoot, Key(3), 2 * kPageBytes, &b, &d),
            C::kBadData);
  EXPECT_EQ(RemoteTier::CheckValue(v.substr(0, v.size() - 1), kRoot, Key(3),
                                   kPageBytes, &b, &d),
            C::kBadData);
  EXPECT_EQ(RemoteTier::CheckValue(v.substr(0, 50), kRoot, Key(3), kPageBytes,
                                   &b, &d),
            C::kBadHeader);
  std::string flipped = v;
  flipped[kRemoteHeaderBytes + 100] ^= 1;
  EXPECT_EQ(RemoteTier::CheckValue(flipped, kRoot, Key(3), kPageBytes, &b, &d),
            C::kBadData);
  flipped = v;
  flipped[60] ^= 1;  // block_size, under the header's own checksum
  EXPECT_EQ(RemoteTier::CheckValue(flipped, kRoot, Key(3), kPageBytes, &b, &d),
            C::kBadHeader);
}

// A port on loopback that accepts connections and never answers.
class SilentServer {
 public:
  SilentServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd_, 64);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~SilentServer() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu::PoolSpec spec;
    spec.backend = gpu::Backend::kHost;
    spec.bytes = 32 * kPageBytes;
    auto pool = gpu::CreatePagePool(spec, kPageBytes);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    prefix_ = absl::StrCat("rt", getpid(), "-",
                           ::testing::UnitTest::GetInstance()->random_seed(),
                           "-", absl::ToUnixNanos(absl::Now()));
  }

  // The fixture's store; skips when run outside ctest.
  bool Store(std::vector<RedisEndpoint>* seeds, std::string* password) {
    const char* dir = std::getenv("RADIXKV_TEST_REDIS");
    if (dir == nullptr || *dir == '\0') return false;
    std::ifstream addrs(absl::StrCat(dir, "/addrs"));
    std::string line;
    while (std::getline(addrs, line)) {
      if (line.empty()) continue;
      auto e = ParseRedisEndpoint(line);
      EXPECT_TRUE(e.ok()) << line;
      seeds->push_back(*e);
    }
    std::ifstream pw(absl::StrCat(dir, "/password"));
    std::getline(pw, *password);
    return !seeds->empty();
  }

  RemoteTierOptions Options(std::vector<RedisEndpoint> seeds,
                            std::string password) {
    return {.seeds = std::move(seeds),
            .auth = {.password = std::move(password)},
            .prefix = prefix_,
            .page_bytes = kPageBytes,
            .timeout = absl::Milliseconds(500)};
  }

  void FillPage(uint64_t page, unsigned char byte) {
    std::memset(pool_->host_page_address(page), byte, kPageBytes);
  }
  unsigned char* Page(uint64_t page) {
    return static_cast<unsigned char*>(pool_->host_page_address(page));
  }

  std::unique_ptr<gpu::PagePool> pool_;
  std::string prefix_;
};

class NullSinkForTest final : public TierSink {
 public:
  bool empty() const override { return true; }
  void Put(absl::Span<const TierPut>, std::vector<TierMove>*) override {}
};

#define REQUIRE_STORE(seeds, pw)                                         \
  if (!Store(&seeds, &pw)) {                                             \
    GTEST_SKIP() << "no store: run through ctest (fixture remote_store)"; \
  }

TEST_F(RemoteTierTest, ClusterRoutesEverySlotAndFollowsRedirections) {
  std::vector<RedisEndpoint> seeds;
  std::string pw;
  REQUIRE_STORE(seeds, pw);
  // One seed is enough: the slot map names the other shards.
  RedisCluster c({.seeds = {seeds[0]}, .auth = {.password = pw}});
  ASSERT_TRUE(c.Connect(absl::Now() + absl::Seconds(5)).ok());
  EXPECT_TRUE(c.cluster_mode());
  EXPECT_EQ(c.node_count(), 3u);
  std::vector<std::string> keys, values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back(absl::StrCat(prefix_, ":k", i));
    values.push_back(absl::StrCat("v", i));
  }
  std::vector<RedisCluster::Command> set, get;
  for (int i = 0; i < 300; ++i) {
    set.push_back({.argv = {"SET", keys[i], values[i]}, .key = keys[i]});
    get.push_back({.argv = {"GET", keys[i]}, .key = keys[i]});
  }
  std::vector<RedisCluster::Result> out;
  c.Run(set, absl::Now() + absl::Seconds(5), &out);
  for (const auto& r : out) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    ASSERT_EQ(r.reply.type, RedisReply::Type::kStatus) << r.reply.str;
  }
  // A client whose slot map is wrong (every slot on one shard) is sent on
  // by MOVED and still answers every key.
  RedisCluster wrong({.seeds = {seeds[1]}, .auth = {.password = pw}});
  wrong.Run(get, absl::Now() + absl::Seconds(5), &out);
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(out[i].status.ok()) << out[i].status;
    EXPECT_EQ(out[i].reply.str, values[i]);
  }
}

// redis-cli's answer to `args` on node `e` (the fixture's password).
std::string Cli(const RedisEndpoint& e, const std::string& pw,
                const std::string& args) {
  const std::string cmd =
      absl::StrCat("REDISCLI_AUTH=", pw, " redis-cli --no-auth-warning -h ",
                   e.host, " -p ", e.port, " ", args, " 2>&1");
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

TEST_F(RemoteTierTest, ASlotMovingMidRunIsFollowedByAskThenMoved) {
  std::vector<RedisEndpoint> seeds;
  std::string pw;
  REQUIRE_STORE(seeds, pw);
  RedisCluster c({.seeds = {seeds[0]}, .auth = {.password = pw}});
  ASSERT_TRUE(c.Connect(absl::Now() + absl::Seconds(5)).ok());
  const std::string key = absl::StrCat(prefix_, ":moving");
  const uint16_t slot = RedisKeySlot(key);
  std::vector<RedisCluster::Result> out;
  c.Run({{.argv = {"SET", key, "payload"}, .key = key}},
        absl::Now() + absl::Seconds(5), &out);
  ASSERT_TRUE(out[0].status.ok()) << out[0].status;
  ASSERT_EQ(out[0].reply.type, RedisReply::Type::kStatus) << out[0].reply.str;
  // Which shard holds the slot, and another to move it to. Every shard's
  // answer goes into the failure message.
  const RedisEndpoint* src = nullptr;
  const RedisEndpoint* dst = nullptr;
  std::string answers;
  for (const RedisEndpoint& e : seeds) {
    const std::string n = Cli(e, pw, absl::StrCat("CLUSTER COUNTKEYSINSLOT ", slot));
    absl::StrAppend(&answers, e.host, ":", e.port, " -> '", n, "'; ");
    if (!n.empty() && n != "0" && n.find_first_not_of("0123456789") == std::string::npos) {
      src = &e;
    }
  }
  ASSERT_NE(src, nullptr) << "slot " << slot << ": " << answers;
  // Every key in the slot moves with it (other tests' keys may share it).
  const std::string keys = absl::StrJoin(
      absl::StrSplit(Cli(*src, pw, absl::StrCat("CLUSTER GETKEYSINSLOT ", slot, " 100000")),
                     '\n', absl::SkipEmpty()),
      " ");
  ASSERT_THAT(keys, ::testing::HasSubstr(key));
  for (const RedisEndpoint& e : seeds) {
    if (!(e == *src)) dst = &e;
  }
  const std::string src_id = Cli(*src, pw, "CLUSTER MYID");
  const std::string dst_id = Cli(*dst, pw, "CLUSTER MYID");
  ASSERT_EQ(Cli(*dst, pw, absl::StrCat("CLUSTER SETSLOT ", slot, " IMPORTING ", src_id)), "OK");
  ASSERT_EQ(Cli(*src, pw, absl::StrCat("CLUSTER SETSLOT ", slot, " MIGRATING ", dst_id)), "OK");
  ASSERT_EQ(Cli(*src, pw, absl::StrCat("MIGRATE ", dst->host, " ", dst->port,
                                       " \"\" 0 5000 AUTH ", pw, " KEYS ", keys)),
            "OK");
  // Mid-migration: the old owner answers ASK; the client asks the new one.
  c.Run({{.argv = {"GET", key}, .key = key}}, absl::Now() + absl::Seconds(5), &out);
  ASSERT_TRUE(out[0].status.ok()) << out[0].status;
  EXPECT_EQ(out[0].reply.str, "payload");
  // Done: every node learns the new owner; the old one answers MOVED.
  for (const RedisEndpoint& e : seeds) {
    EXPECT_EQ(Cli(e, pw, absl::StrCat("CLUSTER SETSLOT ", slot, " NODE ", dst_id)), "OK");
  }
  c.Run({{.argv = {"GET", key}, .key = key}}, absl::Now() + absl::Seconds(5), &out);
  ASSERT_TRUE(out[0].status.ok()) << out[0].status;
  EXPECT_EQ(out[0].reply.str, "payload");
  // And back, so that the fixture's layout is as it was.
  for (const RedisEndpoint& e : seeds) {
    Cli(e, pw, absl::StrCat("CLUSTER SETSLOT ", slot, " STABLE"));
  }
  ASSERT_EQ(Cli(*src, pw, absl::StrCat("CLUSTER SETSLOT ", slot, " IMPORTING ", dst_id)), "OK");
  ASSERT_EQ(Cli(*dst, pw, absl::StrCat("CLUSTER SETSLOT ", slot, " MIGRATING ", src_id)), "OK");
  EXPECT_EQ(Cli(*dst, pw, absl::StrCat("MIGRATE ", src->host, " ", src->port,
                                       " \"\" 0 5000 AUTH ", pw, " KEYS ", keys)),
            "OK");
  for (const RedisEndpoint& e : seeds) {
    EXPECT_EQ(Cli(e, pw, absl::StrCat("CLUSTER SETSLOT ", slot, " NODE ", src_id)), "OK");
  }
}

TEST_F(RemoteTierTest, AUserLimitedToItsPrefixAndCommandsIsEnough) {
  std::vector<RedisEndpoint> seeds;
  std::string pw;
  REQUIRE_STORE(seeds, pw);
  // The ACL docs/OPERATIONS.md recommends, on every shard.
  const std::string user = absl::StrCat("rkv", getpid());
  for (const RedisEndpoint& e : seeds) {
    ASSERT_EQ(Cli(e, pw, absl::StrCat("ACL SETUSER ", user, " on '>userpw' '~",
                                      prefix_, ":*' +get +set +exists "
                                      "'+cluster|slots' +asking +ping")),
              "OK");
  }
  RemoteTierOptions o = Options(seeds, "userpw");
  o.auth.user = user;
  auto opened = RemoteTier::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<RemoteTier> remote = *std::move(opened);
  auto mover = PageMover::Create(pool_.get());
  ASSERT_TRUE(mover.ok());
  FillPage(0, 0x33);
  std::vector<TierMove> moves;
  NullSinkForTest below;
  remote->Put({{.block = Block(0), .page = 0}}, **mover, below, &moves);
  remote->Flush();
  EXPECT_EQ(remote->stats().demotions, 1u);
  EXPECT_EQ(remote->stats().write_errors, 0u);
  FillPage(9, 0);
  const BlockKey keys[] = {Key(0)};
  const uint64_t pages[] = {9};
  EXPECT_EQ(remote->CountPresentIn(kRoot, keys), 1u);
  ASSERT_EQ(remote->TakeIn(kRoot, keys, pages, **mover, &moves), 1u);
  EXPECT_EQ(Page(9)[17], 0x33);
  // Outside its prefix the same user is refused: the ACL holds.
  RedisCluster c({.seeds = seeds, .auth = {.user = user, .password = "userpw"}});
  std::vector<RedisCluster::Result> out;
  c.Run({{.argv = {"SET", "elsewhere", "x"}, .key = "elsewhere"}},
        absl::Now() + absl::Seconds(5), &out);
  ASSERT_TRUE(out[0].status.ok());
  EXPECT_EQ(out[0].reply.type, RedisReply::Type::kError);
  EXPECT_THAT(out[0].reply.str, HasSubstr("NOPERM"));
  for (const RedisEndpoint& e : seeds) Cli(e, pw, absl::StrCat("ACL DELUSER ", user));
}

TEST_F(RemoteTierTest, WrongPasswordIsAConfigurationError) {
  std::vector<RedisEndpoint> seeds;
  std::string pw;
  REQUIRE_STORE(seeds, pw);
  auto t = RemoteTier::Open(Options(seeds, "not-the-password"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("refused AUTH"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(seeds[0].ToString()));
}

TEST_F(RemoteTierTest, BlocksGoToTheStoreAndComeBackByteForByte) {
  std::vector<RedisEndpoint> seeds;
  std::string pw;
  REQUIRE_STORE(seeds, pw);
  auto opened = RemoteTier::Open(Options(seeds, pw));
  ASSERT_TRUE(opened.ok()) << opened.status();
  RemoteTier* remote = opened->get();
  std::vector<std::unique_ptr<Tier>> tiers;
  tiers.push_back(*std::move(opened));
  TierChain chain(std::move(tiers));
  ASSERT_TRUE(chain.AttachPool(pool_.get()).ok());

  std::vector<EvictedPage> evicted;
  for (uint64_t i = 0; i < 8; ++i) {
    FillPage(i, static_cast<unsigned char>(0x40 + i));
    evicted.push_back({.block = Block(i), .page = i, .ns = 1});
  }
  std::vector<TierMove> moves;
  chain.Demote(evicted, &moves);
  EXPECT_TRUE(moves.empty());  // a shared tier's moves are no node's events
  remote->Flush();
  TierStats s = remote->stats();
  EXPECT_EQ(s.demotions, 8u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_FALSE(s.unavailable);

  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 10; ++i) keys.push_back(Key(i));
  // Without its namespace the store is not asked; in another namespace
  // nothing is found.
  EXPECT_EQ(chain.CountPresent(keys), 0u);
  EXPECT_EQ(chain.CountPresent(keys, nullptr, &kOtherRoot), 0u);
  std::array<size_t, kMediumCount> by{};
  EXPECT_EQ(chain.CountPresent(keys, &by, &kRoot), 8u);
  EXPECT_EQ(by[kMediumRemoteTier], 8u);

  std::vector<uint64_t> pages;
  for (uint64_t i = 0; i < 10; ++i) pages.push_back(16 + i);
  for (uint64_t p : pages) FillPage(p, 0);
  EXPECT_EQ(chain.Promote(keys, pages, &moves, &kOtherRoot), 0u);
  for (uint64_t p : pages) ASSERT_EQ(Page(p)[0], 0) << "another namespace's bytes";
  ASSERT_EQ(chain.Promote(keys, pages, &moves, &kRoot), 8u);
  for (uint64_t i = 0; i < 8; ++i) {
    for (uint64_t b = 0; b < kPageBytes; b += 511) {
      ASSERT_EQ(Page(16 + i)[b], 0x40 + i) << i;
    }
  }
  // Shared: still there for the next node.
  EXPECT_EQ(chain.CountPresent(keys, nullptr, &kRoot), 8u);
  s = remote->stats();
  EXPECT_EQ(s.promotions, 8u);
  EXPECT_EQ(s.bytes_read, 8 * kPageBytes);
  // Takes that stopped at an absent key: the other namespace's, then Key(8)
  // twice (the chain asks again from where the first take stopped).
  EXPECT_EQ(s.misses, 3u);
}

TEST_F(RemoteTierTest, CorruptTruncatedOrForeignValuesAreMisses) {
  std::vector<RedisEndpoint> seeds;
  std::string pw;
  REQUIRE_STORE(seeds, pw);
  auto opened = RemoteTier::Open(Options(seeds, pw));
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<RemoteTier> remote = *std::move(opened);
  auto mover = PageMover::Create(pool_.get());
  ASSERT_TRUE(mover.ok());
  RedisCluster c({.seeds = seeds, .auth = {.password = pw}});
  std::string data(kPageBytes, 'd');
  const std::string good = RemoteTier::EncodeValue(Block(0), data.data(), kPageBytes);
  std::string corrupt = good;
  corrupt[kRemoteHeaderBytes + 7] ^= 0x20;
  // Key(0): good; Key(1): corrupt; Key(2): truncated; Key(3): the value
  // of another namespace's block stored under this namespace's key.
  const std::string values[] = {
      good, RemoteTier::EncodeValue(Block(1), data.data(), kPageBytes),
      RemoteTier::EncodeValue(Block(2), data.data(), kPageBytes),
      RemoteTier::EncodeValue(Block(3, kOtherRoot), data.data(), kPageBytes)};
  std::vector<std::string> names;
  for (uint64_t i = 0; i < 4; ++i) names.push_back(remote->StoreKey(kRoot, Key(i)));
  std::string v1 = values[1];
  v1[kRemoteHeaderBytes + 7] ^= 0x20;
  const std::string v2 = values[2].substr(0, values[2].size() - 100);
  std::vector<RedisCluster::Command> set = {
      {.argv = {"SET", names[0], values[0]}, .key = names[0]},
      {.argv = {"SET", names[1], v1}, .key = names[1]},
      {.argv = {"SET", names[2], v2}, .key = names[2]},
      {.argv = {"SET", names[3], values[3]}, .key = names[3]}};
  std::vector<RedisCluster::Result> out;
  c.Run(set, absl::Now() + absl::Seconds(5), &out);
  for (const auto& r : out) ASSERT_TRUE(r.status.ok()) << r.status;

  std::vector<TierMove> moves;
  const uint64_t pages[] = {20, 21};
  for (uint64_t i = 1; i < 4; ++i) {
    FillPage(20, 0);
    FillPage(21, 0);
    // Block 0 then the bad one: only block 0 arrives.
    const BlockKey ks[] = {Key(0), Key(i)};
    EXPECT_EQ(remote->TakeIn(kRoot, ks, pages, **mover, &moves), 1u) << i;
    EXPECT_EQ(Page(20)[0], 'd');
    EXPECT_EQ(Page(21)[0], 0) << "bytes of a value that failed its check";
  }
  EXPECT_EQ(remote->stats().checksum_failures, 3u);
  EXPECT_EQ(remote->stats().promotions, 3u);
}

TEST_F(RemoteTierTest, TlsToAServerWithoutClusterModeAndAnUntrustedOne) {
  const char* dir = std::getenv("RADIXKV_TEST_REDIS");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "run through ctest";
  std::ifstream in(absl::StrCat(dir, "/tls_addr"));
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  auto addr = ParseRedisEndpoint(line);
  ASSERT_TRUE(addr.ok());
  auto ctx = MakeRedisTlsContext(absl::StrCat(dir, "/ca.crt"), "", "");
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  RemoteTierOptions o = Options({*addr}, "");
  o.tls = {.ctx = *ctx};
  auto opened = RemoteTier::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<RemoteTier> remote = *std::move(opened);
  auto mover = PageMover::Create(pool_.get());
  ASSERT_TRUE(mover.ok());
  FillPage(0, 0x5a);
  FillPage(1, 0xa5);
  std::vector<TierMove> moves;
  NullSinkForTest below;
  remote->Put({{.block = Block(0), .page = 0}, {.block = Block(1), .page = 1}},
              **mover, below, &moves);
  remote->Flush();
  EXPECT_EQ(remote->stats().demotions, 2u);
  FillPage(8, 0);
  FillPage(9, 0);
  const BlockKey keys[] = {Key(0), Key(1)};
  const uint64_t pages[] = {8, 9};
  ASSERT_EQ(remote->TakeIn(kRoot, keys, pages, **mover, &moves), 2u);
  EXPECT_EQ(Page(8)[100], 0x5a);
  EXPECT_EQ(Page(9)[4000], 0xa5);

  // A store whose certificate this CA did not sign is never talked to.
  auto other = MakeRedisTlsContext(absl::StrCat(dir, "/other-ca.crt"), "", "");
  ASSERT_TRUE(other.ok());
  RedisCluster untrusted({.seeds = {*addr}, .tls = {.ctx = *other}});
  absl::Status s = untrusted.Connect(absl::Now() + absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("certificate"));
  // Nor one whose name is not the certificate's.
  RedisCluster misnamed({.seeds = {*addr},
                         .tls = {.ctx = *ctx, .server_name = "store.example"}});
  EXPECT_FALSE(misnamed.Connect(absl::Now() + absl::Seconds(5)).ok());
  // And plain TCP to a TLS port fails, never hangs past the deadline.
  RedisCluster plain({.seeds = {*addr}});
  EXPECT_FALSE(plain.Connect(absl::Now() + absl::Milliseconds(500)).ok());

  EXPECT_THAT(std::string(MakeRedisTlsContext("/nonexistent.crt", "", "")
                              .status().message()),
              HasSubstr("tls_ca=/nonexistent.crt"));
  EXPECT_THAT(std::string(MakeRedisTlsContext("", "/x.crt", "")
                              .status().message()),
              HasSubstr("go together"));
}

TEST_F(RemoteTierTest, TlsToAClusterRoutesEverySlotOverTls) {
  const char* dir = std::getenv("RADIXKV_TEST_REDIS");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "run through ctest";
  std::vector<RedisEndpoint> seeds;
  std::ifstream in(absl::StrCat(dir, "/tls_cluster_addrs"));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) seeds.push_back(*ParseRedisEndpoint(line));
  }
  ASSERT_EQ(seeds.size(), 3u);
  std::string pw;
  std::ifstream(absl::StrCat(dir, "/password")) >> pw;
  auto ctx = MakeRedisTlsContext(absl::StrCat(dir, "/ca.crt"), "", "");
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  RemoteTierOptions o = Options({seeds[0]}, pw);
  o.tls = {.ctx = *ctx};
  auto opened = RemoteTier::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<RemoteTier> remote = *std::move(opened);
  auto mover = PageMover::Create(pool_.get());
  ASSERT_TRUE(mover.ok());
  // Sixteen blocks: keys in every shard's slots.
  std::vector<TierPut> puts;
  for (uint64_t i = 0; i < 16; ++i) {
    FillPage(i, static_cast<unsigned char>(0x10 + i));
    puts.push_back({.block = Block(i), .page = i});
  }
  std::vector<TierMove> moves;
  NullSinkForTest below;
  remote->Put(puts, **mover, below, &moves);
  remote->Flush();
  ASSERT_EQ(remote->stats().demotions, 16u);
  std::vector<BlockKey> keys;
  std::vector<uint64_t> pages;
  for (uint64_t i = 0; i < 16; ++i) {
    keys.push_back(Key(i));
    pages.push_back(16 + i);
    FillPage(16 + i, 0);
  }
  ASSERT_EQ(remote->TakeIn(kRoot, keys, pages, **mover, &moves), 16u);
  for (uint64_t i = 0; i < 16; ++i) EXPECT_EQ(Page(16 + i)[77], 0x10 + i);
  EXPECT_EQ(remote->stats().read_errors, 0u);
}

TEST_F(RemoteTierTest, AStoreThatDoesNotAnswerCostsHitsNotRequests) {
  SilentServer silent;
  RemoteTierOptions o = Options({{"127.0.0.1", silent.port()}}, "");
  o.timeout = absl::Milliseconds(50);
  o.breaker_failures = 2;
  o.breaker_cooldown = absl::Seconds(60);
  auto opened = RemoteTier::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status();  // down is not an error
  std::unique_ptr<RemoteTier> remote = *std::move(opened);
  const BlockKey keys[] = {Key(0), Key(1)};
  // One failure at Open, one here: the circuit opens.
  EXPECT_EQ(remote->CountPresentIn(kRoot, keys), 0u);
  EXPECT_TRUE(remote->stats().unavailable);
  EXPECT_EQ(remote->stats().breaker_trips, 1u);
  // Open: no call goes to the store (none fails again).
  const uint64_t errors = remote->stats().read_errors;
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(remote->CountPresentIn(kRoot, keys), 0u);
  }
  EXPECT_EQ(remote->stats().read_errors, errors);
  auto mover = PageMover::Create(pool_.get());
  ASSERT_TRUE(mover.ok());
  std::vector<TierMove> moves;
  NullSinkForTest below;
  remote->Put({{.block = Block(0), .page = 0}}, **mover, below, &moves);
  EXPECT_EQ(remote->stats().dropped_error, 1u);
  EXPECT_EQ(remote->stats().pending, 0u);
}

}  // namespace
}  // namespace radixkv::daemon
