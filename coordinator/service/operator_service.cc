#include "coordinator/service/operator_service.h"

#include "absl/strings/str_cat.h"
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

grpc::Status OperatorServiceImpl::Caller(const grpc::ServerContextBase& context,
                                         const std::string& job, Principal* caller) const {
  if (grpc::Status s = auth_->CheckStatus(context, Role::kOperator, caller); !s.ok()) return s;
  if (absl::Status s = ValidateJobName(job); !s.ok()) return ToGrpcStatus(s);
  return grpc::Status::OK;
}

grpc::Status OperatorServiceImpl::Scope(const Principal& caller, const std::string& job,
                                        const std::string& owner) const {
  if (auth_->MayAct(caller, owner)) return grpc::Status::OK;
  return ToGrpcStatus(absl::PermissionDeniedError(absl::StrCat(
      "principal '", caller.name, "' (tenant '", caller.tenant_or_name(),
      "') may not act on job ", job, " of principal '", owner,
      "': operators act on their own tenant's jobs, admins on every job")));
}

grpc::Status OperatorServiceImpl::FindJob(const grpc::ServerContextBase& context,
                                          const std::string& job,
                                          std::shared_ptr<JobState>* found) const {
  Principal caller;
  if (grpc::Status s = Caller(context, job, &caller); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<JobState>> j = coordinator_->jobs().Find(job);
  if (!j.ok()) return ToGrpcStatus(j.status());
  if (grpc::Status s = Scope(caller, job, (*j)->owner()); !s.ok()) return s;
  *found = *std::move(j);
  return grpc::Status::OK;
}

grpc::Status OperatorServiceImpl::ServeListJobs(
    const grpc::ServerContextBase& context, const dynmo::v1::ListJobsRequest& /*request*/,
    dynmo::v1::ListJobsResponse* response) {
  Principal caller;
  if (grpc::Status s = auth_->CheckStatus(context, Role::kOperator, &caller); !s.ok()) return s;
  for (const auto& job : coordinator_->jobs().All()) {
    if (auth_->MayAct(caller, job->owner())) *response->add_jobs() = job->Summary();
  }
  return grpc::Status::OK;
}

grpc::Status OperatorServiceImpl::ServeGetJob(const grpc::ServerContextBase& context,
                                              const dynmo::v1::GetJobRequest& request,
                                              dynmo::v1::JobStatus* response) {
  std::shared_ptr<JobState> job;
  if (grpc::Status s = FindJob(context, request.job(), &job); !s.ok()) return s;
  *response = job->Status();
  return grpc::Status::OK;
}

grpc::Status OperatorServiceImpl::ServeSetPolicy(
    const grpc::ServerContextBase& context, const dynmo::v1::SetPolicyRequest& request,
    dynmo::v1::SetPolicyResponse* response) {
  std::shared_ptr<JobState> job;
  if (grpc::Status s = FindJob(context, request.job(), &job); !s.ok()) return s;
  absl::StatusOr<dynmo::v1::Policy> policy = job->SetPolicy(request.policy());
  if (!policy.ok()) return ToGrpcStatus(policy.status());
  *response->mutable_policy() = *policy;
  return grpc::Status::OK;
}

grpc::Status OperatorServiceImpl::ServeRebalance(
    const grpc::ServerContextBase& context, const dynmo::v1::RebalanceRequest& request,
    dynmo::v1::RebalanceResponse* response) {
  std::shared_ptr<JobState> job;
  if (grpc::Status s = FindJob(context, request.job(), &job); !s.ok()) return s;
  absl::StatusOr<dynmo::v1::RebalanceResponse> r = job->Rebalance(absl::Now());
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *r;
  return grpc::Status::OK;
}

grpc::Status OperatorServiceImpl::ServeDeleteJob(
    const grpc::ServerContextBase& context, const dynmo::v1::DeleteJobRequest& request,
    dynmo::v1::DeleteJobResponse* response) {
  Principal caller;
  if (grpc::Status s = Caller(context, request.job(), &caller); !s.ok()) return s;
  // The owner of what the name holds: a job, or a deleted job's name. A
  // quarantined job's record is unusable, so only an admin (or a
  // coordinator without identities) deletes it.
  JobRegistry& jobs = coordinator_->jobs();
  std::string owner;
  if (absl::StatusOr<std::shared_ptr<JobState>> j = jobs.Find(request.job()); j.ok()) {
    owner = (*j)->owner();
  } else if (std::optional<std::string> kept = jobs.TombstoneOwner(request.job())) {
    owner = *kept;
  } else if (j.status().code() != absl::StatusCode::kDataLoss) {
    return ToGrpcStatus(j.status());
  }
  if (grpc::Status s = Scope(caller, request.job(), owner); !s.ok()) return s;
  absl::StatusOr<int> closed = jobs.Delete(request.job(), request.force(), request.release_name());
  if (!closed.ok()) return ToGrpcStatus(closed.status());
  response->set_closed_sessions(*closed);
  return grpc::Status::OK;
}

}  // namespace dynmo::service
