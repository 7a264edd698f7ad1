// The gRPC surface of an in-process CoordinatorServer: validation of every
// RPC, the bearer token, health checking, reflection, /metrics.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "agent/host_agent.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tests/service/grpc_api_helpers.h"

namespace dynmo::service {
namespace {

TEST_F(GrpcApiTest, MalformedRegistrationsAreInvalidAndCreateNothing) {
  StartServer("");
  auto r = Reg(0);
  r.set_job("bad name!");
  EXPECT_EQ(Register(r).error_code(), grpc::INVALID_ARGUMENT);
  r = Reg(0);
  r.set_rank(7);
  EXPECT_EQ(Register(r).error_code(), grpc::INVALID_ARGUMENT);
  r = Reg(0);
  r.set_num_layers(1);  // fewer layers than stages
  EXPECT_EQ(Register(r).error_code(), grpc::INVALID_ARGUMENT);
  r = Reg(0);
  r.add_boundaries(0);
  r.add_boundaries(5);
  r.add_boundaries(4);
  EXPECT_EQ(Register(r).error_code(), grpc::INVALID_ARGUMENT);
  r = Reg(0);
  r.set_pipeline_size(100000);
  r.set_data_parallel_size(100000);
  EXPECT_EQ(Register(r).error_code(), grpc::INVALID_ARGUMENT);
  // 60 bytes asking for a 65536 x 65536 cost table.
  r = Reg(0);
  r.set_pipeline_size(1);
  r.set_data_parallel_size(65536);
  r.set_num_layers(65536);
  EXPECT_EQ(Register(r).error_code(), grpc::INVALID_ARGUMENT);
  // An epoch that would wrap the next one to 0.
  r = Reg(0);
  r.set_applied_epoch(~uint64_t{0});
  EXPECT_EQ(Register(r).error_code(), grpc::INVALID_ARGUMENT);
  r = Reg(0);
  r.set_memory_capacity_bytes(int64_t{1} << 62);
  EXPECT_EQ(Register(r).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_TRUE(server_->coordinator().jobs().All().empty());
}

TEST_F(GrpcApiTest, ShapeMismatchIsFailedPrecondition) {
  StartServer("");
  ASSERT_TRUE(Register(Reg(0)).ok());
  auto r = Reg(1);
  r.set_num_layers(6);
  grpc::Status s = Register(r);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("layers"), std::string::npos);
}

TEST_F(GrpcApiTest, SessionsValidateEveryMessage) {
  StartServer("");
  ASSERT_TRUE(Register(Reg(0)).ok());
  dynmo::v1::AgentMessage hello;
  hello.mutable_hello()->set_job("api");
  hello.mutable_hello()->set_rank(0);
  dynmo::v1::AgentMessage report;
  report.mutable_report()->set_iteration(1);
  EXPECT_EQ(Session({report}).error_code(), grpc::INVALID_ARGUMENT)
      << "the first message must be hello";
  dynmo::v1::AgentMessage unknown = hello;
  unknown.mutable_hello()->set_job("nope");
  EXPECT_EQ(Session({unknown}).error_code(), grpc::NOT_FOUND);
  dynmo::v1::AgentMessage unregistered = hello;
  unregistered.mutable_hello()->set_rank(1);
  EXPECT_EQ(Session({unregistered}).error_code(), grpc::FAILED_PRECONDITION);
  // Another client cannot speak for rank 0 without its session key.
  dynmo::v1::AgentMessage hijack = hello;
  hijack.mutable_hello()->set_session_key("0123456789abcdef0123456789abcdef");
  grpc::Status denied = Session({hijack});
  EXPECT_EQ(denied.error_code(), grpc::PERMISSION_DENIED) << denied.error_message();
  dynmo::v1::AgentMessage nan = report;
  auto* l = nan.mutable_report()->add_layers();
  l->set_layer(0);
  l->set_fwd_s(std::numeric_limits<double>::quiet_NaN());
  grpc::Status s = Session({hello, nan});
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("finite"), std::string::npos);
  dynmo::v1::AgentMessage too_many = report;
  for (int i = 0; i < 5; ++i) too_many.mutable_report()->add_layers()->set_layer(i % 4);
  EXPECT_EQ(Session({hello, too_many}).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_TRUE(Session({hello, report}).ok());
  auto job = server_->coordinator().jobs().Find("api");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ((*job)->Summary().reports(), 1) << "only the valid report counted";
}

TEST_F(GrpcApiTest, OversizedMessagesAreRejected) {
  StartServer("");
  auto r = Reg(0);
  r.set_host(std::string(5 << 20, 'x'));  // over the 4 MiB limit
  EXPECT_EQ(Register(r).error_code(), grpc::RESOURCE_EXHAUSTED);
  r.set_host(std::string(1000, 'x'));     // under it, over the field limit
  EXPECT_EQ(Register(r).error_code(), grpc::INVALID_ARGUMENT);
}

TEST_F(GrpcApiTest, OperatorErrorsNameTheProblem) {
  StartServer("");
  grpc::ClientContext ctx;
  dynmo::v1::GetJobRequest req;
  req.set_job("missing");
  dynmo::v1::JobStatus st;
  grpc::Status s = ops_->GetJob(&ctx, req, &st);
  EXPECT_EQ(s.error_code(), grpc::NOT_FOUND);
  EXPECT_NE(s.error_message().find("missing"), std::string::npos);
  ASSERT_TRUE(Register(Reg(0)).ok());
  grpc::ClientContext ctx2;
  dynmo::v1::SetPolicyRequest sp;
  sp.set_job("api");
  sp.mutable_policy()->set_trigger("every:0");
  dynmo::v1::SetPolicyResponse spr;
  EXPECT_EQ(ops_->SetPolicy(&ctx2, sp, &spr).error_code(), grpc::INVALID_ARGUMENT);
  grpc::ClientContext ctx3;
  dynmo::v1::RebalanceRequest rb;
  rb.set_job("api");
  dynmo::v1::RebalanceResponse rbr;
  grpc::Status r = ops_->Rebalance(&ctx3, rb, &rbr);
  EXPECT_EQ(r.error_code(), grpc::FAILED_PRECONDITION) << "no profile yet";
}

TEST_F(GrpcApiTest, TokenGuardsSchedulerOperatorAndAgents) {
  StartServer("s3cret");
  auto call_list = [&](const std::string& token) {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, token);
    dynmo::v1::ListReleasedResponse r;
    return sched_->ListReleased(&ctx, dynmo::v1::ListReleasedRequest(), &r);
  };
  EXPECT_EQ(call_list("").error_code(), grpc::UNAUTHENTICATED);
  EXPECT_EQ(call_list("wrong").error_code(), grpc::UNAUTHENTICATED);
  EXPECT_TRUE(call_list("s3cret").ok());
  grpc::ClientContext ctx;
  dynmo::v1::ListJobsResponse jobs;
  EXPECT_EQ(ops_->ListJobs(&ctx, dynmo::v1::ListJobsRequest(), &jobs).error_code(),
            grpc::UNAUTHENTICATED);
  // Agents need it too: no job, no session, no hijack without it.
  EXPECT_EQ(Register(Reg(0)).error_code(), grpc::UNAUTHENTICATED);
  EXPECT_EQ(Register(Reg(0), "wrong").error_code(), grpc::UNAUTHENTICATED);
  dynmo::v1::AgentMessage hello;
  hello.mutable_hello()->set_job("api");
  hello.mutable_hello()->set_rank(0);
  EXPECT_EQ(Session({hello}).error_code(), grpc::UNAUTHENTICATED);
  grpc::ClientContext host_ctx;
  dynmo::v1::RegisterHostRequest host;
  *host.add_ranks() = Reg(0);
  dynmo::v1::RegisterHostResponse host_resp;
  EXPECT_EQ(agents_->RegisterHost(&host_ctx, host, &host_resp).error_code(),
            grpc::UNAUTHENTICATED);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto stream = agents_->HostSession(&ctx);
    stream->WritesDone();
    dynmo::v1::HostCoordinatorMessage in;
    while (stream->Read(&in)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::UNAUTHENTICATED);
  }
  ListJobsMustBeEmpty("s3cret");
  ASSERT_TRUE(Register(Reg(0), "s3cret").ok());
  ASSERT_TRUE(Register(Reg(1), "s3cret").ok());
  EXPECT_EQ(Session({hello}, "s3cret").error_code(), grpc::OK)
      << "the stream ends OK when the agent closes it";
}

