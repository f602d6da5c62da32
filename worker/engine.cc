#include "worker/engine.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "gpu/kv_ops.h"
#include "base/status_macros.h"

namespace radixkv::worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

// Writes blocks [first_block, first_block + n) of the request's K/V from the
// local cache (whose token 0 is absolute position local_base) into
// lease pages [page_index, page_index + n).
// Device pages (a cuda pool) are written by the model's CUDA path, which
// synchronises its stream before returning; host pages by the CPU write_kv
// from the host copy of the local cache. Either way the K/V are complete
// when this returns OK, so the caller may Commit (docs/CONTRACTS.md §2).
absl::Status WriteBlocks(const Model& model, const LocalKv& local,
                         uint32_t local_base, uint32_t first_block, uint32_t n,
                         const CacheLease& lease, size_t page_index) {
  const ModelConfig& c = model.config();
  if (n == 0) return absl::OkStatus();
  const uint32_t first_local = first_block * c.page_size - local_base;
  std::vector<void*> pages(n);
  for (uint32_t i = 0; i < n; ++i) {
    pages[i] = lease.page_address(page_index + i);
    if (pages[i] == nullptr) {
      // The lease is no longer live: its pages are not this worker's to
      // write. The caller skips the commit.
      return absl::FailedPreconditionError(
          absl::StrCat("lease page ", page_index + i, " is no longer held"));
    }
  }
  if (lease.device_pages()) {
    return model.WriteKvToDevicePages(local, first_local, pages);
  }
  const gpu::KvSource src{local.k(0, first_local), local.v(0, first_local),
                          n * c.page_size, local.capacity()};
  return gpu::WriteKv(c.Geometry(), src, pages);
}

}  // namespace

absl::StatusOr<RunResult> Engine::Run(absl::Span<const uint32_t> prompt,
                                      const RunOptions& options) const {
  return RunOnce(prompt, options, /*use_cache=*/true);
}

absl::StatusOr<RunResult> Engine::RunOnce(absl::Span<const uint32_t> prompt,
                                          const RunOptions& options,
                                          bool use_cache) const {
  const ModelConfig& c = model_->config();
  if (prompt.empty()) return absl::InvalidArgumentError("prompt: no tokens");
  if (options.decode_tokens == 0) {
    return absl::InvalidArgumentError("decode_tokens must be >= 1");
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] >= c.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt[", i, "] = ", prompt[i], " is not below vocab ", c.vocab));
    }
  }
  const uint32_t n = static_cast<uint32_t>(prompt.size());
  const uint32_t ps = c.page_size;
  RunResult result;
  result.prompt_tokens = n;
  const auto t0 = std::chrono::steady_clock::now();

  std::unique_ptr<CacheLease> lease;
  if (use_cache) {
    ASSIGN_OR_RETURN(lease, cache_->Acquire(prompt, /*allocate=*/true));
  } else {
    ASSIGN_OR_RETURN(lease, NewNoPrefixCache()->Acquire(prompt, /*allocate=*/false));
  }
  result.cache_degraded = !use_cache || lease->degraded();
  const uint32_t matched = lease->matched_blocks();
  // Reuse every cached token but the last prompt token, which always runs.
  const uint32_t prefix_tokens = std::min(matched * ps, n - 1);
  PrefixView prefix;
  prefix.tokens = prefix_tokens;
  prefix.device_pages = lease->device_pages();
  // A cross-layer model rebuilds its windows from the prefix's last tokens.
  prefix.recent_tokens = prompt.subspan(0, prefix_tokens);
  for (uint32_t i = 0; i < (prefix_tokens + ps - 1) / ps; ++i) {
    const void* p = lease->page_address(i);
    if (p == nullptr) {
      // The lease stopped being live (expired, session lost): a miss.
      (void)lease->Release();
      return RunOnce(prompt, options, /*use_cache=*/false);
    }
    prefix.pages.push_back(p);
  }
  result.matched_tokens = prefix_tokens;

  const uint32_t suffix = n - prefix_tokens;
  LocalKv local(c, suffix + options.decode_tokens);
  ASSIGN_OR_RETURN(std::vector<float> logits,
                   model_->Forward(prefix, &local, prompt.subspan(prefix_tokens)));
  uint32_t token = Argmax(logits);
  result.ttft_s = SecondsSince(t0);
  result.generated.push_back(token);
  result.first_logits = std::move(logits);

  // New full blocks of the prompt: write, then commit (keep the lease: the
  // prefix pages are read by every decode step).
  const uint32_t new_blocks = lease->new_blocks();
  if (options.commit_prompt && new_blocks > 0) {
    // New blocks start right after the matched ones, which are all in the
    // prefix (a prompt with unmatched blocks is not fully cached).
    // A lease lost before the write, or a failed commit (the daemon
    // restarted, the lease ended) costs only future hits: the request goes
    // on with its own K/V.
    absl::Status written = WriteBlocks(*model_, local, prefix_tokens, matched,
                                       new_blocks, *lease, matched);
    if (!written.ok() && !absl::IsFailedPrecondition(written)) return written;
    if (written.ok() && lease->Commit(new_blocks, /*release=*/false).ok()) {
      result.committed_blocks = new_blocks;
    }
  }

  const auto t1 = std::chrono::steady_clock::now();
  for (uint32_t i = 1; i < options.decode_tokens; ++i) {
    ASSIGN_OR_RETURN(logits, model_->Forward(prefix, &local,
                                             absl::MakeConstSpan(&token, 1)));
    token = Argmax(logits);
    result.generated.push_back(token);
  }
  result.decode_s = SecondsSince(t1);
  if (options.decode_tokens > 1 && result.decode_s > 0) {
    result.decode_tokens_per_s = (options.decode_tokens - 1) / result.decode_s;
  }
  // Every step above read the prefix pages: were they still ours?
  if (prefix_tokens > 0 && !lease->ConfirmRead().ok()) {
    (void)lease->Release();
    return RunOnce(prompt, options, /*use_cache=*/false);
  }

  if (options.commit_generated) {
    // Tokens whose K/V exist: the prompt and every generated token but the
    // last (which was never fed back).
    std::vector<uint32_t> all(prompt.begin(), prompt.end());
    all.insert(all.end(), result.generated.begin(), result.generated.end() - 1);
    ASSIGN_OR_RETURN(std::unique_ptr<CacheLease> gen,
                     cache_->Acquire(all, /*allocate=*/true));
    const uint32_t m2 = gen->matched_blocks(), n2 = gen->new_blocks();
    // Only blocks whose K/V sit in the local cache can be written.
    if (n2 > 0 && m2 * ps >= prefix_tokens) {
      absl::Status written =
          WriteBlocks(*model_, local, prefix_tokens, m2, n2, *gen, m2);
      if (!written.ok() && !absl::IsFailedPrecondition(written)) return written;
      if (written.ok() && gen->Commit(n2, /*release=*/true).ok()) {
        result.committed_generated_blocks = n2;
      }
    }
    RETURN_IF_ERROR(gen->Release());
  }
  RETURN_IF_ERROR(lease->Release());
  return result;
}

}  // namespace radixkv::worker
