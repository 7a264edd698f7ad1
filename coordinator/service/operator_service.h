// OperatorServiceImpl: dynmo.v1.OperatorService over the job registry.
// Every call checks the bearer token first, then looks the job up (NOT_FOUND
// names it), then does one thing.
#ifndef DYNMO_COORDINATOR_SERVICE_OPERATOR_SERVICE_H_
#define DYNMO_COORDINATOR_SERVICE_OPERATOR_SERVICE_H_

#include "coordinator/service/auth.h"
#include "coordinator/service/coordinator.h"
#include "dynmo/v1/operator.grpc.pb.h"

namespace dynmo::service {

class OperatorServiceImpl final : public dynmo::v1::OperatorService::Service {
 public:
  OperatorServiceImpl(Coordinator* coordinator, const Authenticator* auth)
      : coordinator_(coordinator), auth_(auth) {}

  grpc::Status ListJobs(grpc::ServerContext* context,
                        const dynmo::v1::ListJobsRequest* request,
                        dynmo::v1::ListJobsResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context,
                      const dynmo::v1::GetJobRequest* request,
                      dynmo::v1::JobStatus* response) override;
  grpc::Status SetPolicy(grpc::ServerContext* context,
                         const dynmo::v1::SetPolicyRequest* request,
                         dynmo::v1::SetPolicyResponse* response) override;
  grpc::Status Rebalance(grpc::ServerContext* context,
                         const dynmo::v1::RebalanceRequest* request,
                         dynmo::v1::RebalanceResponse* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context,
                         const dynmo::v1::DeleteJobRequest* request,
                         dynmo::v1::DeleteJobResponse* response) override;

 private:
  grpc::Status Done(const char* method, const grpc::Status& status);

  Coordinator* coordinator_;
  const Authenticator* auth_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_OPERATOR_SERVICE_H_
