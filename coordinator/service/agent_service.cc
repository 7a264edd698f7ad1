#include "coordinator/service/agent_service.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "coordinator/service/host_session.h"
#include "coordinator/job/session_sink.h"
#include "rpc/stream_outbox.h"
#include "coordinator/job/validation.h"
#include "coordinator/service/grpc_status.h"
#include "coordinator/service/raw_message.h"
#include "coordinator/service/refusal_log.h"

namespace dynmo::service {
namespace {

using dynmo::v1::AgentMessage;
using dynmo::v1::CoordinatorMessage;

class SessionReactor;

using RawReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// A one-rank Session's sink: the stream's outbox, of encoded messages (the
// stream is raw: raw_message.h).
class Outbox final : public SessionSink {
 public:
  explicit Outbox(RawReactor* reactor) : stream_(reactor) {}

  void Send(std::shared_ptr<const CoordinatorMessage> message) override {
    stream_.Write(Encoded(*message));
  }
  void Close(const absl::Status& status) override {
    stream_.Finish(ToGrpcStatus(status));
  }
  void Finish(const grpc::Status& status) { stream_.Finish(status); }
  void OnWriteDone(bool ok) { stream_.OnWriteDone(ok); }
  bool finishing() { return stream_.finishing(); }
  void Detach() { stream_.Detach(); }

 private:
  rpc::StreamOutbox<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
};

class SessionReactor final : public RawReactor {
 public:
  SessionReactor(Coordinator* coordinator, std::string principal, PendingSessions* pending,
                 const std::string& peer)
      : coordinator_(coordinator), principal_(std::move(principal)),
        outbox_(std::make_shared<Outbox>(this)) {
    absl::StatusOr<std::shared_ptr<PendingSessions::Wait>> wait =
        pending->Admit(peer, [outbox = outbox_] { outbox->Finish(NoHello()); });
    if (!wait.ok()) {
      coordinator_->metrics().RpcError("Session", "RESOURCE_EXHAUSTED");
      outbox_->Finish(ToGrpcStatus(wait.status()));
      return;
    }
    wait_ = *std::move(wait);
    StartRead(&raw_in_);
  }

  void OnReadDone(bool ok) override {
    // Before the hello: the deadline may have ended the stream already.
    if (job_ == nullptr && !wait_->Greeted()) return;
    if (!ok) {
      // The agent closed its side or the connection broke.
      outbox_->Finish(grpc::Status::OK);
      return;
    }
    in_.Clear();
    const grpc::Status decoded = Decode(raw_in_, &in_);
    absl::Status s = decoded.ok() ? Handle()
                                  : absl::InvalidArgumentError(decoded.error_message());
    if (!s.ok()) {
      coordinator_->metrics().RpcError(
          "Session", GrpcCodeName(static_cast<grpc::StatusCode>(s.code())));
      LogSessionRefusal("Session", job_ != nullptr ? job_->name() : in_.hello().job(),
                        job_ != nullptr ? rank_ : in_.hello().rank(), s);
      outbox_->Finish(ToGrpcStatus(s));
      return;
    }
    // A superseded session was finished meanwhile: start nothing new.
    if (!outbox_->finishing()) StartRead(&raw_in_);
  }

  void OnWriteDone(bool ok) override { outbox_->OnWriteDone(ok); }

  void OnDone() override {
    if (wait_ != nullptr) wait_->Gone();
    if (job_ != nullptr) job_->Detach(rank_, outbox_.get());
    outbox_->Detach();
    delete this;
  }

 private:
  absl::Status Handle() {
    if (job_ == nullptr) {
      if (!in_.has_hello()) {
        return absl::InvalidArgumentError(
            "the first Session message must be hello{job, rank}");
      }
      absl::StatusOr<std::shared_ptr<JobState>> job =
          coordinator_->jobs().FindFor(in_.hello().job(), principal_);
      if (!job.ok()) return job.status();
      if (absl::Status s = (*job)->Attach(in_.hello().rank(),
                                          in_.hello().session_key(), outbox_);
          !s.ok()) {
        return s;
      }
      job_ = *job;
      rank_ = in_.hello().rank();
      return absl::OkStatus();
    }
    switch (in_.kind_case()) {
      case AgentMessage::kReport:
        return job_->OnReport(rank_, in_.report());
      case AgentMessage::kAck:
        return job_->OnAck(rank_, in_.ack());
      case AgentMessage::kHello:
        return absl::InvalidArgumentError("hello sent twice on one session");
      default:
        return absl::InvalidArgumentError("empty Session message");
    }
  }

