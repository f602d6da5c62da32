// File: bench/replay/inproc_target.cc
//
// Replay against a RadixTree in this process.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_layout.h"
#include "bench/replay/targets.h"
#include "radix/radix_tree.h"

namespace radixkv::bench {
namespace {

class InProcClient final : public ReplayClient {
 public:
  InProcClient(RadixTree* tree, NamespaceId ns, uint32_t page_size)
      : tree_(tree), ns_(ns), page_size_(page_size) {}

  absl::StatusOr<RequestOutcome> Replay(const TraceRequest& req) override {
    const absl::Span<const uint32_t> tokens =
        FillTokens(req.hash_ids, page_size_, &tokens_);
    RequestOutcome out;
    const int64_t t0 = NowNs();
    // Token mode, as radixkvd asks: the tree derives the block keys.
    absl::StatusOr<AcquireResult> a =
        tree_->Acquire({.ns = ns_, .tokens = tokens, .allocate = true});
    const int64_t t1 = NowNs();
    if (!a.ok()) return a.status();
    if (a->lease != 0) {
      absl::StatusOr<CommitResult> c =
          tree_->Commit(a->lease, a->new_blocks, /*release=*/true);
      if (!c.ok()) return c.status();
    }
    const int64_t t2 = NowNs();
    out.total_blocks = a->total_blocks;
    out.matched_blocks = a->matched_blocks;
    out.new_blocks = a->new_blocks;
    out.acquire_ns = t1 - t0;
    out.request_ns = t2 - t0;
    return out;
  }

 private:
  RadixTree* const tree_;  // not owned; the target outlives its clients
  const NamespaceId ns_;
  const uint32_t page_size_;
  std::vector<uint32_t> tokens_;  // FillTokens scratch, reused
};

class InProcTarget final : public ReplayTarget {
 public:
  InProcTarget(const InProcOptions& o, std::unique_ptr<RadixTree> tree,
               NamespaceId ns)
      : options_(o), tree_(std::move(tree)), ns_(ns) {}

  absl::StatusOr<std::unique_ptr<ReplayClient>> NewClient(int) override {
    return std::make_unique<InProcClient>(tree_.get(), ns_, options_.page_size);
  }

  std::string Describe() const override {
    return absl::StrCat("inproc capacity=", options_.capacity_pages);
  }

  BenchJson FinalStats() override {
    const TreeStats s = tree_->GetStats();
    std::string invariants = "not checked";
    if (options_.check_invariants) {
      absl::Status st = tree_->CheckInvariants();
      invariants = st.ok() ? "ok" : std::string(st.message());
    }
    return BenchJson{{"tree_cached_pages", s.cached_pages},
                     {"tree_evicted_pages", s.evicted_pages},
                     {"tree_hit_blocks", s.hit_blocks},
                     {"tree_lookup_blocks", s.lookup_blocks},
                     {"tree_index_bytes", tree_->IndexMemoryBytes()},
                     {"tree_collisions", s.hash_collisions},
                     {"invariants", invariants}};
  }

 private:
  const InProcOptions options_;
  std::unique_ptr<RadixTree> tree_;
  const NamespaceId ns_;
};

}  // namespace

NamespaceSpec ReplayNamespace(uint32_t page_size) {
  return BenchLayout("radixkv-replay", page_size);
}

NamespaceSpec TinyNamespace(uint32_t page_size) {
  NamespaceSpec spec = BenchLayout("radixkv-replay-tiny", page_size);
  spec.num_layers = 1;
  spec.num_kv_heads = 1;
  spec.head_dim = 8;
  return spec;
}

absl::StatusOr<std::unique_ptr<ReplayTarget>> NewInProcTarget(
    const InProcOptions& options) {
  if (options.capacity_pages == 0) {
    return absl::InvalidArgumentError("inproc capacity_pages must be > 0");
  }
  RadixTreeOptions topts;
  topts.capacity_pages = options.capacity_pages;
  topts.max_page_size = std::max<uint32_t>(options.page_size, 1);
  topts.remembered_evictions = 0;
  topts.eviction_policy = options.eviction_policy;
  absl::StatusOr<std::unique_ptr<RadixTree>> tree = RadixTree::Create(topts);
  if (!tree.ok()) return tree.status();
  absl::StatusOr<NamespaceId> ns =
      (*tree)->RegisterNamespace(ReplayNamespace(options.page_size));
  if (!ns.ok()) return ns.status();
  return std::unique_ptr<ReplayTarget>(
      new InProcTarget(options, *std::move(tree), *ns));
}

}  // namespace radixkv::bench
