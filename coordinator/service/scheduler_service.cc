#include "coordinator/service/scheduler_service.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/job/validation.h"
#include "coordinator/service/grpc_status.h"
#include "coordinator/service/raw_message.h"

namespace dynmo::service {
namespace {

// The lease holder of a Claim / Return: an identified caller (principals
// file) IS the holder — it may leave `holder` empty or name itself, never
// another; with shared tokens or no auth the request names it.
absl::StatusOr<std::string> HolderOf(const Principal& caller, const std::string& holder) {
  if (!caller.identified) return holder;
  if (!holder.empty() && holder != caller.name) {
    return absl::PermissionDeniedError(absl::StrCat(
        "holder '", holder, "' is not the caller: principal '", caller.name,
        "' claims and returns as itself"));
  }
  return caller.name;
}

}  // namespace

grpc::Status SchedulerServiceImpl::Done(const char* method,
                                        const grpc::Status& status) {
  if (!status.ok()) {
    coordinator_->metrics().RpcError(method,
                                     GrpcCodeName(status.error_code()));
  }
  return status;
}

DYNMO_SERVE_RAW_UNARY(SchedulerServiceImpl, ListReleased, ListReleasedRequest,
                      ListReleasedResponse)
DYNMO_SERVE_RAW_UNARY(SchedulerServiceImpl, ListPlacements, ListPlacementsRequest,
                      ListPlacementsResponse)
DYNMO_SERVE_RAW_UNARY(SchedulerServiceImpl, Claim, ClaimRequest, ClaimResponse)
DYNMO_SERVE_RAW_UNARY(SchedulerServiceImpl, Return, ReturnRequest, ReturnResponse)

grpc::Status SchedulerServiceImpl::ServeListReleased(
    const grpc::ServerContextBase& context, const dynmo::v1::ListReleasedRequest& request,
    dynmo::v1::ListReleasedResponse* response) {
  if (grpc::Status s = auth_->CheckStatus(context, Role::kScheduler); !s.ok()) {
    return s;
  }
  if (!request.job().empty()) {
    if (absl::Status s = ValidateJobName(request.job()); !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  for (auto& g :
       coordinator_->pool().List(request.job(), request.include_claimed())) {
    *response->add_gpus() = std::move(g);
  }
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::ServeListPlacements(
    const grpc::ServerContextBase& context, const dynmo::v1::ListPlacementsRequest& request,
    dynmo::v1::ListPlacementsResponse* response) {
  if (grpc::Status s = auth_->CheckStatus(context, Role::kScheduler); !s.ok()) {
    return s;
  }
  std::vector<std::shared_ptr<JobState>> jobs;
  if (request.job().empty()) {
    jobs = coordinator_->jobs().All();
  } else {
    if (absl::Status s = ValidateJobName(request.job()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    absl::StatusOr<std::shared_ptr<JobState>> job = coordinator_->jobs().Find(request.job());
    if (!job.ok()) return ToGrpcStatus(job.status());
    jobs.push_back(*std::move(job));
  }
  for (const auto& job : jobs) {
    for (auto& p : job->Placements()) *response->add_placements() = std::move(p);
  }
  return grpc::Status::OK;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* SchedulerServiceImpl::WatchReleased(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  dynmo::v1::WatchReleasedRequest request;
  grpc::Status refused = Decode(*raw_request, &request);
  if (refused.ok()) refused = auth_->CheckStatus(*context, Role::kScheduler);
  if (refused.ok()) return watchers_.Open(request.include_claimed());
  return ReleasedWatchers::Refused(Done("WatchReleased", refused));
}

grpc::Status SchedulerServiceImpl::ServeClaim(const grpc::ServerContextBase& context,
                                         const dynmo::v1::ClaimRequest& request,
                                         dynmo::v1::ClaimResponse* response) {
  Principal caller;
  if (grpc::Status s = auth_->CheckStatus(context, Role::kScheduler, &caller); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> holder = HolderOf(caller, request.holder());
  if (!holder.ok()) return ToGrpcStatus(holder.status());
  std::vector<std::string> ids(request.ids().begin(), request.ids().end());
  absl::StatusOr<std::vector<dynmo::v1::ReleasedGpu>> gpus =
      coordinator_->pool().Claim(ids, *holder, request.lease_seconds(), absl::Now());
  if (!gpus.ok()) return ToGrpcStatus(gpus.status());
  for (auto& g : *gpus) *response->add_gpus() = std::move(g);
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::ServeReturn(
    const grpc::ServerContextBase& context, const dynmo::v1::ReturnRequest& request,
    dynmo::v1::ReturnResponse* response) {
  Principal caller;
  if (grpc::Status s = auth_->CheckStatus(context, Role::kScheduler, &caller); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::string> holder = HolderOf(caller, request.holder());
  if (!holder.ok()) return ToGrpcStatus(holder.status());
  std::vector<std::string> ids(request.ids().begin(), request.ids().end());
  absl::StatusOr<std::vector<dynmo::v1::ReleasedGpu>> gpus =
      coordinator_->pool().Return(ids, *holder);
  if (!gpus.ok()) return ToGrpcStatus(gpus.status());
  for (auto& g : *gpus) *response->add_gpus() = std::move(g);
  return grpc::Status::OK;
}

}  // namespace dynmo::service
