#include "coordinator/service/agent_service.h"

#include <memory>
#include <string>
#include <utility>

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

  // The delivery's call: one rank's session needs no addressing.
  void SendTo(absl::Span<const int> /*ranks*/,
              std::shared_ptr<const CoordinatorMessage> message) override {
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
      case AgentMessage::kReport: {
        const UpstreamMessage one[] = {{rank_, &in_.report(), nullptr}};
        return job_->OnUpstream(one);
      }
      case AgentMessage::kAck: {
        const UpstreamMessage one[] = {{rank_, nullptr, &in_.ack()}};
        return job_->OnUpstream(one);
      }
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

grpc::Status AgentServiceImpl::Done(const char* method, const grpc::Status& status) {
  if (!status.ok()) coordinator_->metrics().RpcError(method, GrpcCodeName(status.error_code()));
  return status;
}

// Register and RegisterHost: the agents' credentials first, then the bytes,
// then `join(request, response, principal)` (the job registry's call).
template <typename Request, typename Response, typename Join>
grpc::ServerUnaryReactor* AgentServiceImpl::ServeRegistration(
    const char* method, grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response, Join join) {
  Principal caller;  // served inline: outlives the call below
  return ServeAdmittedRawUnary<Request, Response>(
      context, request, response,
      [&](const grpc::ServerContextBase& c) {
        return auth_->CheckStatus(c, Role::kAgent, &caller);
      },
      [&](const grpc::ServerContextBase&, const Request& rq, Response* rs) {
        return Done(method,
                    ToGrpcStatus(join(rq, rs, caller.identified ? caller.name : "").status()));
      },
      [&](const grpc::Status& s) { return Done(method, s); });
}

grpc::ServerUnaryReactor* AgentServiceImpl::Register(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return ServeRegistration<dynmo::v1::RegisterRequest, dynmo::v1::RegisterResponse>(
      "Register", context, request, response,
      [this](const auto& rq, auto* rs, const std::string& principal) {
        return coordinator_->jobs().Register(rq, rs, principal);
      });
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
  return ServeRegistration<dynmo::v1::RegisterHostRequest, dynmo::v1::RegisterHostResponse>(
      "RegisterHost", context, request, response,
      [this](const auto& rq, auto* rs, const std::string& principal) {
        return coordinator_->jobs().RegisterHost(rq, rs, principal);
      });
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
