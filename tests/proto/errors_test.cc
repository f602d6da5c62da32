// Unit tests of the status mapping and structured errors (proto/radixkv/errors.h).
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "radixkv/errors.h"
#include "gtest/gtest.h"

namespace radixkv {
namespace {

TEST(StatusUtilTest, EveryCodeIsCastAndOkHasNoMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(ToGrpcStatus(absl::OkStatus()).error_message(), "");
  for (int code = 1; code <= 16; ++code) {
    const absl::Status s(static_cast<absl::StatusCode>(code), absl::StrCat("m", code));
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), absl::StrCat("m", code));
  }
}

TEST(StatusUtilTest, LongMessagesAreTruncated) {
  const grpc::Status g =
      ToGrpcStatus(absl::InvalidArgumentError(std::string(5000, 'x')));
  EXPECT_EQ(g.error_message().size(), kMaxGrpcStatusMessageBytes);
}

// An ErrorDetail survives the trip absl -> gRPC -> absl (the trailer is an
// RpcStatus, google.rpc.Status's wire form); a status without one has no
// details on the wire.
TEST(StatusUtilTest, ErrorDetailTravelsInTheStatusDetails) {
  const absl::Status s =
      FieldError(absl::StatusCode::kNotFound, "release_leases",
                 v1::ERROR_REASON_LEASE_NOT_FOUND, "lease 7 expired");
  EXPECT_EQ(s.message(), "release_leases: lease 7 expired");
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_message(), "release_leases: lease 7 expired");
  v1::RpcStatus wire;
  ASSERT_TRUE(wire.ParseFromString(g.error_details()));
  EXPECT_EQ(wire.code(), static_cast<int>(absl::StatusCode::kNotFound));
  ASSERT_EQ(wire.details_size(), 1);
  EXPECT_EQ(wire.details(0).type_url(), kErrorDetailTypeUrl);
  const absl::Status back = FromGrpcStatus(g);
  EXPECT_EQ(back.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(back.message(), s.message());
  EXPECT_EQ(ErrorFieldOf(back), "release_leases");
  EXPECT_EQ(ErrorReasonOf(back), v1::ERROR_REASON_LEASE_NOT_FOUND);
  EXPECT_TRUE(ToGrpcStatus(absl::NotFoundError("x")).error_details().empty());
  EXPECT_EQ(ErrorReasonOf(FromGrpcStatus(
                grpc::Status(grpc::StatusCode::NOT_FOUND, "x", "garbage"))),
            v1::ERROR_REASON_UNSPECIFIED);
  // WithField prefixes the message; WithDetail keeps it.
  const absl::Status w = WithField("lease_id", v1::ERROR_REASON_LEASE_NOT_FOUND,
                                   absl::NotFoundError("gone"));
  EXPECT_EQ(w.message(), "lease_id: gone");
  EXPECT_EQ(ErrorFieldOf(w), "lease_id");
  const absl::Status d = WithDetail("lease_id", v1::ERROR_REASON_INVALID,
                                    absl::NotFoundError("gone"));
  EXPECT_EQ(d.message(), "gone");
  EXPECT_EQ(ErrorReasonOf(d), v1::ERROR_REASON_INVALID);
  EXPECT_TRUE(WithField("x", v1::ERROR_REASON_INVALID, absl::OkStatus()).ok());
}

}  // namespace
}  // namespace radixkv
