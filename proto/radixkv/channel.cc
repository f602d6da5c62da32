#include "radixkv/channel.h"

#include "grpc/grpc.h"

namespace radixkv {

grpc::ChannelArguments ClientChannelArguments(int max_receive_message_bytes) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_MINIMAL_STACK, 1);
  // The minimal stack turns these off unless asked for explicitly.
  args.SetInt(GRPC_ARG_ENABLE_DEADLINE_CHECKS, 1);
  args.SetMaxReceiveMessageSize(max_receive_message_bytes);
  return args;
}

}  // namespace radixkv
