#include "coordinator/service/operator_service.h"

#include "coordinator/job/validation.h"
#include "coordinator/service/grpc_status.h"
#include "coordinator/service/raw_message.h"

namespace dynmo::service {

grpc::Status OperatorServiceImpl::Done(const char* method,
                                       const grpc::Status& status) {
  if (!status.ok()) {
    coordinator_->metrics().RpcError(method,
                                     GrpcCodeName(status.error_code()));
  }
  return status;
}

DYNMO_SERVE_RAW_UNARY(OperatorServiceImpl, ListJobs, ListJobsRequest, ListJobsResponse)
DYNMO_SERVE_RAW_UNARY(OperatorServiceImpl, GetJob, GetJobRequest, JobStatus)
DYNMO_SERVE_RAW_UNARY(OperatorServiceImpl, SetPolicy, SetPolicyRequest, SetPolicyResponse)
DYNMO_SERVE_RAW_UNARY(OperatorServiceImpl, Rebalance, RebalanceRequest, RebalanceResponse)
DYNMO_SERVE_RAW_UNARY(OperatorServiceImpl, DeleteJob, DeleteJobRequest, DeleteJobResponse)

grpc::Status OperatorServiceImpl::ServeListJobs(
    const grpc::ServerContextBase& context, const dynmo::v1::ListJobsRequest& /*request*/,
    dynmo::v1::ListJobsResponse* response) {
  if (grpc::Status s = auth_->CheckStatus(context, Role::kOperator); !s.ok()) {
    return Done("ListJobs", s);
  }
  for (const auto& job : coordinator_->jobs().All()) {
    *response->add_jobs() = job->Summary();
  }
  return grpc::Status::OK;
}

grpc::Status OperatorServiceImpl::ServeGetJob(const grpc::ServerContextBase& context,
                                         const dynmo::v1::GetJobRequest& request,
                                         dynmo::v1::JobStatus* response) {
  if (grpc::Status s = auth_->CheckStatus(context, Role::kOperator); !s.ok()) return Done("GetJob", s);
  if (absl::Status s = ValidateJobName(request.job()); !s.ok()) {
    return Done("GetJob", ToGrpcStatus(s));
  }
  absl::StatusOr<std::shared_ptr<JobState>> job =
      coordinator_->jobs().Find(request.job());
  if (!job.ok()) return Done("GetJob", ToGrpcStatus(job.status()));
  *response = (*job)->Status();
  return grpc::Status::OK;
}

grpc::Status OperatorServiceImpl::ServeSetPolicy(
    const grpc::ServerContextBase& context, const dynmo::v1::SetPolicyRequest& request,
    dynmo::v1::SetPolicyResponse* response) {
  if (grpc::Status s = auth_->CheckStatus(context, Role::kOperator); !s.ok()) {
    return Done("SetPolicy", s);
  }
  if (absl::Status s = ValidateJobName(request.job()); !s.ok()) {
    return Done("SetPolicy", ToGrpcStatus(s));
  }
  absl::StatusOr<std::shared_ptr<JobState>> job =
      coordinator_->jobs().Find(request.job());
  if (!job.ok()) return Done("SetPolicy", ToGrpcStatus(job.status()));
  absl::StatusOr<dynmo::v1::Policy> policy =
      (*job)->SetPolicy(request.policy());
  if (!policy.ok()) return Done("SetPolicy", ToGrpcStatus(policy.status()));
  *response->mutable_policy() = *policy;
  return grpc::Status::OK;
}

grpc::Status OperatorServiceImpl::ServeRebalance(
    const grpc::ServerContextBase& context, const dynmo::v1::RebalanceRequest& request,
    dynmo::v1::RebalanceResponse* response) {
  if (grpc::Status s = auth_->CheckStatus(context, Role::kOperator); !s.ok()) {
    return Done("Rebalance", s);
  }
  if (absl::Status s = ValidateJobName(request.job()); !s.ok()) {
    return Done("Rebalance", ToGrpcStatus(s));
  }
  absl::StatusOr<std::shared_ptr<JobState>> job =
      coordinator_->jobs().Find(request.job());
  if (!job.ok()) return Done("Rebalance", ToGrpcStatus(job.status()));
  absl::StatusOr<dynmo::v1::RebalanceResponse> r =
      (*job)->Rebalance(absl::Now());
  if (!r.ok()) return Done("Rebalance", ToGrpcStatus(r.status()));
  *response = *r;
  return grpc::Status::OK;
}

grpc::Status OperatorServiceImpl::ServeDeleteJob(
    const grpc::ServerContextBase& context, const dynmo::v1::DeleteJobRequest& request,
    dynmo::v1::DeleteJobResponse* response) {
  if (grpc::Status s = auth_->CheckStatus(context, Role::kOperator); !s.ok()) {
    return Done("DeleteJob", s);
  }
  if (absl::Status s = ValidateJobName(request.job()); !s.ok()) {
    return Done("DeleteJob", ToGrpcStatus(s));
  }
  absl::StatusOr<int> closed =
      coordinator_->jobs().Delete(request.job(), request.force());
  if (!closed.ok()) return Done("DeleteJob", ToGrpcStatus(closed.status()));
  response->set_closed_sessions(*closed);
  return grpc::Status::OK;
}

}  // namespace dynmo::service
