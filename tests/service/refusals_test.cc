// Refusals say what happened, in a bounded line (issue 25 item 5): refusal
// log lines are cut in size and limited in rate with a count of what was
// dropped; a refused claim is FAILED_PRECONDITION whatever its size; bytes
// that do not decode are INVALID_ARGUMENT, in a request or on a stream; a Session or HostSession may
// only attach ranks of its principal's jobs; host names with control
// characters and negative devices are refused; a rank's report of layers
// its stage does not hold is refused.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agent/channel.h"
#include "coordinator/service/event_log.h"
#include "coordinator/service/refusal_log.h"
#include "coordinator/service/server.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "dynmo/v1/scheduler.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/service/job_state_fixture.h"

namespace dynmo::service {
namespace {

TEST(RefusalLimiterTest, TenLinesAWindowThenTheDroppedAreCountedInTheNext) {
  RefusalLimiter limiter(10, absl::Minutes(1));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t suppressed = -1;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(limiter.Admit("claim_refused", t0, &suppressed));
    EXPECT_EQ(suppressed, 0);
  }
  for (int i = 0; i < 1990; ++i) EXPECT_FALSE(limiter.Admit("claim_refused", t0, &suppressed));
  // Another kind has its own budget.
  EXPECT_TRUE(limiter.Admit("auth_refused", t0, &suppressed));
  EXPECT_FALSE(limiter.Admit("claim_refused", t0 + absl::Seconds(59), &suppressed));
  ASSERT_TRUE(limiter.Admit("claim_refused", t0 + absl::Minutes(1), &suppressed));
  EXPECT_EQ(suppressed, 1991);
}

TEST(RefusalLimiterTest, FieldsAndListsAreCutWithWhatWasLeftOut) {
  EXPECT_EQ(Bounded("short"), "short");
  const std::string big(3 << 20, 'x');
  EXPECT_EQ(Bounded(big, 4), "xxxx... (+3145724 bytes)");
  const std::vector<std::string> ids = {"gpu-1", "gpu-2", "gpu-3"};
  EXPECT_EQ(BoundedList(ids, 2), "gpu-1,gpu-2... (+1 more)");
  EXPECT_EQ(BoundedList({big}, 8).size(), 64u + std::string("... (+3145664 bytes)").size());
}

// A report from rank 0 timing stage 1's layers (the fixture's 4 stages of
// 2 layers each) is refused and changes nothing.
class ReportedLayersTest : public JobStateTest {};

TEST_F(ReportedLayersTest, AReportOfLayersTheRankDoesNotHoldIsRefused) {
  const absl::Status s = job_->OnReport(0, Report(1, 5));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("does not hold"), std::string::npos) << s;
  EXPECT_EQ(job_->Summary().last_iteration(), -1);
  EXPECT_TRUE(job_->OnReport(0, Report(0, 5)).ok());
}

constexpr char kPrincipals[] =
    "sched-token-0123456789 sched scheduler\n"
    "train-a-token-0123456 train-a agent\n"
    "train-b-token-0123456 train-b agent\n";

class RefusalsApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.coordinator.state_dir = dir_ = TempDir();
    o.principals_file = dir_ + "/principals";
    std::ofstream(o.principals_file) << kPrincipals;
    o.coordinator.job.default_policy.trigger = ParseTrigger("manual").value();
    o.max_message_bytes = 16 << 20;
    auto s = CoordinatorServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    agents_ = dynmo::v1::AgentService::NewStub(channel_);
    sched_ = dynmo::v1::SchedulerService::NewStub(channel_);
  }
  void TearDown() override {
    server_->Shutdown();
    ConfigureEventLog(EventLogOptions{});
    std::filesystem::remove_all(dir_);
  }
  grpc::Status Register(const dynmo::v1::RegisterRequest& r, const std::string& token,
                        std::string* key = nullptr) {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, token);
    dynmo::v1::RegisterResponse resp;
    grpc::Status s = agents_->Register(&ctx, r, &resp);
    if (key != nullptr) *key = resp.session_key();
    return s;
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<dynmo::v1::AgentService::Stub> agents_;
  std::unique_ptr<dynmo::v1::SchedulerService::Stub> sched_;
};

TEST_F(RefusalsApiTest, ARefusedClaimIsFailedPreconditionWhateverItsSizeInABoundedLine) {
  std::ostringstream log;
  ConfigureEventLog(EventLogOptions{LogFormat::kLogfmt, LogLevel::kInfo, &log});
  for (const bool many : {true, false}) {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, "sched-token-0123456789");
    dynmo::v1::ClaimRequest claim;
    if (many) {
      for (int i = 0; i < 2000; ++i) claim.add_ids(absl::StrCat("gpu-unknown-", i));
    } else {
      claim.add_ids(std::string(3 << 20, 'g'));  // one 3 MB id
    }
    claim.set_lease_seconds(60);
    dynmo::v1::ClaimResponse resp;
    const grpc::Status s = sched_->Claim(&ctx, claim, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message().substr(0, 200);
    EXPECT_LT(s.error_message().size(), 4096u);
  }
  std::istringstream lines(log.str());
  int refused = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("event=claim_refused") == std::string::npos) continue;
    ++refused;
    EXPECT_LT(line.size(), 2048u) << line.substr(0, 300);
  }
  EXPECT_EQ(refused, 2);
}

