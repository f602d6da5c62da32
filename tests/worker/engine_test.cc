// Engine over the in-process prefix cache: the second request for a prompt
// hits the blocks the first committed and produces the same logits (1e-4)
// and the same generated tokens as a run with no cache; a fully cached
// prompt still recomputes its last token; --commit-generated makes decoded
// blocks reusable.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "client/worker/engine.h"
#include "client/worker/model.h"
#include "client/worker/prefix_cache.h"
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
