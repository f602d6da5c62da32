// Engine over the in-process prefix cache: the second request for a prompt
// hits the blocks the first committed and produces the same logits (1e-4)
// and the same generated tokens as a run with no cache; a fully cached
// prompt still recomputes its last token; --commit-generated makes decoded
// blocks reusable.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "worker/engine.h"
#include "worker/model.h"
#include "worker/prefix_cache.h"
#include "gtest/gtest.h"
#include "tests/worker/worker_test_util.h"

namespace radixkv::worker {
namespace {

std::vector<uint32_t> Prompt(uint32_t n, uint32_t seed) {
  return radixkv::worker::Prompt(n, /*vocab=*/512, seed);
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = Model::Create(*NamedModelConfig("tiny"));
    ASSERT_TRUE(m.ok());
    model_ = std::move(*m);
    auto cache = NewLocalPrefixCache(model_->config().Namespace(), 64);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
    none_ = NewNoPrefixCache();
  }
  RunResult Run(PrefixCache* cache, const std::vector<uint32_t>& prompt,
                RunOptions options) {
    Engine e(model_.get(), cache);
    auto r = e.Run(prompt, options);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : RunResult{};
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<PrefixCache> cache_, none_;
};

// A cache that passes everything to `inner` but one fault:
//  - kCommitFails: every Commit answers UNAVAILABLE, as when the daemon
//    restarts between the Acquire and the Commit (pages are handed out and
//    written);
//  - kLostWhileReading: the lease is lost while the worker reads it (the
//    lease expired, the session ended): ConfirmRead overwrites the matched
//    pages with garbage, as a new owner could, and reports the loss.
class FaultyCache final : public PrefixCache {
 public:
  enum class Fault { kCommitFails, kLostWhileReading };
  FaultyCache(PrefixCache* inner, Fault fault) : inner_(inner), fault_(fault) {}
  absl::StatusOr<std::unique_ptr<CacheLease>> Acquire(
      absl::Span<const uint32_t> tokens, bool allocate) override {
    absl::StatusOr<std::unique_ptr<CacheLease>> lease =
        inner_->Acquire(tokens, allocate);
    if (!lease.ok()) return lease.status();
    return std::unique_ptr<CacheLease>(new Lease(*std::move(lease), fault_));
  }
  std::string Describe() const override { return "faulty"; }

 private:
  class Lease final : public CacheLease {
   public:
    Lease(std::unique_ptr<CacheLease> inner, Fault fault)
        : inner_(std::move(inner)), fault_(fault) {}
    uint32_t matched_blocks() const override { return inner_->matched_blocks(); }
    uint32_t new_blocks() const override { return inner_->new_blocks(); }
    void* page_address(size_t i) const override {
      return inner_->page_address(i);
    }
    absl::Status ConfirmRead() const override {
      if (fault_ != Fault::kLostWhileReading) return inner_->ConfirmRead();
      for (size_t i = 0; i < inner_->matched_blocks(); ++i) {
        auto* f = static_cast<float*>(inner_->page_address(i));
        for (int k = 0; k < 64; ++k) f[k] = 1e6f;
      }
      return absl::DeadlineExceededError("lease expired");
    }
    absl::Status Commit(uint32_t blocks, bool release) override {
      if (fault_ == Fault::kCommitFails) {
        return absl::UnavailableError("session ended");
      }
      return inner_->Commit(blocks, release);
    }
    absl::Status Release() override { return inner_->Release(); }

