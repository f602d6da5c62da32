// Unit tests of request validation (daemon/core/request_validation.h).
#include <cstring>
#include <string>
#include <vector>

#include "daemon/core/request_validation.h"
#include "gtest/gtest.h"

namespace radixkv::daemon {
namespace {

// tokens_le: read in place when aligned, copied (same values) when not.
TEST(TokensLeViewTest, InPlaceWhenAlignedCopiedWhenNot) {
  const std::vector<uint32_t> ids = {1, 0x01020304u, 0xfffffffeu, 70000};
  std::string wire;
  for (uint32_t t : ids) {
    for (int i = 0; i < 4; ++i) wire.push_back(static_cast<char>(t >> (8 * i)));
  }
  // One spare byte in front, so both an aligned and a misaligned start exist.
  alignas(8) char buffer[1 + 16 + 8];
  for (int offset : {0, 1}) {
    SCOPED_TRACE(offset);
    std::memcpy(buffer + offset, wire.data(), wire.size());
    std::vector<uint32_t> copy;
    const absl::Span<const uint32_t> view =
        daemon::TokensLeView(absl::string_view(buffer + offset, wire.size()), &copy);
    EXPECT_EQ(std::vector<uint32_t>(view.begin(), view.end()), ids);
    if (offset == 0) {
      EXPECT_EQ(static_cast<const void*>(view.data()), buffer);  // no copy
      EXPECT_TRUE(copy.empty());
    } else {
      EXPECT_EQ(view.data(), copy.data());
    }
  }
  std::vector<uint32_t> copy;
  EXPECT_TRUE(daemon::TokensLeView(absl::string_view(buffer + 1, 0), &copy).empty());
}

}  // namespace
}  // namespace radixkv::daemon