constexpr char kPrincipals[] =
    "sched-a-token-0123456 sched-a scheduler\n"
    "sched-b-token-0123456 sched-b scheduler\n"
    "train-a-token-0123456 train-a agent\n"
    "train-b-token-0123456 train-b agent\n"
    "ops-token-0123456789a ops admin\n";  // every tenant's jobs

TEST_F(GrpcApiTest, ANamedSchedulerHoldsWhatItClaimsAndNoOneElseReturnsIt) {
  StartServer("", false, "", kPrincipals);
  dynmo::v1::ReleasedGpu g;
  g.set_job("api");
  g.set_epoch(1);
  g.set_rank(1);
  ASSERT_TRUE(server_->coordinator().pool().Add({g}).ok());
  const std::string id = server_->coordinator().pool().List("", true)[0].id();
  grpc::Status s = Lease(*sched_, true, "sched-a-token-0123456", id, "sched-b");
  EXPECT_EQ(s.error_code(), grpc::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("holder 'sched-b' is not the caller"), std::string::npos);
  ASSERT_TRUE(Lease(*sched_, true, "sched-a-token-0123456", id, "").ok());
  EXPECT_EQ(server_->coordinator().pool().List("", true)[0].holder(), "sched-a");
  EXPECT_EQ(Lease(*sched_, false, "sched-b-token-0123456", id, "sched-a").error_code(),
            grpc::PERMISSION_DENIED)
      << "B cannot return A's GPU by naming A";
  EXPECT_EQ(Lease(*sched_, true, "sched-b-token-0123456", id, "").error_code(),
            grpc::FAILED_PRECONDITION)
      << "nor take over A's lease";
  EXPECT_EQ(Lease(*sched_, true, "train-a-token-0123456", id, "").error_code(),
            grpc::PERMISSION_DENIED)
      << "an agent is no scheduler";
  EXPECT_TRUE(Lease(*sched_, false, "sched-a-token-0123456", id, "sched-a").ok());
}

