// Decode / Encode: protobuf messages from and to raw gRPC byte buffers.
// The agent service takes its requests and stream messages as raw bytes
// (agent_service.h, host_session.h) so that bytes which do not decode end
// the call with INVALID_ARGUMENT — gRPC's own decoding answers UNIMPLEMENTED
// on a unary callback method and ends a stream with OK. Stateless.
#ifndef DYNMO_COORDINATOR_SERVICE_RAW_MESSAGE_H_
#define DYNMO_COORDINATOR_SERVICE_RAW_MESSAGE_H_

#include <memory>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/impl/codegen/proto_utils.h"  // SerializationTraits of protobuf messages
#include "grpcpp/support/status.h"

namespace dynmo::service {

// `raw` as a `Message`; INVALID_ARGUMENT naming the type when it is not one.
template <typename Message>
grpc::Status Decode(const grpc::ByteBuffer& raw, Message* out) {
  grpc::ByteBuffer copy(raw);  // deserializing consumes the buffer
  if (grpc::SerializationTraits<Message>::Deserialize(&copy, out).ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("the message does not decode as ", out->GetTypeName()));
}

template <typename Message>
grpc::Status Encode(const Message& message, grpc::ByteBuffer* raw) {
  bool own = false;
  return grpc::SerializationTraits<Message>::Serialize(message, raw, &own);
}

// `message` as a buffer for a raw stream's write queue.
template <typename Message>
std::shared_ptr<const grpc::ByteBuffer> Encoded(const Message& message) {
  auto raw = std::make_shared<grpc::ByteBuffer>();
  Encode(message, raw.get()).IgnoreError();  // a message we built always encodes
  return raw;
}

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_RAW_MESSAGE_H_