   private:
    std::unique_ptr<CacheLease> inner_;
    const Fault fault_;
  };
  PrefixCache* inner_;
  const Fault fault_;
};

// The cache going away between Acquire and Commit costs hits, never the
// request: the run succeeds with the uncached output and commits nothing.
TEST_F(EngineTest, FailedCommitsDegradeToMisses) {
  const auto prompt = Prompt(16 * 5 + 7, 3);
  RunOptions o;
  o.decode_tokens = 8;
  o.commit_generated = true;
  const RunResult baseline = Run(none_.get(), prompt, o);
  FaultyCache failing(cache_.get(), FaultyCache::Fault::kCommitFails);
  const RunResult r = Run(&failing, prompt, o);
  EXPECT_EQ(r.generated, baseline.generated);
  EXPECT_EQ(r.committed_blocks, 0u);
  EXPECT_EQ(r.committed_generated_blocks, 0u);
  EXPECT_EQ(Run(cache_.get(), prompt, o).matched_tokens, 0u);  // nothing cached
}

// Bytes read from pages the worker no longer held are never used: the
// request is served again without the cache.
TEST_F(EngineTest, ALeaseLostWhileReadingIsAMiss) {
  const auto prompt = Prompt(16 * 5 + 7, 4);
  RunOptions o;
  o.decode_tokens = 6;
  const RunResult baseline = Run(none_.get(), prompt, o);
  ASSERT_EQ(Run(cache_.get(), prompt, o).committed_blocks, 5u);
  FaultyCache lost(cache_.get(), FaultyCache::Fault::kLostWhileReading);
  const RunResult r = Run(&lost, prompt, o);
  EXPECT_TRUE(r.cache_degraded);
  EXPECT_EQ(r.matched_tokens, 0u);
  EXPECT_EQ(r.generated, baseline.generated);
  EXPECT_LE(MaxAbsDiff(r.first_logits, baseline.first_logits), 1e-4f);
}

TEST_F(EngineTest, SecondRequestHitsAndMatchesTheUncachedRun) {
  const auto prompt = Prompt(16 * 5 + 7, 1);
  RunOptions o;
  o.decode_tokens = 12;
  const RunResult baseline = Run(none_.get(), prompt, o);
  const RunResult first = Run(cache_.get(), prompt, o);
  EXPECT_EQ(first.matched_tokens, 0u);
  EXPECT_EQ(first.committed_blocks, 5u);
  const RunResult second = Run(cache_.get(), prompt, o);
  EXPECT_EQ(second.matched_tokens, 80u);
  EXPECT_EQ(second.committed_blocks, 0u);
  EXPECT_LE(MaxAbsDiff(second.first_logits, baseline.first_logits), 1e-4f);
  EXPECT_EQ(second.generated, baseline.generated);
  EXPECT_EQ(first.generated, baseline.generated);
  EXPECT_EQ(baseline.generated.size(), 12u);
}

TEST_F(EngineTest, SharedPrefixIsReusedByAnotherPrompt) {
  auto a = Prompt(64, 2);
  auto b = a;
  b.resize(48);  // shares 3 blocks with a
  const auto tail = Prompt(30, 3);
  b.insert(b.end(), tail.begin(), tail.end());
  RunOptions o;
  o.decode_tokens = 4;
  Run(cache_.get(), a, o);
  const RunResult r = Run(cache_.get(), b, o);
  EXPECT_EQ(r.matched_tokens, 48u);
  EXPECT_EQ(r.generated, Run(none_.get(), b, o).generated);
}

TEST_F(EngineTest, FullyCachedPromptRecomputesTheLastToken) {
  const auto prompt = Prompt(64, 4);
  RunOptions o;
  o.decode_tokens = 6;
  Run(cache_.get(), prompt, o);
  const RunResult again = Run(cache_.get(), prompt, o);
  EXPECT_EQ(again.matched_tokens, 63u);
  const RunResult baseline = Run(none_.get(), prompt, o);
  EXPECT_LE(MaxAbsDiff(again.first_logits, baseline.first_logits), 1e-4f);
  EXPECT_EQ(again.generated, baseline.generated);
}

TEST_F(EngineTest, CommitGeneratedMakesDecodedBlocksReusable) {
  const auto prompt = Prompt(40, 5);
  RunOptions o;
  o.decode_tokens = 30;  // prompt + 29 fed tokens = 69 tokens: 4 full blocks
  o.commit_generated = true;
  const RunResult r = Run(cache_.get(), prompt, o);
  EXPECT_EQ(r.committed_blocks, 2u);
  EXPECT_EQ(r.committed_generated_blocks, 2u);
  // A follow-up prompt = prompt + the generated text hits all 4 blocks.
  std::vector<uint32_t> follow = prompt;
  follow.insert(follow.end(), r.generated.begin(), r.generated.end());
  RunOptions o2;
  o2.decode_tokens = 3;
  const RunResult hit = Run(cache_.get(), follow, o2);
  EXPECT_EQ(hit.matched_tokens, 64u);
  EXPECT_EQ(hit.generated, Run(none_.get(), follow, o2).generated);
}

TEST_F(EngineTest, BadRequestsAreRejected) {
  Engine e(model_.get(), cache_.get());
  RunOptions o;
  EXPECT_EQ(e.Run({}, o).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> bad = {1, 600};
  EXPECT_NE(e.Run(bad, o).status().message().find("prompt[1] = 600"),
            std::string::npos);
  o.decode_tokens = 0;
  EXPECT_EQ(e.Run(Prompt(3, 1), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace radixkv::worker
