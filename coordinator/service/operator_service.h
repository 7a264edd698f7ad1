// OperatorServiceImpl: dynmo.v1.OperatorService over the job registry.
// Every call takes one prologue: the caller's credentials and operator role,
// the job name's form, the job looked up (NOT_FOUND names it; DATA_LOSS a
// quarantined one), the caller's scope (an operator acts on its tenant's
// jobs, an admin on all: auth.h); then it does one thing. ListJobs lists
// the jobs in the caller's scope. Requests arrive as raw bytes on the
// callback API (raw_message.h: bytes that do not decode are
// INVALID_ARGUMENT) and are served inline: no call waits on another.
// Thread-safe (the registry and the jobs lock themselves).
#ifndef DYNMO_COORDINATOR_SERVICE_OPERATOR_SERVICE_H_
#define DYNMO_COORDINATOR_SERVICE_OPERATOR_SERVICE_H_

#include <memory>
#include <string>

#include "coordinator/service/auth.h"
#include "coordinator/service/coordinator.h"
#include "dynmo/v1/operator.grpc.pb.h"

namespace dynmo::service {

using OperatorServiceBase = dynmo::v1::OperatorService::WithRawCallbackMethod_ListJobs<
    dynmo::v1::OperatorService::WithRawCallbackMethod_GetJob<
        dynmo::v1::OperatorService::WithRawCallbackMethod_SetPolicy<
            dynmo::v1::OperatorService::WithRawCallbackMethod_Rebalance<
                dynmo::v1::OperatorService::WithRawCallbackMethod_DeleteJob<
                    dynmo::v1::OperatorService::Service>>>>>;

class OperatorServiceImpl final : public OperatorServiceBase {
 public:
  OperatorServiceImpl(Coordinator* coordinator, const Authenticator* auth)
      : coordinator_(coordinator), auth_(auth) {}

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SetPolicy(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Rebalance(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;

 private:
  // The methods, on decoded messages.
  grpc::Status ServeListJobs(const grpc::ServerContextBase& context,
                             const dynmo::v1::ListJobsRequest& request,
                             dynmo::v1::ListJobsResponse* response);
  grpc::Status ServeGetJob(const grpc::ServerContextBase& context,
                           const dynmo::v1::GetJobRequest& request,
                           dynmo::v1::JobStatus* response);
  grpc::Status ServeSetPolicy(const grpc::ServerContextBase& context,
                              const dynmo::v1::SetPolicyRequest& request,
                              dynmo::v1::SetPolicyResponse* response);
  grpc::Status ServeRebalance(const grpc::ServerContextBase& context,
                              const dynmo::v1::RebalanceRequest& request,
                              dynmo::v1::RebalanceResponse* response);
  grpc::Status ServeDeleteJob(const grpc::ServerContextBase& context,
                              const dynmo::v1::DeleteJobRequest& request,
                              dynmo::v1::DeleteJobResponse* response);
  // The prologue: credentials and role, then the job name's form.
  grpc::Status Caller(const grpc::ServerContextBase& context, const std::string& job,
                      Principal* caller) const;
  // PERMISSION_DENIED unless `caller` may act on a job of `owner`.
  grpc::Status Scope(const Principal& caller, const std::string& job,
                     const std::string& owner) const;
  // The whole prologue for a call on one existing job.
  grpc::Status FindJob(const grpc::ServerContextBase& context, const std::string& job,
                       std::shared_ptr<JobState>* found) const;
  // Counts a failed call of `method` in /metrics; returns `status`.
  grpc::Status Done(const char* method, const grpc::Status& status);

  Coordinator* coordinator_;
  const Authenticator* auth_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_OPERATOR_SERVICE_H_
