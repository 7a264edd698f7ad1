#include "coordinator/service/agent_service.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "coordinator/service/host_session.h"
#include "coordinator/job/session_sink.h"
#include "rpc/stream_outbox.h"
#include "coordinator/job/validation.h"
#include "coordinator/service/grpc_status.h"

namespace dynmo::service {
namespace {

using dynmo::v1::AgentMessage;
using dynmo::v1::CoordinatorMessage;

class SessionReactor;

// A one-rank Session's sink: the stream's outbox.
class Outbox final : public SessionSink {
 public:
  explicit Outbox(
      grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage>* reactor)
      : stream_(reactor) {}

  void Send(std::shared_ptr<const CoordinatorMessage> message) override {
    stream_.Write(std::move(message));
  }
  void Close(const absl::Status& status) override {
    stream_.Finish(ToGrpcStatus(status));
  }
  void Finish(const grpc::Status& status) { stream_.Finish(status); }
  void OnWriteDone(bool ok) { stream_.OnWriteDone(ok); }
  bool finishing() { return stream_.finishing(); }
  void Detach() { stream_.Detach(); }

 private:
  rpc::StreamOutbox<AgentMessage, CoordinatorMessage> stream_;
};

class SessionReactor final
    : public grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage> {
 public:
  explicit SessionReactor(Coordinator* coordinator)
      : coordinator_(coordinator), outbox_(std::make_shared<Outbox>(this)) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The agent closed its side or the connection broke.
      outbox_->Finish(grpc::Status::OK);
      return;
    }
    absl::Status s = Handle();
    if (!s.ok()) {
      coordinator_->metrics().RpcError(
          "Session", GrpcCodeName(static_cast<grpc::StatusCode>(s.code())));
      outbox_->Finish(ToGrpcStatus(s));
      return;
    }
    // A superseded session was finished meanwhile: start nothing new.
    if (!outbox_->finishing()) StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { outbox_->OnWriteDone(ok); }

  void OnDone() override {
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
          coordinator_->jobs().Find(in_.hello().job());
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
  std::shared_ptr<Outbox> outbox_;
  std::shared_ptr<JobState> job_;
  int rank_ = -1;
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

grpc::ServerUnaryReactor* AgentServiceImpl::Register(
    grpc::CallbackServerContext* context,
    const dynmo::v1::RegisterRequest* request,
    dynmo::v1::RegisterResponse* response) {
  auto* reactor = context->DefaultReactor();
  Principal caller;
  if (grpc::Status s = auth_->CheckStatus(*context, Role::kAgent, &caller); !s.ok()) {
    coordinator_->metrics().RpcError("Register", GrpcCodeName(s.error_code()));
    reactor->Finish(s);
    return reactor;
  }
  absl::StatusOr<std::shared_ptr<JobState>> job = coordinator_->jobs().Register(
      *request, response, caller.identified ? caller.name : "");
  if (!job.ok()) {
    coordinator_->metrics().RpcError(
        "Register",
        GrpcCodeName(static_cast<grpc::StatusCode>(job.status().code())));
  }
  reactor->Finish(ToGrpcStatus(job.status()));
  return reactor;
}

grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage>*
AgentServiceImpl::Session(grpc::CallbackServerContext* context) {
  if (grpc::Status s = auth_->CheckStatus(*context, Role::kAgent); !s.ok()) {
    coordinator_->metrics().RpcError("Session", GrpcCodeName(s.error_code()));
    return new RefusedStream<AgentMessage, CoordinatorMessage>(s);
  }
  return new SessionReactor(coordinator_);
}

grpc::ServerUnaryReactor* AgentServiceImpl::RegisterHost(
    grpc::CallbackServerContext* context,
    const dynmo::v1::RegisterHostRequest* request,
    dynmo::v1::RegisterHostResponse* response) {
  auto* reactor = context->DefaultReactor();
  Principal caller;
  if (grpc::Status s = auth_->CheckStatus(*context, Role::kAgent, &caller); !s.ok()) {
    coordinator_->metrics().RpcError("RegisterHost", GrpcCodeName(s.error_code()));
    reactor->Finish(s);
    return reactor;
  }
  absl::StatusOr<std::shared_ptr<JobState>> job = coordinator_->jobs().RegisterHost(
      *request, response, caller.identified ? caller.name : "");
  if (!job.ok()) {
    response->Clear();
    coordinator_->metrics().RpcError(
        "RegisterHost",
        GrpcCodeName(static_cast<grpc::StatusCode>(job.status().code())));
  }
  reactor->Finish(ToGrpcStatus(job.status()));
  return reactor;
}

grpc::ServerBidiReactor<dynmo::v1::HostMessage,
                        dynmo::v1::HostCoordinatorMessage>*
AgentServiceImpl::HostSession(grpc::CallbackServerContext* context) {
  if (grpc::Status s = auth_->CheckStatus(*context, Role::kAgent); !s.ok()) {
    coordinator_->metrics().RpcError("HostSession", GrpcCodeName(s.error_code()));
    return new RefusedStream<dynmo::v1::HostMessage, dynmo::v1::HostCoordinatorMessage>(s);
  }
  return NewHostSessionReactor(coordinator_);
}

}  // namespace dynmo::service
