#include "agent/operator_client.h"

#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"

namespace dynmo::agent {
namespace {

absl::Status ToStatus(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

void Prepare(grpc::ClientContext* ctx, const std::string& token) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  AddBearerToken(ctx, token);
}

}  // namespace

absl::StatusOr<OperatorClient> OperatorClient::Connect(
    const std::string& address, const ChannelOptions& channel, std::string token) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> ch = MakeChannel(address, channel);
  if (!ch.ok()) return ch.status();
  return OperatorClient(dynmo::v1::OperatorService::NewStub(*ch), std::move(token));
}

absl::Status OperatorClient::SetPolicy(const std::string& job,
                                       const JobPolicy& policy,
                                       absl::Duration patience) {
  dynmo::v1::SetPolicyRequest req;
  req.set_job(job);
  req.mutable_policy()->set_balancer(policy.balancer);
  req.mutable_policy()->set_trigger(policy.trigger);
  req.mutable_policy()->set_repack(policy.repack);
  req.mutable_policy()->set_repack_tolerance(policy.repack_tolerance);
  req.mutable_policy()->set_elastic(policy.elastic);
  const absl::Time give_up = absl::Now() + patience;
  while (true) {
    grpc::ClientContext ctx;
    Prepare(&ctx, token_);
    dynmo::v1::SetPolicyResponse resp;
    const grpc::Status s = stub_->SetPolicy(&ctx, req, &resp);
    const bool retry = s.error_code() == grpc::StatusCode::NOT_FOUND ||
                       s.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (!retry || absl::Now() >= give_up) return ToStatus(s, "SetPolicy");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

absl::StatusOr<int> OperatorClient::ConnectedRanks(const std::string& job) {
  grpc::ClientContext ctx;
  Prepare(&ctx, token_);
  dynmo::v1::GetJobRequest req;
  req.set_job(job);
  dynmo::v1::JobStatus st;
  const grpc::Status s = stub_->GetJob(&ctx, req, &st);
  if (!s.ok()) return ToStatus(s, "GetJob");
  return st.summary().connected_ranks();
}

}  // namespace dynmo::agent
