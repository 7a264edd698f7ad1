#include "relay/rank_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/server_callback.h"

namespace dynmo::relay {
namespace {

using dynmo::v1::AgentMessage;
using dynmo::v1::CoordinatorMessage;
// "class": the stub's async() hides the class of the same name.
using AgentAsync = class dynmo::v1::AgentService::Stub::async;

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

// One rank's Session: what the rank sends goes to Receive(); plan messages
// come down through `out`.
class RankServer::RankSession final
    : public grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage> {
 public:
  explicit RankSession(RankServer* server)
      : server_(server), out_(std::make_shared<RankOutbox>(this)) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      out_->Finish(grpc::Status::OK);  // the rank closed or the link broke
      return;
    }
    if (absl::Status s = server_->Receive(&rank_, out_, in_); !s.ok()) {
      out_->Finish(ToGrpc(s));
      return;
    }
    if (!out_->finishing()) StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { out_->OnWriteDone(ok); }

  void OnDone() override {
    if (rank_ >= 0) server_->Leave(rank_, out_.get());
    out_->Detach();
    delete this;
  }

 private:
  RankServer* const server_;
  const std::shared_ptr<RankOutbox> out_;
  AgentMessage in_;
  int rank_ = -1;  // set by the hello
};

RankServer::RankServer(absl::Mutex* mu, Membership* members, Upstream* upstream,
                       CallForwarder* forwarder, std::shared_ptr<grpc::Channel> channel,
                       std::string job)
    : mu_(mu),
      members_(members),
      upstream_(upstream),
      forwarder_(forwarder),
      stub_(dynmo::v1::AgentService::NewStub(std::move(channel))),
      job_(std::move(job)) {}

grpc::ServerUnaryReactor* RankServer::Register(grpc::CallbackServerContext* context,
                                               const dynmo::v1::RegisterRequest* request,
                                               dynmo::v1::RegisterResponse* response) {
  if (request->job() != job_) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("this node relay serves job '", job_, "', not '", request->job(), "'")));
    return reactor;
  }
  const int rank = request->rank();
  return forwarder_->Forward(
      context,
      AsyncCall(stub_->async(), &AgentAsync::Register, request, response),
      [this, rank, response] {
        std::shared_ptr<RankOutbox> stale;
        {
          absl::MutexLock lock(mu_);
          stale = members_->Registered(rank, response->session_key());
        }
        if (stale != nullptr) {
          stale->Finish(grpc::Status(grpc::StatusCode::ABORTED,
                                     "the rank registered again: this session is stale"));
        }
      });
}

grpc::ServerBidiReactor<AgentMessage, CoordinatorMessage>* RankServer::Session(
    grpc::CallbackServerContext* /*context*/) {
  return new RankSession(this);
}

absl::Status RankServer::Receive(int* rank, const std::shared_ptr<RankOutbox>& out,
                                 const AgentMessage& m) {
  std::shared_ptr<RankOutbox> replaced;
  {
    absl::MutexLock lock(mu_);
    if (absl::Status s = members_->Receive(rank, out, m, &replaced); !s.ok()) return s;
  }
  if (replaced != nullptr && replaced != out) {
    replaced->Finish(grpc::Status(
        grpc::StatusCode::ABORTED,
        absl::StrCat("replaced by a newer session of rank ", *rank)));
  }
  upstream_->Kick();
  return absl::OkStatus();
}

void RankServer::Leave(int rank, const RankOutbox* out) {
  absl::MutexLock lock(mu_);
  members_->Leave(rank, out);
}

}  // namespace dynmo::relay