// One unary call of `method` with raw `bytes`, bearer `token` (none when
// empty); its status.
grpc::Status RawUnary(grpc::GenericStub& stub, const std::string& method,
                      const std::string& token, const std::string& bytes) {
  grpc::ClientContext ctx;
  if (!token.empty()) agent::AddBearerToken(&ctx, token);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer req(&slice, 1), resp;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

const std::string kGarbage("\xff\xff\xff\xff\x0f not a protobuf", 20);

TEST_F(RefusalsApiTest, BytesThatDoNotDecodeAreInvalidArgument) {
  grpc::GenericStub stub(channel_);
  // Every method with one request: gRPC's own decoding said UNIMPLEMENTED
  // (agent, callback) or INTERNAL (operator and scheduler, synchronous).
  for (const char* method : {"/dynmo.v1.AgentService/Register",
                             "/dynmo.v1.AgentService/RegisterHost",
                             "/dynmo.v1.OperatorService/ListJobs",
                             "/dynmo.v1.OperatorService/GetJob",
                             "/dynmo.v1.OperatorService/SetPolicy",
                             "/dynmo.v1.OperatorService/Rebalance",
                             "/dynmo.v1.OperatorService/DeleteJob",
                             "/dynmo.v1.SchedulerService/ListReleased",
                             "/dynmo.v1.SchedulerService/Claim",
                             "/dynmo.v1.SchedulerService/Return",
                             "/dynmo.v1.SchedulerService/ListPlacements",
                             // server streaming: one request, then the stream
                             "/dynmo.v1.SchedulerService/WatchReleased"}) {
    const grpc::Status status = RawUnary(stub, method, "train-a-token-0123456", kGarbage);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << status.error_message();
  }
}

// The agents' registrations check credentials before they read the bytes:
// garbage from a caller without the agents' token is UNAUTHENTICATED, not
// INVALID_ARGUMENT (nothing is decoded for a stranger).
TEST_F(RefusalsApiTest, RegistrationsCheckCredentialsBeforeDecoding) {
  grpc::GenericStub stub(channel_);
  for (const char* method :
       {"/dynmo.v1.AgentService/Register", "/dynmo.v1.AgentService/RegisterHost"}) {
    for (const char* token : {"", "not-the-agents-token-0123"}) {
      const grpc::Status status = RawUnary(stub, method, token, kGarbage);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << " token '" << token << "': " << status.error_message();
    }
  }
}

// One raw message on a bidi stream, then half-close; the stream's status.
class RawBidi final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawBidi(grpc::GenericStub* stub, grpc::ClientContext* ctx, const std::string& method,
          const std::string& bytes)
      : slice_(bytes), out_(&slice_, 1) {
    stub->PrepareBidiStreamingCall(ctx, method, grpc::StubOptions(), this);
    StartWriteLast(&out_, grpc::WriteOptions());
    StartRead(&in_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override {
    status_ = s;
    done_.Notify();
  }
  grpc::Status Wait() {
    done_.WaitForNotification();
    return status_;
  }

 private:
  grpc::Slice slice_;
  grpc::ByteBuffer out_, in_;
  grpc::Status status_;
  absl::Notification done_;
};

TEST_F(RefusalsApiTest, StreamMessagesThatDoNotDecodeEndTheStreamWithInvalidArgument) {
  grpc::GenericStub stub(channel_);
  for (const char* method : {"/dynmo.v1.AgentService/Session",
                             "/dynmo.v1.AgentService/HostSession"}) {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, "train-a-token-0123456");
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    RawBidi call(&stub, &ctx, method, std::string("\xff\xff\xff\xff\x0f not a protobuf", 20));
    const grpc::Status s = call.Wait();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << s.error_message();
  }
}

TEST_F(RefusalsApiTest, ControlCharactersInHostNamesAndNegativeDevicesAreRefused) {
  dynmo::v1::RegisterRequest r = Reg(0);
  r.set_host("node\x1b[31m-1");
  EXPECT_EQ(Register(r, "train-a-token-0123456").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Reg(0);
  r.set_device(-1);
  EXPECT_EQ(Register(r, "train-a-token-0123456").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Reg(0);
  r.set_host("node-1");
  r.set_device(3);
  EXPECT_TRUE(Register(r, "train-a-token-0123456").ok());
}

TEST_F(RefusalsApiTest, ASessionOfAnotherPrincipalsJobIsPermissionDenied) {
  std::string key;
  ASSERT_TRUE(Register(Reg(0), "train-a-token-0123456", &key).ok());
  auto session = [&](const std::string& token) {
    grpc::ClientContext ctx;
    agent::AddBearerToken(&ctx, token);
    auto stream = agents_->Session(&ctx);
    dynmo::v1::AgentMessage hello;
    hello.mutable_hello()->set_job("job");
    hello.mutable_hello()->set_rank(0);
    hello.mutable_hello()->set_session_key(key);  // even with the right key
    stream->Write(hello);
    stream->WritesDone();
    dynmo::v1::CoordinatorMessage in;
    while (stream->Read(&in)) {
    }
    return stream->Finish();
  };
  EXPECT_EQ(session("train-b-token-0123456").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(session("train-a-token-0123456").ok());
  // The same for a multiplexed HostSession.
  grpc::ClientContext ctx;
  agent::AddBearerToken(&ctx, "train-b-token-0123456");
  auto stream = agents_->HostSession(&ctx);
  dynmo::v1::HostMessage hello;
  hello.mutable_hello()->set_job("job");
  hello.mutable_hello()->set_host("node-b");
  hello.mutable_hello()->add_ranks(0);
  hello.mutable_hello()->add_session_keys(key);
  stream->Write(hello);
  stream->WritesDone();
  dynmo::v1::HostCoordinatorMessage in;
  while (stream->Read(&in)) {
  }
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace dynmo::service
