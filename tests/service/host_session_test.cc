// The multiplexed agent API over gRPC (RegisterHost + HostSession) against
// an in-process CoordinatorServer: every malformed or conflicting request
// is refused with a clear status and leaves the job unchanged.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/service/server.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

using dynmo::v1::HostMessage;

constexpr int kStages = 4;
constexpr int kReplicas = 2;  // 8 ranks: rank = replica * kStages + stage

dynmo::v1::RegisterRequest Reg(int rank, const std::string& job = "mux") {
  dynmo::v1::RegisterRequest r;
  r.set_job(job);
  r.set_rank(rank);
  r.set_pipeline_rank(rank % kStages);
  r.set_data_parallel_rank(rank / kStages);
  r.set_pipeline_size(kStages);
  r.set_data_parallel_size(kReplicas);
  r.set_num_layers(8);
  r.set_host("node0");
  return r;
}

dynmo::v1::RegisterHostRequest RegHost(const std::vector<int>& ranks) {
  dynmo::v1::RegisterHostRequest req;
  for (int r : ranks) *req.add_ranks() = Reg(r);
  return req;
}

// A report of stage `rank % kStages`'s two layers under the uniform layout.
HostMessage Batch(const std::vector<int>& ranks, int layer_override = -1) {
  HostMessage m;
  for (int r : ranks) {
    auto* rm = m.mutable_batch()->add_messages();
    rm->set_rank(r);
    auto* rep = rm->mutable_report();
    rep->set_iteration(1);
    for (int l = 2 * (r % kStages); l < 2 * (r % kStages) + 2; ++l) {
      auto* s = rep->add_layers();
      s->set_layer(layer_override >= 0 ? layer_override : l);
      s->set_fwd_s(0.01);
    }
  }
  return m;
}

class HostSessionApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    char tmpl[] = "/tmp/dynmo_host_XXXXXX";
    o.coordinator.state_dir = dir_ = mkdtemp(tmpl);
    o.coordinator.job.default_policy.trigger = ParseTrigger("manual").value();
    auto s = CoordinatorServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    stub_ = dynmo::v1::AgentService::NewStub(grpc::CreateChannel(
        server_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  // Registers; remembers each rank's session key for Hello.
  grpc::Status RegisterHost(const dynmo::v1::RegisterHostRequest& req,
                            dynmo::v1::RegisterHostResponse* resp = nullptr) {
    grpc::ClientContext ctx;
    dynmo::v1::RegisterHostResponse unused;
    if (resp == nullptr) resp = &unused;
    grpc::Status s = stub_->RegisterHost(&ctx, req, resp);
    for (int i = 0; s.ok() && i < resp->ranks_size(); ++i) {
      keys_[req.ranks(i).rank()] = resp->ranks(i).session_key();
    }
    return s;
  }

  // A hello for `ranks` with the keys their registration issued.
  HostMessage Hello(const std::vector<int>& ranks, const std::string& host = "node0",
                    const std::string& job = "mux") {
    HostMessage m;
    m.mutable_hello()->set_job(job);
    m.mutable_hello()->set_host(host);
    for (int r : ranks) {
      m.mutable_hello()->add_ranks(r);
      m.mutable_hello()->add_session_keys(keys_.count(r) ? keys_[r] : "unregistered");
    }
    return m;
  }

  // Opens a host session, sends `messages`, closes, returns how it ended.
  grpc::Status Run(const std::vector<HostMessage>& messages) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto stream = stub_->HostSession(&ctx);
    for (const auto& m : messages) {
      if (!stream->Write(m)) break;
    }
    stream->WritesDone();
    dynmo::v1::HostCoordinatorMessage in;
    while (stream->Read(&in)) {
    }
    return stream->Finish();
  }

  dynmo::v1::JobSummary Summary() {
    auto job = server_->coordinator().jobs().Find("mux");
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? (*job)->Summary() : dynmo::v1::JobSummary{};
  }
  int RegisteredRanks() {
    auto job = server_->coordinator().jobs().Find("mux");
    return job.ok() ? (*job)->Record().ranks_size() : 0;
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<dynmo::v1::AgentService::Stub> stub_;
  std::map<int, std::string> keys_;  // rank -> session key
};

TEST_F(HostSessionApiTest, RegisterHostRegistersEveryRankAndAnswersInOrder) {
  dynmo::v1::RegisterHostResponse resp;
  ASSERT_TRUE(RegisterHost(RegHost({3, 0, 5}), &resp).ok());
  ASSERT_EQ(resp.ranks_size(), 3);
  for (const auto& r : resp.ranks()) {
    EXPECT_EQ(r.boundaries_size(), kStages + 1);
    EXPECT_FALSE(r.released());
  }
  EXPECT_EQ(RegisteredRanks(), 3);
}

TEST_F(HostSessionApiTest, MalformedRegisterHostIsInvalidAndCreatesNoJob) {
  EXPECT_EQ(RegisterHost(RegHost({})).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(RegisterHost(RegHost({1, 1})).error_code(), grpc::INVALID_ARGUMENT)
      << "duplicate rank";
  auto mixed = RegHost({0});
  *mixed.add_ranks() = Reg(1, "other");
  EXPECT_EQ(RegisterHost(mixed).error_code(), grpc::INVALID_ARGUMENT);
  auto shapes = RegHost({0, 1});
  shapes.mutable_ranks(1)->set_num_layers(12);
  EXPECT_EQ(RegisterHost(shapes).error_code(), grpc::INVALID_ARGUMENT);
  auto coords = RegHost({0, 1});
  coords.mutable_ranks(1)->set_pipeline_rank(0);  // same stage and replica
  EXPECT_EQ(RegisterHost(coords).error_code(), grpc::INVALID_ARGUMENT);
  auto out_of_range = RegHost({0});
  out_of_range.mutable_ranks(0)->set_rank(kStages * kReplicas);
  EXPECT_EQ(RegisterHost(out_of_range).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(server_->coordinator().jobs().Find("mux").status().code(),
            absl::StatusCode::kNotFound)
      << "no request above may create the job";
}

TEST_F(HostSessionApiTest, RegisterHostIsAllOrNothingAgainstTheJob) {
  ASSERT_TRUE(RegisterHost(RegHost({0, 1})).ok());
  // Rank 2 fine, rank 3 claims the coordinates rank 0 holds.
  auto req = RegHost({2, 3});
  req.mutable_ranks(1)->set_pipeline_rank(0);
  req.mutable_ranks(1)->set_data_parallel_rank(0);
  grpc::Status s = RegisterHost(req);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("already rank 0"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(RegisteredRanks(), 2) << "rank 2 must not be registered either";
  // A model of another shape than the job's.
  auto other = RegHost({2, 3});
  for (auto& r : *other.mutable_ranks()) r.set_num_layers(16);
  EXPECT_EQ(RegisterHost(other).error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_EQ(RegisteredRanks(), 2);
}

TEST_F(HostSessionApiTest, HelloIsValidatedAndRefusalsBindNoRank) {
  ASSERT_TRUE(RegisterHost(RegHost({0, 1, 2, 3})).ok());
  EXPECT_EQ(Run({Batch({0})}).error_code(), grpc::INVALID_ARGUMENT)
      << "a batch before the hello";
  EXPECT_EQ(Run({Hello({0, 1}, "node0", "nosuchjob")}).error_code(),
            grpc::NOT_FOUND);
  EXPECT_EQ(Run({Hello({0, 0})}).error_code(), grpc::INVALID_ARGUMENT)
      << "rank listed twice";
  EXPECT_EQ(Run({Hello({0, 1}, "")}).error_code(), grpc::INVALID_ARGUMENT)
      << "no host";
  EXPECT_EQ(Run({Hello({0, 99})}).error_code(), grpc::NOT_FOUND)
      << "rank outside the job";
  grpc::Status s = Run({Hello({0, 4})});  // rank 4 never registered
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION) << s.error_message();
  EXPECT_EQ(Summary().connected_ranks(), 0) << "no refused hello bound a rank";
  // Keys: missing, swapped or made up, the hello is refused and binds nothing.
  HostMessage no_keys = Hello({0, 1});
  no_keys.mutable_hello()->clear_session_keys();
  EXPECT_EQ(Run({no_keys}).error_code(), grpc::INVALID_ARGUMENT);
  HostMessage swapped = Hello({0, 1});
  swapped.mutable_hello()->mutable_session_keys()->SwapElements(0, 1);
  s = Run({swapped});
  EXPECT_EQ(s.error_code(), grpc::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(Summary().connected_ranks(), 0) << "no refused hello bound a rank";
  // A valid hello binds; a second one ends the stream, which unbinds.
  EXPECT_EQ(Run({Hello({0}), Hello({0})}).error_code(), grpc::INVALID_ARGUMENT)
      << "hello twice";
  for (int i = 0; i < 200 && Summary().connected_ranks() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(Summary().connected_ranks(), 0);
}

TEST_F(HostSessionApiTest, BatchesAreCheckedWholeAndABadOneChangesNothing) {
  ASSERT_TRUE(RegisterHost(RegHost({0, 1, 2, 3})).ok());
  EXPECT_TRUE(Run({Hello({0, 1, 2, 3}), Batch({0, 1, 2, 3})}).ok());
  EXPECT_EQ(Summary().reports(), 4) << "one report per rank of the batch";

  grpc::Status s = Run({Hello({0, 1}), Batch({0, 1, 2})});
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("rank 2 is not carried"), std::string::npos)
      << s.error_message();
  HostMessage bad = Batch({0, 1});
  bad.mutable_batch()->mutable_messages(1)->mutable_report()->mutable_layers(0)
      ->set_layer(8);  // outside the job's 8 layers
  EXPECT_EQ(Run({Hello({0, 1}), bad}).error_code(), grpc::INVALID_ARGUMENT);
  HostMessage future = Batch({0});
  future.mutable_batch()->mutable_messages(0)->mutable_report()
      ->set_applied_epoch(7);  // never issued
  EXPECT_EQ(Run({Hello({0}), future}).error_code(), grpc::INVALID_ARGUMENT);
  HostMessage empty;
  empty.mutable_batch()->add_messages()->set_rank(0);
  EXPECT_EQ(Run({Hello({0}), empty}).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(Summary().reports(), 4)
      << "refused batches must not count even their valid reports";
}

TEST_F(HostSessionApiTest, ARankOfAnotherHostsLiveSessionIsRefused) {
  ASSERT_TRUE(RegisterHost(RegHost({0, 1, 2, 3})).ok());
  grpc::ClientContext ctx;
  auto first = stub_->HostSession(&ctx);
  ASSERT_TRUE(first->Write(Hello({0, 1, 2, 3}, "node0")));
  for (int i = 0; i < 200 && Summary().connected_ranks() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(Summary().connected_ranks(), 4);

  grpc::Status s = Run({Hello({3}, "node1")});
  EXPECT_EQ(s.error_code(), grpc::ALREADY_EXISTS);
  EXPECT_NE(s.error_message().find("node0"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(Summary().connected_ranks(), 4) << "node0 keeps its ranks";

  // The same host reconnecting replaces its old session (reconnection).
  grpc::ClientContext ctx2;
  auto second = stub_->HostSession(&ctx2);
  ASSERT_TRUE(second->Write(Hello({0, 1, 2, 3}, "node0")));
  dynmo::v1::HostCoordinatorMessage in;
  EXPECT_FALSE(first->Read(&in));
  grpc::Status closed = first->Finish();
  EXPECT_EQ(closed.error_code(), grpc::ABORTED) << closed.error_message();
  EXPECT_EQ(Summary().connected_ranks(), 4);
  second->WritesDone();
  while (second->Read(&in)) {
  }
  EXPECT_TRUE(second->Finish().ok());
  for (int i = 0; i < 200 && Summary().connected_ranks() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(Summary().connected_ranks(), 0) << "ranks unbound when it ends";
}

}  // namespace
}  // namespace dynmo::service