  Coordinator* coordinator_;
  const std::string principal_;  // named caller, or empty
  std::shared_ptr<Outbox> outbox_;
  std::shared_ptr<PendingSessions::Wait> wait_;  // until the hello
  std::shared_ptr<JobState> job_;
  int rank_ = -1;
  grpc::ByteBuffer raw_in_;
  AgentMessage in_;
};

// A stream refused before it starts: finishes with `status` at once.
template <typename In, typename Out>
class RefusedStream final : public grpc::ServerBidiReactor<In, Out> {
 public:
  explicit RefusedStream(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerUnaryReactor* AgentServiceImpl::Register(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  grpc::Status s = DoRegister(*context, *request, response);
  if (!s.ok()) coordinator_->metrics().RpcError("Register", GrpcCodeName(s.error_code()));
  auto* reactor = context->DefaultReactor();
  reactor->Finish(s);
  return reactor;
}

grpc::Status AgentServiceImpl::DoRegister(const grpc::CallbackServerContext& context,
                                          const grpc::ByteBuffer& raw,
                                          grpc::ByteBuffer* raw_response) {
  Principal caller;
  if (grpc::Status s = auth_->CheckStatus(context, Role::kAgent, &caller); !s.ok()) return s;
  dynmo::v1::RegisterRequest request;
  if (grpc::Status s = Decode(raw, &request); !s.ok()) return s;
  dynmo::v1::RegisterResponse response;
  absl::StatusOr<std::shared_ptr<JobState>> job = coordinator_->jobs().Register(
      request, &response, caller.identified ? caller.name : "");
  if (!job.ok()) return ToGrpcStatus(job.status());
  return Encode(response, raw_response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AgentServiceImpl::Session(
    grpc::CallbackServerContext* context) {
  Principal caller;
  if (grpc::Status s = auth_->CheckStatus(*context, Role::kAgent, &caller); !s.ok()) {
    coordinator_->metrics().RpcError("Session", GrpcCodeName(s.error_code()));
    return new RefusedStream<grpc::ByteBuffer, grpc::ByteBuffer>(s);
  }
  return new SessionReactor(coordinator_, caller.identified ? caller.name : "", &pending_,
                            context->peer());
}

grpc::ServerUnaryReactor* AgentServiceImpl::RegisterHost(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  grpc::Status s = DoRegisterHost(*context, *request, response);
  if (!s.ok()) coordinator_->metrics().RpcError("RegisterHost", GrpcCodeName(s.error_code()));
  auto* reactor = context->DefaultReactor();
  reactor->Finish(s);
  return reactor;
}

grpc::Status AgentServiceImpl::DoRegisterHost(const grpc::CallbackServerContext& context,
                                              const grpc::ByteBuffer& raw,
                                              grpc::ByteBuffer* raw_response) {
  Principal caller;
  if (grpc::Status s = auth_->CheckStatus(context, Role::kAgent, &caller); !s.ok()) return s;
  dynmo::v1::RegisterHostRequest request;
  if (grpc::Status s = Decode(raw, &request); !s.ok()) return s;
  dynmo::v1::RegisterHostResponse response;
  absl::StatusOr<std::shared_ptr<JobState>> job = coordinator_->jobs().RegisterHost(
      request, &response, caller.identified ? caller.name : "");
  if (!job.ok()) return ToGrpcStatus(job.status());
  return Encode(response, raw_response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AgentServiceImpl::HostSession(
    grpc::CallbackServerContext* context) {
  Principal caller;
  if (grpc::Status s = auth_->CheckStatus(*context, Role::kAgent, &caller); !s.ok()) {
    coordinator_->metrics().RpcError("HostSession", GrpcCodeName(s.error_code()));
    return new RefusedStream<grpc::ByteBuffer, grpc::ByteBuffer>(s);
  }
  return NewHostSessionReactor(coordinator_, caller.identified ? caller.name : "", &pending_,
                               context->peer());
}

}  // namespace dynmo::service
