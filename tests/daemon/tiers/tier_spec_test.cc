// Tests of the --tier parser (daemon/tiers/tier_spec.h): every accepted
// form with its defaults, and a table of refused specs, each
// INVALID_ARGUMENT naming --tier, the bad part and the expected form.
#include "daemon/tiers/tier_spec.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

TEST(TierSpecTest, HostAlone) {
  const absl::StatusOr<std::vector<TierSpec>> t =
      ParseTierSpecs("host,bytes=1GiB");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 1u);
  EXPECT_EQ((*t)[0].kind, TierSpec::Kind::kHost);
  EXPECT_EQ((*t)[0].bytes, uint64_t{1} << 30);
  EXPECT_TRUE((*t)[0].path.empty());
}

TEST(TierSpecTest, DiskWithDefaultsAndWithEveryKey) {
  absl::StatusOr<std::vector<TierSpec>> t =
      ParseTierSpecs("disk,path=/var/cache/kv,bytes=4096");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 1u);
  EXPECT_EQ((*t)[0].kind, TierSpec::Kind::kDisk);
  EXPECT_EQ((*t)[0].path, "/var/cache/kv");
  EXPECT_EQ((*t)[0].bytes, 4096u);
  EXPECT_EQ((*t)[0].io_threads, 2);
  EXPECT_FALSE((*t)[0].wait_for_staging);

  t = ParseTierSpecs("disk,bytes=2MiB,io_threads=64,demote=wait,path=d");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)[0].bytes, uint64_t{2} << 20);
  EXPECT_EQ((*t)[0].io_threads, 64);
  EXPECT_TRUE((*t)[0].wait_for_staging);
  EXPECT_EQ((*t)[0].path, "d");

  t = ParseTierSpecs("disk,path=d,bytes=1,demote=drop,io_threads=1");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE((*t)[0].wait_for_staging);
  EXPECT_EQ((*t)[0].io_threads, 1);
}

TEST(TierSpecTest, HostAboveDisk) {
  const absl::StatusOr<std::vector<TierSpec>> t =
      ParseTierSpecs("host,bytes=1MB;disk,path=/d,bytes=1GB");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].kind, TierSpec::Kind::kHost);
  EXPECT_EQ((*t)[0].bytes, 1000000u);
  EXPECT_EQ((*t)[1].kind, TierSpec::Kind::kDisk);
  EXPECT_EQ((*t)[1].bytes, 1000000000u);
}

TEST(TierSpecTest, BadSpecsNameTheFlagAndThePart) {
  struct Case {
    std::string spec;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"", "unknown tier kind ''"},
      {"ssd,bytes=1", "unknown tier kind 'ssd'"},
      {"host", "host: bytes= is required"},
      {"host,bytes=0", "host: bytes=0 is not a size > 0"},
      {"host,bytes=lots", "host: bytes=lots is not a size > 0"},
      {"host,bytes", "host: bytes= is not a size > 0"},
      {"host,bytes=1,path=/d", "host: unknown key 'path'"},
      {"host,bytes=1,io_threads=2", "host: unknown key 'io_threads'"},
      {"disk,bytes=1", "disk: path= is required"},
      {"disk,path=,bytes=1", "disk: path is empty"},
      {"disk,path=/d", "disk: bytes= is required"},
      {"disk,path=/d,bytes=1,io_threads=0",
       "disk: io_threads=0 is not in 1..64"},
      {"disk,path=/d,bytes=1,io_threads=65",
       "disk: io_threads=65 is not in 1..64"},
      {"disk,path=/d,bytes=1,io_threads=x",
       "disk: io_threads=x is not in 1..64"},
      {"disk,path=/d,bytes=1,demote=later",
       "disk: demote=later is not drop or wait"},
      {"disk,path=/d,bytes=1,size=2", "disk: unknown key 'size'"},
      {"host,bytes=1;host,bytes=2", "names the same kind of tier twice"},
      {"disk,path=/a,bytes=1;disk,path=/b,bytes=1",
       "names the same kind of tier twice"},
      {"disk,path=/d,bytes=1;host,bytes=1",
       "a host tier goes above a disk tier (the order is host, disk, remote)"},
      {"host,bytes=1;", "unknown tier kind ''"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    const absl::StatusOr<std::vector<TierSpec>> t = ParseTierSpecs(c.spec);
    ASSERT_FALSE(t.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
    const std::string m(t.status().message());
    EXPECT_EQ(m.rfind("--tier=" + c.spec + ": " + c.want, 0), 0u) << m;
    EXPECT_NE(m.find("(expected host,bytes=SIZE, disk,path=DIR"),
              std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace radixkv::daemon
