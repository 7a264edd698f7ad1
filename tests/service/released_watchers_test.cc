// WatchReleased streams are served without a thread each and are capped:
// many watchers all get the snapshot and every change, the server's thread
// count does not grow with them, and one beyond --max_watchers is refused
// with RESOURCE_EXHAUSTED (issue 25 item 3).
#include <dirent.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/service/server.h"
#include "dynmo/v1/scheduler.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/service/state_dir_fixture.h"

namespace dynmo::service {
namespace {

int Threads() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

class ReleasedWatchersTest : public ::testing::Test {
 protected:
  void Start(int max_watchers, int64_t backlog_events = 16384) {
    ServerOptions o;
    o.coordinator.state_dir = dir_ = TempDir();
    o.max_watchers = max_watchers;
    o.watcher_backlog_events = backlog_events;
    auto s = CoordinatorServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    stub_ = dynmo::v1::SchedulerService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    for (auto& w : watches_) w.context->TryCancel();
    for (auto& w : watches_) w.reader->Finish().IgnoreError();
    if (server_) server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }
  void Release(int rank, int count = 1) {
    std::vector<dynmo::v1::ReleasedGpu> gpus;
    for (int i = 0; i < count; ++i) {
      dynmo::v1::ReleasedGpu g;
      g.set_job("job");
      g.set_epoch(1);
      g.set_rank(rank + i);
      gpus.push_back(g);
    }
    ASSERT_TRUE(server_->coordinator().pool().Add(std::move(gpus)).ok());
  }
  struct Watch {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReader<dynmo::v1::ReleasedEvent>> reader;
  };
  Watch& Open() {
    Watch w;
    w.context = std::make_unique<grpc::ClientContext>();
    w.reader = stub_->WatchReleased(w.context.get(), dynmo::v1::WatchReleasedRequest());
    watches_.push_back(std::move(w));
    return watches_.back();
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<dynmo::v1::SchedulerService::Stub> stub_;
  std::vector<Watch> watches_;
};

TEST_F(ReleasedWatchersTest, ManyWatchersGetEveryChangeWithoutAThreadEach) {
  Start(/*max_watchers=*/64);
  Release(0);
  const int before = Threads();
  for (int i = 0; i < 48; ++i) {
    dynmo::v1::ReleasedEvent e;
    ASSERT_TRUE(Open().reader->Read(&e)) << i;  // the snapshot: it is being served
    EXPECT_EQ(e.kind(), dynmo::v1::ReleasedEvent::SNAPSHOT);
  }
  Release(1);
  for (auto& w : watches_) {
    dynmo::v1::ReleasedEvent e;
    ASSERT_TRUE(w.reader->Read(&e));
    EXPECT_EQ(e.kind(), dynmo::v1::ReleasedEvent::RELEASED);
    EXPECT_EQ(e.gpu().rank(), 1);
  }
  // A thread per watcher would be 48 more (the synchronous API's).
  EXPECT_LT(Threads() - before, 16);
}

TEST_F(ReleasedWatchersTest, AWatcherBeyondTheCapIsRefusedWithResourceExhausted) {
  Start(/*max_watchers=*/2);
  Release(0);
  dynmo::v1::ReleasedEvent e;
  ASSERT_TRUE(Open().reader->Read(&e));
  ASSERT_TRUE(Open().reader->Read(&e));
  Watch& third = Open();
  EXPECT_FALSE(third.reader->Read(&e));
  const grpc::Status s = third.reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--max_watchers"), std::string::npos);
  watches_.pop_back();  // finished already
}

// The snapshot and the events are written through a small window, taken
// from the pool as writes complete: a snapshot and a burst larger than the
// window arrive whole and in order.
TEST_F(ReleasedWatchersTest, ASnapshotAndABurstLargerThanTheWindowArriveWhole) {
  Start(/*max_watchers=*/4);
  Release(0, 300);
  Watch& w = Open();
  dynmo::v1::ReleasedEvent e;
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(w.reader->Read(&e)) << i;
    EXPECT_EQ(e.kind(), dynmo::v1::ReleasedEvent::SNAPSHOT);
    EXPECT_EQ(e.gpu().rank(), i);
  }
  Release(1000, 500);
  for (int i = 0; i < 500; ++i) {
    ASSERT_TRUE(w.reader->Read(&e)) << i;
    EXPECT_EQ(e.kind(), dynmo::v1::ReleasedEvent::RELEASED);
    EXPECT_EQ(e.gpu().rank(), 1000 + i);
  }
}

// A reader further behind than --watcher_backlog_events is ended with
// RESOURCE_EXHAUSTED naming the flag; the other watchers go on.
TEST_F(ReleasedWatchersTest, AWatcherFurtherBehindThanItsBoundIsEnded) {
  Start(/*max_watchers=*/4, /*backlog_events=*/4);
  Release(100);
  Watch& w = Open();
  dynmo::v1::ReleasedEvent e;
  ASSERT_TRUE(w.reader->Read(&e));  // the snapshot: the stream is open
  Release(0, 10);  // ten events at once: ten behind
  EXPECT_FALSE(w.reader->Read(&e));
  const grpc::Status s = w.reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--watcher_backlog_events"), std::string::npos);
  watches_.pop_back();  // finished already
  Watch& next = Open();  // reconnected: the snapshot, then what follows
  for (int i = 0; i < 11; ++i) {
    ASSERT_TRUE(next.reader->Read(&e)) << i;
    EXPECT_EQ(e.kind(), dynmo::v1::ReleasedEvent::SNAPSHOT);
  }
  Release(20, 2);
  ASSERT_TRUE(next.reader->Read(&e));
  EXPECT_EQ(e.kind(), dynmo::v1::ReleasedEvent::RELEASED);
}

TEST_F(ReleasedWatchersTest, ShutdownEndsEveryWatcher) {
  Start(/*max_watchers=*/8);
  dynmo::v1::ReleasedEvent e;
  Watch& w = Open();
  Release(0);
  ASSERT_TRUE(w.reader->Read(&e));
  server_->Shutdown();
  EXPECT_FALSE(w.reader->Read(&e));
}

}  // namespace
}  // namespace dynmo::service
