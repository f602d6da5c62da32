// File: daemon/core/request_validation.h
//
// The checks every radixkv.v1 request passes before it reaches the cache:
// strings, namespaces, the prompt (exactly one of tokens, tokens_le,
// block_keys, block_keys_packed, within the limits) and release_leases.
// Each refusal is an error about one field (radixkv/errors.h): its message
// names the field and the limit, and it carries an ErrorDetail.
//
// Thread safety: pure functions.
#ifndef RADIXKV_DAEMON_CORE_REQUEST_VALIDATION_H_
#define RADIXKV_DAEMON_CORE_REQUEST_VALIDATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "radix/block_key.h"
#include "radix/radix_tree.h"
#include "radixkv/v1/radixkv.pb.h"

namespace radixkv::daemon {

// Request limits; each is the radixkvd flag of the same name.
struct RequestLimits {
  uint32_t max_prompt_tokens = 131072;
  uint32_t max_string_bytes = 256;
  uint32_t max_page_size = 1024;
  // Accept block_keys instead of tokens (hits then cannot be verified).
  bool allow_key_mode = false;
};

// INVALID_ARGUMENT naming `field` when `value` is longer than `limit` bytes
// (--max_string_bytes).
absl::Status CheckString(absl::string_view field, const std::string& value,
                         uint32_t limit);

// The namespace of a request, checked: strings, page_size, dtype, tp_rank,
// and a page that fits in 1 TiB.
absl::StatusOr<NamespaceSpec> ValidateNamespace(const v1::Namespace& ns,
                                                const RequestLimits& limits);

// The four ways a request carries its prompt (AcquireRequest, MatchRequest,
// ExplainRequest); every reference is into the request, which outlives the
// call.
struct PromptFields {
  const google::protobuf::RepeatedField<uint32_t>& tokens;
  const std::string& tokens_le;
  const google::protobuf::RepeatedPtrField<std::string>& block_keys;
  const std::string& block_keys_packed;
};
template <typename Request>
PromptFields FieldsOf(const Request& r) {
  return PromptFields{r.tokens(), r.tokens_le(), r.block_keys(),
                      r.block_keys_packed()};
}

// A validated prompt: token ids (token mode) or block keys (key mode).
// Move-only in effect: `tokens` may point into `tokens_copy`.
struct Prompt {
  // A view into the request (no copy), or into `tokens_copy` when
  // tokens_le's bytes are not 4-byte aligned. Empty in key mode.
  absl::Span<const uint32_t> tokens;
  std::vector<uint32_t> tokens_copy;
  // Key mode: one key per block. Empty in token mode.
  std::vector<BlockKey> keys;
  bool key_mode = false;
};

// Checks that exactly one prompt form is set and within the limits.
absl::StatusOr<Prompt> ValidatePrompt(const PromptFields& f,
                                      uint32_t page_size,
                                      const RequestLimits& limits);

// AcquireRequest.release_leases: at most kMaxReleaseLeasesPerAcquire, each
// listed once. Whether each is a live lease of the session is the tree's
// check, made atomically with the Acquire.
absl::Status CheckReleaseLeaseList(
    const google::protobuf::RepeatedField<uint64_t>& leases);

// AcquireRequest/CommitRequest.priorities as the tree's BlockPriority:
// at most kMaxPriorityRanges ranges, priority <= kMaxPriority, duration_ms
// <= kMaxPriorityDuration (0: no expiry), blocks > 0; INVALID_ARGUMENT
// naming priorities[i] and the limit. Whether a range lies within the
// prompt is the tree's check.
absl::StatusOr<std::vector<BlockPriority>> ConvertPriorities(
    const google::protobuf::RepeatedPtrField<v1::BlockPriority>& ranges);

// The token ids in `bytes` (little-endian u32 each; REQUIRES: size a
// multiple of 4) without copying when the bytes are 4-byte aligned; else they
// are copied into *copy and the view points there. Little-endian hosts only.
absl::Span<const uint32_t> TokensLeView(absl::string_view bytes,
                                        std::vector<uint32_t>* copy);

}  // namespace radixkv::daemon

#endif  // RADIXKV_DAEMON_CORE_REQUEST_VALIDATION_H_