TEST_F(GrpcApiTest, ANamedAgentOwnsItsJobsWithinItsQuota) {
  StartServer("", false, "", kPrincipals, /*max_jobs_per_principal=*/1);
  ASSERT_TRUE(Register(Reg(0), "train-a-token-0123456").ok());
  grpc::Status s = Register(Reg(1), "train-b-token-0123456");
  EXPECT_EQ(s.error_code(), grpc::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("belongs to principal 'train-a'"), std::string::npos);
  ASSERT_TRUE(Register(Reg(1), "train-a-token-0123456").ok());
  auto second = Reg(0);
  second.set_job("api2");
  s = Register(second, "train-a-token-0123456");
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--max_jobs_per_principal"), std::string::npos);
  EXPECT_TRUE(Register(second, "train-b-token-0123456").ok()) << "B's quota is B's";
  grpc::ClientContext ctx;
  agent::AddBearerToken(&ctx, "ops-token-0123456789a");
  dynmo::v1::GetJobRequest get;
  get.set_job("api");
  dynmo::v1::JobStatus st;
  ASSERT_TRUE(ops_->GetJob(&ctx, get, &st).ok());
  EXPECT_EQ(st.summary().owner(), "train-a");
}

TEST_F(GrpcApiTest, AnAgentWithAWrongTokenGivesUpInsteadOfRetrying) {
  StartServer("s3cret");
  agent::AgentConfig c;
  c.coordinator = server_->address();
  c.job = "api";
  c.rank = 0;
  c.pipeline_size = 2;
  c.num_layers = 4;
  c.token = "wrong";
  auto a = agent::Agent::Start(c);
  ASSERT_TRUE(a.ok()) << a.status();
  // Returns once the agent gave up, long before the timeout.
  EXPECT_FALSE((*a)->WaitConnected(absl::Seconds(30)));
  const agent::AgentStats st = (*a)->stats();
  EXPECT_TRUE(st.gave_up);
  EXPECT_EQ(st.connects, 0);
  EXPECT_NE(st.last_error.find("Register: "), std::string::npos) << st.last_error;
  agent::HostAgentConfig h;
  h.coordinator = server_->address();
  h.token = "wrong";
  h.ranks = {c};
  auto host = agent::HostAgent::Start(h);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_FALSE((*host)->WaitConnected(absl::Seconds(30)));
  EXPECT_TRUE((*host)->rank(0).stats().gave_up);
  ListJobsMustBeEmpty("s3cret");
}

