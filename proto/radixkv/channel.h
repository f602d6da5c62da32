// File: proto/radixkv/channel.h
//
// The gRPC channel arguments radixkv's own clients use (the client library,
// radixkvctl, the load generators), so that what bench/ measures is what a
// worker gets.
//
// On top of gRPC's defaults they turn off what a client of a local cache
// daemon pays for on every call and never uses:
//   * client-side retries (GRPC_ARG_ENABLE_RETRIES): radixkv clients decide
//     themselves what a failed call means (degrade to a miss, reconnect);
//     gRPC's retry filter copies every outgoing message in case it must
//     replay it;
//   * the optional filters (GRPC_ARG_MINIMAL_STACK): per-message
//     compression (radixkv never compresses: payloads are token ids, keys
//     and page ids on a local socket) and census;
// and keep what matters explicitly: deadline checking (every radixkv call
// has a deadline) and a receive limit (max_receive_message_bytes).
//
// Thread safety: pure function.
#ifndef RADIXKV_PROTO_RADIXKV_CHANNEL_H_
#define RADIXKV_PROTO_RADIXKV_CHANNEL_H_

#include "grpcpp/support/channel_arguments.h"

namespace radixkv {

// Largest response a radixkv client accepts by default (a Tree dump of a
// big cache is the largest; Acquire answers are a few KB).
inline constexpr int kDefaultClientMaxReceiveBytes = 64 << 20;

// Arguments for a channel to radixkvd. Callers add their own (backoff,
// keepalive, subchannel pool) on top.
grpc::ChannelArguments ClientChannelArguments(
    int max_receive_message_bytes = kDefaultClientMaxReceiveBytes);

}  // namespace radixkv

#endif  // RADIXKV_PROTO_RADIXKV_CHANNEL_H_
