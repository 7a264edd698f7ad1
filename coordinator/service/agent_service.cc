#include "coordinator/service/agent_service.h"

#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/session_sink.h"
#include "coordinator/service/validation.h"

namespace dynmo::service {
namespace {

using dynmo::v1::AgentMessage;
using dynmo::v1::CoordinatorMessage;

class SessionReactor;

// The write side of one Session stream: a queue in front of the reactor's
// single outstanding write. Outlives the reactor (jobs hold it), so every
// use checks that the reactor is still there.
class Outbox final : public SessionSink {
 public:
  explicit Outbox(
      grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage>* reactor)
      : reactor_(reactor) {}

  void Send(std::shared_ptr<const CoordinatorMessage> message) override {
    grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage>* start = nullptr;
    const CoordinatorMessage* first = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finishing_) return;
      queue_.push_back(std::move(message));
      if (!writing_) {
        writing_ = true;
        start = reactor_;
        first = queue_.front().get();
      }
    }
    // Outside the lock: gRPC may run reactions inline.
    if (start != nullptr) start->StartWrite(first);
  }

  void Close(const absl::Status& status) override {
    Finish(ToGrpcStatus(status));
  }

  void Finish(const grpc::Status& status) {
    grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage>* r = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finishing_) return;
      finishing_ = true;
      if (writing_) {
        pending_finish_ = status;  // after the write in flight completes
        return;
      }
      r = reactor_;
    }
    r->Finish(status);
  }

  void OnWriteDone(bool ok) {
    grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage>* r = nullptr;
    const CoordinatorMessage* next = nullptr;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) queue_.clear();  // the stream is broken: nothing more goes out
      if (!queue_.empty() && !(finishing_ && pending_finish_)) {
        next = queue_.front().get();
        r = reactor_;
      } else {
        writing_ = false;
        if (pending_finish_) {
          finish = pending_finish_;
          pending_finish_.reset();
          r = reactor_;
        }
      }
    }
    if (next != nullptr) {
      r->StartWrite(next);
    } else if (finish) {
      r->Finish(*finish);
    }
  }

  bool finishing() {
    absl::MutexLock lock(&mu_);
    return finishing_;
  }

  // The reactor is gone (OnDone): drop everything from now on.
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
    queue_.clear();
  }

 private:
  absl::Mutex mu_;
  grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage>* reactor_
      ABSL_GUARDED_BY(mu_);
  // Front = the write in flight; shared_ptr keeps it alive until done.
  std::deque<std::shared_ptr<const CoordinatorMessage>> queue_
      ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
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
      if (absl::Status s = (*job)->Attach(in_.hello().rank(), outbox_);
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

}  // namespace

grpc::ServerUnaryReactor* AgentServiceImpl::Register(
    grpc::CallbackServerContext* context,
    const dynmo::v1::RegisterRequest* request,
    dynmo::v1::RegisterResponse* response) {
  auto* reactor = context->DefaultReactor();
  absl::StatusOr<std::shared_ptr<JobState>> job =
      coordinator_->jobs().Register(*request, response);
  if (!job.ok()) {
    coordinator_->metrics().RpcError(
        "Register",
        GrpcCodeName(static_cast<grpc::StatusCode>(job.status().code())));
  }
  reactor->Finish(ToGrpcStatus(job.status()));
  return reactor;
}

grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage>*
AgentServiceImpl::Session(grpc::CallbackServerContext* /*context*/) {
  return new SessionReactor(coordinator_);
}

}  // namespace dynmo::service
