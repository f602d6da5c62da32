// Fuzzes the attach message parser (daemon/rpc/attach_protocol.h), the part of
// radixkvd's attach socket that reads what an untrusted peer sends.
//
// Input: byte 0 gives the message's framing (bits 0-1: descriptors it
// carried, 0..3; bit 2: end-of-file), the rest is the message's bytes.
//
// Checked: the parser accepts exactly the messages the contract
// (docs/CONTRACTS.md §3) allows, judged by an independent UTF-8 check
// written from the Unicode standard's table of well-formed byte sequences;
// an accepted id is the message's bytes, unchanged; a refusal has a reason.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/rpc/attach_protocol.h"

namespace {

// Unicode 15, Table 3-7 (well-formed UTF-8 byte sequences), range by range.
bool WellFormedUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  auto in = [](unsigned char b, unsigned char lo, unsigned char hi) {
    return b >= lo && b <= hi;
  };
  size_t i = 0;
  while (i < n) {
    const unsigned char b0 = p[i];
    size_t len;
    unsigned char lo1 = 0x80, hi1 = 0xbf;
    if (b0 <= 0x7f) {
      len = 1;
    } else if (in(b0, 0xc2, 0xdf)) {
      len = 2;
    } else if (b0 == 0xe0) {
      len = 3, lo1 = 0xa0;
    } else if (in(b0, 0xe1, 0xec) || in(b0, 0xee, 0xef)) {
      len = 3;
    } else if (b0 == 0xed) {
      len = 3, hi1 = 0x9f;
    } else if (b0 == 0xf0) {
      len = 4, lo1 = 0x90;
    } else if (in(b0, 0xf1, 0xf3)) {
      len = 4;
    } else if (b0 == 0xf4) {
      len = 4, hi1 = 0x8f;
    } else {
      return false;
    }
    if (n - i < len) return false;
    if (len > 1 && !in(p[i + 1], lo1, hi1)) return false;
    for (size_t k = 2; k < len; ++k) {
      if (!in(p[i + k], 0x80, 0xbf)) return false;
    }
    i += len;
  }
  return true;
}

void Fail(const char* what) {
  std::fprintf(stderr, "FUZZ_CHECK failed: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using radixkv::daemon::IsValidUtf8;
  using radixkv::daemon::kMaxAttachSessionIdBytes;
  using radixkv::daemon::ParseAttachRequest;
  if (size == 0) return 0;
  const size_t fds = data[0] & 0x03;
  const bool eof = (data[0] & 0x04) != 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1,
                                size - 1);

  const bool utf8 = WellFormedUtf8(bytes);
  if (IsValidUtf8(bytes) != utf8) Fail("IsValidUtf8 disagrees with Table 3-7");
  const bool acceptable = fds == 0 && !eof && !bytes.empty() &&
                          bytes.size() <= kMaxAttachSessionIdBytes && utf8;
  const absl::StatusOr<absl::string_view> id =
      ParseAttachRequest(bytes, fds, eof);
  if (id.ok() != acceptable) {
    Fail(acceptable ? "a valid session id message was refused"
                    : "an invalid session id message was accepted");
  }
  if (id.ok()) {
    if (id->data() != bytes.data() || id->size() != bytes.size()) {
      Fail("the accepted id is not the message's bytes");
    }
  } else if (id.status().message().empty() ||
             !absl::IsInvalidArgument(id.status())) {
    Fail("a refusal without an INVALID_ARGUMENT reason");
  }
  return 0;
}
