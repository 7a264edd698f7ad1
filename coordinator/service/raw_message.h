// Decode / Encode: protobuf messages from and to raw gRPC byte buffers.
// Every service takes its requests and stream messages as raw bytes
// (agent_service.h, host_session.h, operator_service.h,
// scheduler_service.h) so that bytes which do not decode end the call with
// INVALID_ARGUMENT — gRPC's own decoding answers UNIMPLEMENTED on a unary
// callback method, INTERNAL on a synchronous one, and ends a stream with
// OK. ServeRawUnary serves a unary method that way. Stateless.
#ifndef DYNMO_COORDINATOR_SERVICE_RAW_MESSAGE_H_
#define DYNMO_COORDINATOR_SERVICE_RAW_MESSAGE_H_

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/server_context.h"
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

// A unary call whose request came as raw bytes: admitted by
// `admit(context)` first (credentials: a caller it refuses is answered
// before its bytes are read), then decoded, served by
// `serve(context, request, response)` inline on gRPC's callback thread (for
// calls that never wait on others), its response encoded. A refused caller
// and bytes that do not decode (INVALID_ARGUMENT) are handed to
// `refused(status)` first (the service counts the refusal there) and never
// served.
template <typename Request, typename Response, typename Admit, typename Serve,
          typename Refused>
grpc::ServerUnaryReactor* ServeAdmittedRawUnary(grpc::CallbackServerContext* context,
                                                const grpc::ByteBuffer* raw_request,
                                                grpc::ByteBuffer* raw_response, Admit admit,
                                                Serve serve, Refused refused) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = admit(*context); !s.ok()) {
    reactor->Finish(refused(s));
    return reactor;
  }
  Request request;
  if (grpc::Status s = Decode(*raw_request, &request); !s.ok()) {
    reactor->Finish(refused(s));
    return reactor;
  }
  Response response;
  grpc::Status status = serve(*context, request, &response);
  if (status.ok()) status = Encode(response, raw_response);
  reactor->Finish(status);
  return reactor;
}

// The same for calls whose `serve` checks the caller itself (it may depend
// on the request: an operator's scope is the job it names).
template <typename Request, typename Response, typename Serve, typename Undecodable>
grpc::ServerUnaryReactor* ServeRawUnary(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* raw_request,
                                        grpc::ByteBuffer* raw_response, Serve serve,
                                        Undecodable undecodable) {
  return ServeAdmittedRawUnary<Request, Response>(
      context, raw_request, raw_response,
      [](const grpc::ServerContextBase&) { return grpc::Status::OK; }, std::move(serve),
      std::move(undecodable));
}

}  // namespace dynmo::service

// Defines Class::Method, the raw callback override of a unary method, as
// ServeRawUnary over Class::ServeMethod(const grpc::ServerContextBase&,
// const dynmo::v1::Request&, dynmo::v1::Response*); an undecodable request
// and every failed call are counted by Class::Done("Method", status).
#define DYNMO_SERVE_RAW_UNARY(Class, Method, Request, Response)                          \
  grpc::ServerUnaryReactor* Class::Method(grpc::CallbackServerContext* context,         \
                                          const grpc::ByteBuffer* request,              \
                                          grpc::ByteBuffer* response) {                 \
    return ::dynmo::service::ServeRawUnary<dynmo::v1::Request, dynmo::v1::Response>(    \
        context, request, response,                                                     \
        [this](const grpc::ServerContextBase& c, const dynmo::v1::Request& rq,          \
               dynmo::v1::Response* rs) { return Done(#Method, Serve##Method(c, rq, rs)); }, \
        [this](const grpc::Status& s) { return Done(#Method, s); });                     \
  }

#endif  // DYNMO_COORDINATOR_SERVICE_RAW_MESSAGE_H_
