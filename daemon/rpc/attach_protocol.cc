#include "daemon/rpc/attach_protocol.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace radixkv::daemon {

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      len = 1;
      cp = c;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and out-of-range code points.
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

absl::StatusOr<absl::string_view> ParseAttachRequest(absl::string_view bytes,
                                                     size_t fd_count,
                                                     bool eof) {
  if (fd_count != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("session id message carried ", fd_count,
                     " file descriptors; it must carry none"));
  }
  if (eof || bytes.empty()) {
    return absl::InvalidArgumentError(
        "connection closed or empty message instead of a session id");
  }
  if (bytes.size() > kMaxAttachSessionIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("session id of ", bytes.size(), " bytes exceeds ",
                     kMaxAttachSessionIdBytes, " bytes"));
  }
  if (!IsValidUtf8(bytes)) {
    return absl::InvalidArgumentError("session id is not valid UTF-8");
  }
  return bytes;
}

}  // namespace radixkv::daemon
