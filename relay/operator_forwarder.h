// OperatorForwarder: OperatorService for a node's ranks, each call passed
// upstream as it is (CallForwarder), so that the relay's socket is a rank's
// whole view of the coordinator: dynmo-train sets its job's policy and polls
// its status through it.
//
// Thread-safe (gRPC's callback threads call it); the CallForwarder and the
// channel outlive it.
#ifndef DYNMO_RELAY_OPERATOR_FORWARDER_H_
#define DYNMO_RELAY_OPERATOR_FORWARDER_H_

#include <memory>

#include "dynmo/v1/operator.grpc.pb.h"
#include "grpcpp/channel.h"
#include "relay/call_forwarder.h"

namespace dynmo::relay {

class OperatorForwarder final : public dynmo::v1::OperatorService::CallbackService {
 public:
  OperatorForwarder(CallForwarder* forwarder, std::shared_ptr<grpc::Channel> channel)
      : forwarder_(forwarder), stub_(dynmo::v1::OperatorService::NewStub(channel)) {}

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const dynmo::v1::ListJobsRequest* request,
                                     dynmo::v1::ListJobsResponse* response) override {
    return Pass(context, &Async::ListJobs, request, response);
  }
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const dynmo::v1::GetJobRequest* request,
                                   dynmo::v1::JobStatus* response) override {
    return Pass(context, &Async::GetJob, request, response);
  }
  grpc::ServerUnaryReactor* SetPolicy(grpc::CallbackServerContext* context,
                                      const dynmo::v1::SetPolicyRequest* request,
                                      dynmo::v1::SetPolicyResponse* response) override {
    return Pass(context, &Async::SetPolicy, request, response);
  }
  grpc::ServerUnaryReactor* Rebalance(grpc::CallbackServerContext* context,
                                      const dynmo::v1::RebalanceRequest* request,
                                      dynmo::v1::RebalanceResponse* response) override {
    return Pass(context, &Async::Rebalance, request, response);
  }
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const dynmo::v1::DeleteJobRequest* request,
                                      dynmo::v1::DeleteJobResponse* response) override {
    return Pass(context, &Async::DeleteJob, request, response);
  }

 private:
  // "class": the stub's async() hides the class of the same name.
  using Async = class dynmo::v1::OperatorService::Stub::async;
  template <typename Req, typename Resp>
  using Method = void (Async::*)(grpc::ClientContext*, const Req*, Resp*,
                                 std::function<void(grpc::Status)>);

  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Pass(grpc::CallbackServerContext* context,
                                 Method<Req, Resp> method, const Req* request,
                                 Resp* response) {
    return forwarder_->Forward(context,
                               AsyncCall(stub_->async(), method, request, response));
  }

  CallForwarder* const forwarder_;
  const std::unique_ptr<dynmo::v1::OperatorService::Stub> stub_;
};

}  // namespace dynmo::relay

#endif  // DYNMO_RELAY_OPERATOR_FORWARDER_H_
