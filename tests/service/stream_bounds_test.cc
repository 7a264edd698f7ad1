// Bounded per-client memory (issue 43 item 2): what waits for a reader
// that never reads is bounded (the stream is ended with RESOURCE_EXHAUSTED,
// the queue dropped), and a Session must say hello within a deadline, with
// streams still waiting for theirs capped per peer and in all.
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "coordinator/service/pending_sessions.h"
#include "coordinator/service/server.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rpc/stream_outbox.h"
#include "tests/service/temp_dir.h"

namespace dynmo::service {
namespace {

// A reactor whose writes never complete until the test says so: a client
// that grants no window.
struct StalledReactor {
  void StartWrite(const std::string* m) { started.push_back(*m); }
  void Finish(const grpc::Status& s) { finished.push_back(s); }
  std::vector<std::string> started;
  std::vector<grpc::Status> finished;
};

struct Text {
  std::string s;
  size_t ByteSizeLong() const { return s.size(); }
};

TEST(StreamOutboxBoundTest, AReaderThatNeverReadsIsEndedAtTheBoundNotGrownWithout) {
  struct R {
    void StartWrite(const Text* m) { started.push_back(m->s); }
    void Finish(const grpc::Status& s) { finished.push_back(s); }
    std::vector<std::string> started;
    std::vector<grpc::Status> finished;
  } reactor;
  rpc::StreamOutbox<Text, Text, R> outbox(&reactor, rpc::OutboxBound{3, 0});
  EXPECT_TRUE(outbox.Write(std::make_shared<Text>(Text{"a"})));  // in flight
  EXPECT_TRUE(outbox.Write(std::make_shared<Text>(Text{"b"})));
  EXPECT_TRUE(outbox.Write(std::make_shared<Text>(Text{"c"})));
  EXPECT_FALSE(outbox.Write(std::make_shared<Text>(Text{"d"}))) << "beyond the bound";
  EXPECT_TRUE(outbox.overflowed());
  EXPECT_TRUE(reactor.finished.empty()) << "the write in flight completes first";
  EXPECT_FALSE(outbox.Write(std::make_shared<Text>(Text{"e"}))) << "dropped once ending";
  outbox.OnWriteDone(true);
  ASSERT_EQ(reactor.finished.size(), 1u);
  EXPECT_EQ(reactor.finished[0].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(reactor.started, std::vector<std::string>{"a"}) << "the queue was dropped";
  outbox.Detach();
}

TEST(StreamOutboxBoundTest, TheByteBoundCountsWhatWaitsAndIsFreedAsWritesComplete) {
  struct R {
    void StartWrite(const Text*) { ++started; }
    void Finish(const grpc::Status& s) { finished.push_back(s); }
    int started = 0;
    std::vector<grpc::Status> finished;
  } reactor;
  rpc::StreamOutbox<Text, Text, R> outbox(&reactor, rpc::OutboxBound{0, 10});
  EXPECT_TRUE(outbox.Write(std::make_shared<Text>(Text{"12345"})));
  EXPECT_TRUE(outbox.Write(std::make_shared<Text>(Text{"12345"})));
  outbox.OnWriteDone(true);  // 5 bytes leave
  EXPECT_TRUE(outbox.Write(std::make_shared<Text>(Text{"1234"}))) << "9 of 10 bytes";
  EXPECT_FALSE(outbox.Write(std::make_shared<Text>(Text{"12"})));
  outbox.OnWriteDone(true);
  ASSERT_EQ(reactor.finished.size(), 1u);
  EXPECT_EQ(reactor.finished[0].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  outbox.Detach();
}

TEST(StreamOutboxBoundTest, WithNothingInFlightAnOverflowEndsTheStreamAtOnce) {
  struct R {
    void StartWrite(const Text*) {}
    void Finish(const grpc::Status& s) { finished.push_back(s); }
    std::vector<grpc::Status> finished;
  } reactor;
  rpc::StreamOutbox<Text, Text, R> outbox(&reactor, rpc::OutboxBound{0, 4});
  EXPECT_FALSE(outbox.Write(std::make_shared<Text>(Text{"too long"})));
  ASSERT_EQ(reactor.finished.size(), 1u);
  EXPECT_EQ(reactor.finished[0].error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  outbox.Detach();
}

TEST(PendingSessionsTest, CapsPerPeerHostAndInAll) {
  PendingSessions pending(PendingLimits{absl::Seconds(60), 3, 2});
  auto a = pending.Admit("ipv4:10.0.0.1:1000", [] {});
  auto b = pending.Admit("ipv4:10.0.0.1:1001", [] {});
  ASSERT_TRUE(a.ok() && b.ok());
  const auto c = pending.Admit("ipv4:10.0.0.1:1002", [] {});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted) << "per peer host";
  auto d = pending.Admit("ipv4:10.0.0.2:1000", [] {});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(pending.Admit("ipv6:[::1]:5", [] {}).status().code(),
            absl::StatusCode::kResourceExhausted)
      << "in all";
  EXPECT_TRUE((*a)->Greeted());
  EXPECT_EQ(pending.pending(), 2);
  (*b)->Gone();
  EXPECT_TRUE(pending.Admit("ipv4:10.0.0.1:1003", [] {}).ok()) << "room again";
  EXPECT_EQ(PendingSessions::PeerHost("ipv6:[::1]:5"), "ipv6:[::1]");
  EXPECT_EQ(PendingSessions::PeerHost("unix:/tmp/s"), "unix:/tmp/s");
}

TEST(PendingSessionsTest, TheDeadlineEndsASilentStreamOnceAndAHelloInTimeIsLeftAlone) {
  int expired_count = 0;
  absl::Notification expired;
  // The deadline is long next to the microseconds between admitting the
  // greeted stream and its hello, so no scheduling delay decides the test.
  PendingSessions pending(PendingLimits{absl::Seconds(1), 10, 10}, [&] { ++expired_count; });
  auto greeted = pending.Admit("ipv4:1.2.3.4:6", [] { ADD_FAILURE() << "greeted in time"; });
  ASSERT_TRUE(greeted.ok());
  EXPECT_TRUE((*greeted)->Greeted());
  int ended = 0;
  auto silent = pending.Admit("ipv4:1.2.3.4:5", [&] {
    ++ended;
    expired.Notify();
  });
  ASSERT_TRUE(silent.ok());
  ASSERT_TRUE(expired.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE((*silent)->Greeted()) << "too late: the stream is ending";
  (*silent)->Gone();
  for (int i = 0; i < 100 && pending.pending() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(pending.pending(), 0);
  EXPECT_EQ(ended, 1);
  EXPECT_EQ(expired_count, 1);
}

class HelloDeadlineTest : public ::testing::Test {
 protected:
  void Start(PendingLimits limits) {
    ServerOptions o;
    o.coordinator.state_dir = dir_ = TempDir("hello");
    o.pending = limits;
    auto s = CoordinatorServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    stub_ = dynmo::v1::AgentService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    for (auto& c : contexts_) c->TryCancel();
    streams_.clear();
    if (server_) server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }
  using Stream = grpc::ClientReaderWriter<dynmo::v1::AgentMessage, dynmo::v1::CoordinatorMessage>;
  Stream* Open() {
    contexts_.push_back(std::make_unique<grpc::ClientContext>());
    contexts_.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    streams_.push_back(stub_->Session(contexts_.back().get()));
    return streams_.back().get();
  }
  bool WaitPending(int n) {
    for (int i = 0; i < 500; ++i) {
      if (server_->pending_sessions() == n) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<dynmo::v1::AgentService::Stub> stub_;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

TEST_F(HelloDeadlineTest, ASessionThatNeverSaysHelloIsEndedAfterTheDeadline) {
  Start(PendingLimits{absl::Milliseconds(300), 64, 64});
  Stream* s = Open();
  dynmo::v1::CoordinatorMessage in;
  EXPECT_FALSE(s->Read(&in));
  const grpc::Status status = s->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_NE(status.error_message().find("hello"), std::string::npos);
  EXPECT_TRUE(WaitPending(0));
}

TEST_F(HelloDeadlineTest, SilentSessionsBeyondThePeersCapAreRefusedAtOnce) {
  Start(PendingLimits{absl::Seconds(60), 64, 3});
  for (int i = 0; i < 3; ++i) Open();
  ASSERT_TRUE(WaitPending(3));
  Stream* fourth = Open();
  dynmo::v1::CoordinatorMessage in;
  EXPECT_FALSE(fourth->Read(&in));
  EXPECT_EQ(fourth->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(server_->pending_sessions(), 3) << "the refused one holds nothing";
  contexts_[0]->TryCancel();
  EXPECT_TRUE(WaitPending(2)) << "a stream that went away leaves the count";
}

}  // namespace
}  // namespace dynmo::service