TEST_F(GrpcApiTest, AnAgentTokenOfItsOwnKeepsOperatorAndAgentCredentialsApart) {
  StartServer("op", false, "ranks");
  EXPECT_EQ(Register(Reg(0), "op").error_code(), grpc::PERMISSION_DENIED)
      << "the operator's token is known, but not an agent's";
  EXPECT_TRUE(Register(Reg(0), "ranks").ok());
  grpc::ClientContext ctx;
  agent::AddBearerToken(&ctx, "ranks");
  dynmo::v1::ListJobsResponse jobs;
  EXPECT_EQ(ops_->ListJobs(&ctx, dynmo::v1::ListJobsRequest(), &jobs).error_code(),
            grpc::PERMISSION_DENIED)
      << "a trainer's token is no operator's";
}

TEST_F(GrpcApiTest, WithoutATokenEverythingIsOpen) {
  StartServer("");
  grpc::ClientContext ctx;
  dynmo::v1::ListJobsResponse jobs;
  EXPECT_TRUE(ops_->ListJobs(&ctx, dynmo::v1::ListJobsRequest(), &jobs).ok());
}

TEST_F(GrpcApiTest, HealthServiceReportsServing) {
  StartServer("");
  std::string resp;
  // HealthCheckRequest{} -> HealthCheckResponse{status: SERVING (1)}.
  ASSERT_TRUE(RawCall(channel_, "/grpc.health.v1.Health/Check", "", &resp).ok());
  EXPECT_EQ(resp, std::string("\x08\x01", 2));
}

