// noisy_neighbor: what fair eviction between tenants (RadixTree accounts)
// buys a quiet tenant that shares a pool with a busy one.
//
// Tenant A replays a Mooncake trace (every request an Acquire with
// allocation, then a Commit of every new block). Tenant B cycles through a
// small hot set of prompts, one request after every --every A requests.
// Both run against one in-process RadixTree of --capacity pages, once per
// policy, side by side:
//   shared  one account: plain leaf LRU over the whole pool
//   fair    one account per tenant, equal weights
//   capped  fair, and A limited to --cap_pages cached pages
// Prints one line per policy: each tenant's token hit ratio and the pages
// it holds at the end.
//
//   noisy_neighbor [--trace=PATH] [--capacity=3000] [--page_size=16]
//                  [--hot_prompts=16] [--hot_blocks=32] [--every=8]
//                  [--cap_pages=2000]
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "bench/replay/trace.h"
#include "radix/radix_tree.h"

ABSL_FLAG(std::string, trace, RADIXKV_DEFAULT_TRACE, "tenant A's trace");
ABSL_FLAG(uint32_t, capacity, 3000, "pages in the shared pool");
ABSL_FLAG(uint32_t, page_size, 16, "tokens per block");
ABSL_FLAG(uint32_t, hot_prompts, 16, "tenant B's distinct prompts");
ABSL_FLAG(uint32_t, hot_blocks, 32, "blocks per tenant B prompt");
ABSL_FLAG(uint32_t, every, 8, "tenant A requests per tenant B request");
ABSL_FLAG(uint32_t, cap_pages, 2000, "tenant A's max_pages in the capped run");

namespace radixkv::bench {
namespace {

struct TenantTally {
  uint64_t lookup_tokens = 0;
  uint64_t hit_tokens = 0;
  double ratio() const {
    return lookup_tokens == 0 ? 0.0
                              : static_cast<double>(hit_tokens) / lookup_tokens;
  }
};

// One request: pin the longest cached prefix, store the rest, let go.
absl::Status Serve(RadixTree& tree, NamespaceId ns,
                   absl::Span<const uint32_t> tokens, uint32_t page_size,
                   TenantTally* tally) {
  absl::StatusOr<AcquireResult> r =
      tree.Acquire({.ns = ns, .tokens = tokens, .allocate = true});
  if (!r.ok()) return r.status();
  tally->lookup_tokens += uint64_t{r->total_blocks} * page_size;
  tally->hit_tokens += uint64_t{r->matched_blocks} * page_size;
  if (r->lease == 0) return absl::OkStatus();
  return tree.Commit(r->lease, r->new_blocks, /*release=*/true).status();
}

enum class Policy { kShared, kFair, kCapped };

absl::Status Run(Policy policy, const Trace& trace) {
  const uint32_t ps = absl::GetFlag(FLAGS_page_size);
  const bool accounts = policy != Policy::kShared;
  absl::StatusOr<std::unique_ptr<RadixTree>> made = RadixTree::Create(
      {.capacity_pages = absl::GetFlag(FLAGS_capacity),
       .accounts = accounts ? 3u : 1u});
  if (!made.ok()) return made.status();
  RadixTree& tree = **made;
  if (policy == Policy::kCapped) {
    absl::Status s =
        tree.SetAccountLimits(1, {.max_pages = absl::GetFlag(FLAGS_cap_pages)});
    if (!s.ok()) return s;
  }
  const absl::StatusOr<NamespaceId> a = tree.RegisterNamespace(
      {.model = "m", .cache_salt = "tenant/a", .page_size = ps},
      accounts ? 1 : 0);
  const absl::StatusOr<NamespaceId> b = tree.RegisterNamespace(
      {.model = "m", .cache_salt = "tenant/b", .page_size = ps},
      accounts ? 2 : 0);
  if (!a.ok() || !b.ok()) return a.ok() ? b.status() : a.status();

  const uint32_t hot = absl::GetFlag(FLAGS_hot_prompts);
  const uint32_t hot_blocks = absl::GetFlag(FLAGS_hot_blocks);
  const uint32_t every = absl::GetFlag(FLAGS_every);
  TenantTally ta, tb;
  std::vector<uint32_t> buf, hot_ids(hot_blocks);
  uint64_t b_requests = 0;
  for (size_t i = 0; i < trace.requests.size(); ++i) {
    absl::Span<const uint32_t> t =
        FillTokens(trace.requests[i].hash_ids, ps, &buf);
    if (absl::Status s = Serve(tree, *a, t, ps, &ta); !s.ok()) return s;
    if ((i + 1) % every != 0) continue;
    // B's prompt k: a shared first half, then blocks of its own.
    const uint32_t k = static_cast<uint32_t>(b_requests++ % hot);
    for (uint32_t j = 0; j < hot_blocks; ++j) {
      hot_ids[j] = j < hot_blocks / 2 ? j : 1000 + k * hot_blocks + j;
    }
    t = FillTokens(hot_ids, ps, &buf);
    if (absl::Status s = Serve(tree, *b, t, ps, &tb); !s.ok()) return s;
  }
  const char* name = policy == Policy::kShared ? "shared"
                     : policy == Policy::kFair ? "fair"
                                               : "capped";
  uint64_t a_pages = 0, b_pages = 0;
  for (const NamespaceInfo& n : tree.ListNamespaces()) {
    (n.id == *a ? a_pages : b_pages) += n.cached_blocks;
  }
  std::printf(
      "%-7s A hit %.4f (%llu pages)  B hit %.4f (%llu pages, %llu requests)\n",
      name, ta.ratio(), static_cast<unsigned long long>(a_pages), tb.ratio(),
      static_cast<unsigned long long>(b_pages),
      static_cast<unsigned long long>(b_requests));
  return tree.CheckInvariants();
}

}  // namespace
}  // namespace radixkv::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace radixkv::bench;  // NOLINT
  absl::StatusOr<Trace> trace =
      LoadTrace(absl::GetFlag(FLAGS_trace), absl::GetFlag(FLAGS_page_size));
  if (!trace.ok()) {
    std::fprintf(stderr, "noisy_neighbor: %s\n",
                 trace.status().ToString().c_str());
    return 1;
  }
  for (Policy p : {Policy::kShared, Policy::kFair, Policy::kCapped}) {
    if (absl::Status s = Run(p, *trace); !s.ok()) {
      std::fprintf(stderr, "noisy_neighbor: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
