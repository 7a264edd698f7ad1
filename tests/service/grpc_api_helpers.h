// What the gRPC API tests share: GrpcApiTest, a fixture that starts an
// in-process CoordinatorServer (optionally with tokens, principals and
// /metrics) in a fresh state dir and holds a stub of each service; the
// registration it starts from; and the raw calls the tests make beside the
// stubs (HTTP GET of /metrics, Claim / Return with a token, a unary call
// through a GenericStub). Test-only; thread-compatible.
#ifndef DYNMO_TESTS_SERVICE_GRPC_API_HELPERS_H_
#define DYNMO_TESTS_SERVICE_GRPC_API_HELPERS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "agent/channel.h"
#include "coordinator/service/server.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "dynmo/v1/operator.grpc.pb.h"
#include "dynmo/v1/scheduler.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "tests/service/temp_dir.h"

namespace dynmo::service {

// The body of GET `path`; with `whole`, the status line and headers too.
inline std::string HttpGet(int port, const std::string& path, const std::string& header = "",
                           bool whole = false) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n" +
                          (header.empty() ? "" : header + "\r\n") +
                          "Connection: close\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  if (whole) return out;
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

inline dynmo::v1::RegisterRequest Reg(int rank) {
  dynmo::v1::RegisterRequest r;
  r.set_job("api");
  r.set_rank(rank);
  r.set_pipeline_rank(rank);
  r.set_pipeline_size(2);
  r.set_data_parallel_size(1);
  r.set_num_layers(4);
  return r;
}

class GrpcApiTest : public ::testing::Test {
 protected:
  void StartServer(const std::string& token, bool metrics = false,
                   const std::string& agent_token = "",
                   const std::string& principals = "", int max_jobs_per_principal = 64) {
    ServerOptions o;
    if (metrics) o.metrics_listen = "127.0.0.1:0";
    o.coordinator.state_dir = dir_ = TempDir("api");
    o.coordinator.max_jobs_per_principal = max_jobs_per_principal;
    if (!principals.empty()) {
      o.principals_file = o.coordinator.state_dir + "/principals";
      std::ofstream(o.principals_file) << principals;
    }
    o.coordinator.job.default_policy.trigger = ParseTrigger("manual").value();
    if (!token.empty()) {
      o.token_file = o.coordinator.state_dir + "/token";
      std::ofstream(o.token_file) << token << "\n";
    }
    if (!agent_token.empty()) {
      o.agent_token_file = o.coordinator.state_dir + "/agent_token";
      std::ofstream(o.agent_token_file) << agent_token << "\n";
    }
    auto s = CoordinatorServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    channel_ = grpc::CreateChannel(server_->address(),
                                   grpc::InsecureChannelCredentials());
    agents_ = dynmo::v1::AgentService::NewStub(channel_);
    ops_ = dynmo::v1::OperatorService::NewStub(channel_);
    sched_ = dynmo::v1::SchedulerService::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  grpc::Status Register(const dynmo::v1::RegisterRequest& r,
                        const std::string& token = "") {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, token);
    dynmo::v1::RegisterResponse resp;
    grpc::Status s = agents_->Register(&ctx, r, &resp);
    if (s.ok()) keys_[r.rank()] = resp.session_key();
    return s;
  }

  // Opens a session, sends `messages`, returns how the server ended it. A
  // first hello without a session key gets the one the rank's newest
  // Register (above) was issued, if any.
  grpc::Status Session(std::vector<dynmo::v1::AgentMessage> messages,
                       const std::string& token = "") {
    if (!messages.empty() && messages[0].has_hello() &&
        messages[0].hello().session_key().empty() && keys_.count(messages[0].hello().rank())) {
      messages[0].mutable_hello()->set_session_key(keys_[messages[0].hello().rank()]);
    }
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto stream = agents_->Session(&ctx);
    for (const auto& m : messages) {
      if (!stream->Write(m)) break;
    }
    stream->WritesDone();
    dynmo::v1::CoordinatorMessage in;
    while (stream->Read(&in)) {
    }
    return stream->Finish();
  }

  // No unauthenticated call created a job.
  void ListJobsMustBeEmpty(const std::string& token) {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, token);
    dynmo::v1::ListJobsResponse jobs;
    ASSERT_TRUE(ops_->ListJobs(&ctx, dynmo::v1::ListJobsRequest(), &jobs).ok());
    EXPECT_EQ(jobs.jobs_size(), 0);
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<dynmo::v1::AgentService::Stub> agents_;
  std::unique_ptr<dynmo::v1::OperatorService::Stub> ops_;
  std::unique_ptr<dynmo::v1::SchedulerService::Stub> sched_;
  std::map<int, std::string> keys_;  // rank -> newest session key
};

// Claim / Return with a bearer token; `holder` may be empty.
inline grpc::Status Lease(dynmo::v1::SchedulerService::Stub& sched, bool claim,
                          const std::string& token, const std::string& id,
                          const std::string& holder) {
  grpc::ClientContext ctx;
  agent::AddBearerToken(&ctx, token);
  if (claim) {
    dynmo::v1::ClaimRequest req;
    req.add_ids(id);
    req.set_holder(holder);
    req.set_lease_seconds(60);
    dynmo::v1::ClaimResponse resp;
    return sched.Claim(&ctx, req, &resp);
  }
  dynmo::v1::ReturnRequest req;
  req.add_ids(id);
  req.set_holder(holder);
  dynmo::v1::ReturnResponse resp;
  return sched.Return(&ctx, req, &resp);
}

// Raw unary call: the health and reflection stubs are not installed as
// headers, so the test speaks their wire format through a GenericStub.
inline grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& method, const std::string& request,
                            std::string* response) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  std::vector<grpc::Slice> slices;
  if (status.ok() && resp.Dump(&slices).ok()) {
    for (const auto& sl : slices) {
      response->append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    }
  }
  return status;
}

}  // namespace dynmo::service

#endif  // DYNMO_TESTS_SERVICE_GRPC_API_HELPERS_H_