TEST_F(GrpcApiTest, ReflectionListsOurServices) {
  StartServer("");
  grpc::CompletionQueue cq;
  grpc::GenericStub stub(channel_);
  grpc::ClientContext ctx;
  auto call = stub.PrepareCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      &cq);
  auto wait = [&](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && reinterpret_cast<intptr_t>(tag) == want && ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(wait(1));
  // ServerReflectionRequest{list_services: ""} is field 7, empty string.
  grpc::Slice slice(std::string("\x3a\x00", 2));
  grpc::ByteBuffer req(&slice, 1), resp;
  call->Write(req, reinterpret_cast<void*>(2));
  ASSERT_TRUE(wait(2));
  call->Read(&resp, reinterpret_cast<void*>(3));
  ASSERT_TRUE(wait(3));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(resp.Dump(&slices).ok());
  std::string bytes;
  for (const auto& sl : slices) {
    bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  for (const char* service : {"dynmo.v1.AgentService", "dynmo.v1.SchedulerService",
                              "dynmo.v1.OperatorService", "grpc.health.v1.Health"}) {
    EXPECT_NE(bytes.find(service), std::string::npos) << service;
  }
  call->WritesDone(reinterpret_cast<void*>(4));
  ASSERT_TRUE(wait(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  ASSERT_TRUE(wait(5));
  EXPECT_TRUE(status.ok());
}

TEST_F(GrpcApiTest, WatchReleasedStreamsTheSnapshotThenChanges) {
  StartServer("");
  dynmo::v1::ReleasedGpu g;
  g.set_job("api");
  g.set_epoch(1);
  g.set_rank(3);
  ASSERT_TRUE(server_->coordinator().pool().Add({g}).ok());
  grpc::ClientContext ctx;
  dynmo::v1::WatchReleasedRequest req;
  req.set_include_claimed(true);
  auto stream = sched_->WatchReleased(&ctx, req);
  dynmo::v1::ReleasedEvent e;
  ASSERT_TRUE(stream->Read(&e));
  EXPECT_EQ(e.kind(), dynmo::v1::ReleasedEvent::SNAPSHOT);
  EXPECT_EQ(e.gpu().id(), "gpu-1");
  grpc::ClientContext cctx;
  dynmo::v1::ClaimRequest claim;
  claim.add_ids("gpu-1");
  claim.set_holder("sched");
  claim.set_lease_seconds(60);
  dynmo::v1::ClaimResponse cresp;
  ASSERT_TRUE(sched_->Claim(&cctx, claim, &cresp).ok());
  ASSERT_TRUE(stream->Read(&e));
  EXPECT_EQ(e.kind(), dynmo::v1::ReleasedEvent::CLAIMED);
  EXPECT_EQ(e.gpu().holder(), "sched");
  ctx.TryCancel();
}

TEST_F(GrpcApiTest, MetricsCanWantALogin) {
  ServerOptions o;
  o.metrics_listen = "127.0.0.1:0";
  o.coordinator.state_dir = dir_ = TempDir();
  o.metrics_auth_file = dir_ + "/metrics-login";
  std::ofstream(o.metrics_auth_file) << "prometheus:s3cret\n";
  auto s = CoordinatorServer::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  server_ = *std::move(s);
  const int port = server_->metrics_port();
  EXPECT_NE(HttpGet(port, "/metrics", "", true).find(" 401 "), std::string::npos)
      << "no login";
  const std::string wrong = "Authorization: Basic " + absl::Base64Escape("prometheus:nope");
  EXPECT_NE(HttpGet(port, "/metrics", wrong, true).find(" 401 "), std::string::npos);
  const std::string right = "Authorization: Basic " + absl::Base64Escape("prometheus:s3cret");
  EXPECT_NE(HttpGet(port, "/metrics", right).find("dynmo_build_info"), std::string::npos);
  server_->Shutdown();
  server_.reset();
  // A login file that is not USER:PASSWORD is refused in one line.
  std::ofstream(o.metrics_auth_file) << "no-colon\n";
  auto bad = CoordinatorServer::Start(o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("USER:PASSWORD"), std::string::npos) << bad.status();
}

TEST_F(GrpcApiTest, MetricsPassPromtool) {
  StartServer("", /*metrics=*/true);
  ASSERT_TRUE(Register(Reg(0)).ok());
  ASSERT_TRUE(Register(Reg(1)).ok());
  for (int rank = 0; rank < 2; ++rank) {
    dynmo::v1::AgentMessage hello, report;
    hello.mutable_hello()->set_job("api");
    hello.mutable_hello()->set_rank(rank);
    report.mutable_report()->set_iteration(0);
    for (int l = 2 * rank; l < 2 * rank + 2; ++l) {
      auto* ls = report.mutable_report()->add_layers();
      ls->set_layer(l);
      ls->set_fwd_s(0.01 * (l + 1));
    }
    ASSERT_TRUE(Session({hello, report}).ok());
  }
  server_->coordinator().TickAll(absl::Now());
  auto r = Reg(0);
  r.set_job("bad name!");
  (void)Register(r);  // counts an RPC error
  ASSERT_GT(server_->metrics_port(), 0);
  const std::string text = HttpGet(server_->metrics_port(), "/metrics");
  for (const char* name :
       {"dynmo_stage_load_seconds", "dynmo_imbalance_ratio",
        "dynmo_bottleneck_seconds", "dynmo_bottleneck_lower_bound_seconds",
        "dynmo_predicted_bubble_ratio", "dynmo_plans_total",
        "dynmo_migrated_bytes_total", "dynmo_gpus", "dynmo_reports_total",
        "dynmo_rpc_errors_total", "dynmo_decision_latency_seconds",
        "dynmo_state_commit_failures_total", "dynmo_build_info{version=\""}) {
    EXPECT_NE(text.find(name), std::string::npos) << name << "\n" << text;
  }
  EXPECT_NE(text.find("code=\"INVALID_ARGUMENT\""), std::string::npos);
  if (system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed";
  }
  const std::string file = dir_ + "/metrics.txt";
  std::ofstream(file) << text;
  EXPECT_EQ(system(("promtool check metrics < " + file).c_str()), 0) << text;
}

}  // namespace
}  // namespace dynmo::service
