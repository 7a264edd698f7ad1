#include "coordinator/service/released_pool.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "gtest/gtest.h"
#include "tests/service/state_dir_fixture.h"

namespace dynmo::service {
namespace {

dynmo::v1::ReleasedGpu Gpu(const std::string& job, uint64_t epoch, int rank) {
  dynmo::v1::ReleasedGpu g;
  g.set_job(job);
  g.set_epoch(epoch);
  g.set_rank(rank);
  g.set_host("h");
  g.set_device(rank);
  return g;
}

class ReleasedPoolTest : public StateDirTest {
 protected:
  void SetUp() override {
    StateDirTest::SetUp();
    pool_->AddWatcher();  // the history is kept while one watches
    ASSERT_TRUE(pool_->Add({Gpu("j", 1, 2), Gpu("j", 1, 3)}).ok());
  }
};

TEST_F(ReleasedPoolTest, AddIsIdempotentPerJobEpochRank) {
  ASSERT_TRUE(pool_->Add({Gpu("j", 1, 2)}).ok());
  EXPECT_EQ(pool_->List("", true).size(), 2u);
}

TEST_F(ReleasedPoolTest, ClaimIsAllOrNothing) {
  auto r = pool_->Claim({"gpu-1", "gpu-77"}, "sched", 60, absl::Now());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("gpu-77: unknown"), std::string::npos);
  EXPECT_EQ(pool_->List("", false).size(), 2u);  // nothing claimed
}

TEST_F(ReleasedPoolTest, LeaseBlocksOthersUntilItExpires) {
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(pool_->Claim({"gpu-1"}, "a", 60, t0).ok());
  EXPECT_FALSE(pool_->Claim({"gpu-1"}, "b", 60, t0 + absl::Seconds(10)).ok());
  EXPECT_TRUE(pool_->Claim({"gpu-1"}, "a", 60, t0 + absl::Seconds(10)).ok())
      << "the holder renews";
  EXPECT_TRUE(pool_->Claim({"gpu-1"}, "b", 60, t0 + absl::Seconds(100)).ok())
      << "an expired lease may be taken";
}

TEST_F(ReleasedPoolTest, OnlyTheHolderReturns) {
  ASSERT_TRUE(pool_->Claim({"gpu-2"}, "a", 60, absl::Now()).ok());
  EXPECT_EQ(pool_->Return({"gpu-2"}, "b").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool_->Return({"gpu-1"}, "a").status().code(),
            absl::StatusCode::kFailedPrecondition);  // not claimed
  auto twice = pool_->Return({"gpu-2", "gpu-2"}, "a");
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.status().message().find("gpu-2: listed twice"), std::string::npos)
      << twice.status();
  ASSERT_TRUE(pool_->Return({"gpu-2"}, "a").ok());
  EXPECT_EQ(pool_->List("", false).size(), 2u);
}

TEST_F(ReleasedPoolTest, AClaimTheStateDirRefusesIsNotWrittenLater) {
  // The temp file cannot be created: the claim is refused...
  ASSERT_EQ(mkdir((dir_ + "/pool.pb.tmp").c_str(), 0755), 0);
  EXPECT_FALSE(pool_->Claim({"gpu-1"}, "a", 60, absl::Now()).ok());
  ASSERT_EQ(rmdir((dir_ + "/pool.pb.tmp").c_str()), 0);
  // ... and a later successful commit does not carry it.
  ASSERT_TRUE(pool_->Claim({"gpu-2"}, "b", 60, absl::Now()).ok());
  StateKeeper again(dir_);
  auto state = again.Open();
  ASSERT_TRUE(state.ok()) << state.status();
  for (const auto& g : state->pool()) {
    if (g.id() == "gpu-1") {
      EXPECT_EQ(g.state(), dynmo::v1::ReleasedGpu::FREE) << "the refused claim came back";
    }
  }
}

TEST_F(ReleasedPoolTest, BadArgumentsAreInvalid) {
  EXPECT_EQ(pool_->Claim({}, "a", 60, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_->Claim({"gpu-1"}, "", 60, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_->Claim({"gpu-1"}, "a", 0, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ReleasedPoolTest, ClaimsSurviveARestart) {
  ASSERT_TRUE(pool_->Claim({"gpu-2"}, "sched", 600, absl::Now()).ok());
  StateKeeper keeper(dir_);
  auto state = keeper.Open();
  ASSERT_TRUE(state.ok());
  ReleasedPool restored(&keeper);
  restored.Restore(*state);
  auto all = restored.List("", true);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].state(), dynmo::v1::ReleasedGpu::CLAIMED);
  EXPECT_EQ(all[1].holder(), "sched");
  // New ids continue after the restored ones.
  ASSERT_TRUE(restored.Add({Gpu("k", 4, 0)}).ok());
  EXPECT_EQ(restored.List("k", true)[0].id(), "gpu-3");
}

TEST_F(ReleasedPoolTest, WatchersSeeEventsInOrder) {
  bool behind = true;
  EXPECT_EQ(pool_->WaitPast(0, absl::Milliseconds(10)), 2u);
  auto events = pool_->EventsAfter(0, 100, &behind);
  EXPECT_FALSE(behind);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].seq, 1u);
  EXPECT_EQ(events[0].kind, dynmo::v1::ReleasedEvent::RELEASED);
  dynmo::v1::ReleasedEvent decoded;
  ASSERT_TRUE(decoded.ParseFromString(events[0].encoded));
  EXPECT_EQ(decoded.kind(), dynmo::v1::ReleasedEvent::RELEASED);
  EXPECT_EQ(decoded.gpu().id(), "gpu-1");
  ASSERT_TRUE(pool_->Claim({"gpu-1"}, "a", 5, absl::Now()).ok());
  EXPECT_EQ(pool_->WaitPast(2, absl::Milliseconds(10)), 3u);
  events = pool_->EventsAfter(2, 100, &behind);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, dynmo::v1::ReleasedEvent::CLAIMED);
  EXPECT_EQ(pool_->EventsAfter(1, 1, &behind).size(), 1u);  // at most `max`
  EXPECT_TRUE(pool_->EventsAfter(3, 100, &behind).empty());
  EXPECT_FALSE(behind);
}

// Without a watcher events are numbered but not kept; the last watcher to
// leave drops the history.
TEST_F(ReleasedPoolTest, TheHistoryIsKeptOnlyWhileWatched) {
  bool behind = true;
  ASSERT_EQ(pool_->EventsAfter(0, 100, &behind).size(), 2u);
  pool_->AddWatcher();
  pool_->RemoveWatcher();
  EXPECT_EQ(pool_->EventsAfter(0, 100, &behind).size(), 2u) << "one watcher is left";
  pool_->RemoveWatcher();
  EXPECT_TRUE(pool_->EventsAfter(0, 100, &behind).empty());
  EXPECT_FALSE(behind);
  ASSERT_TRUE(pool_->Claim({"gpu-1"}, "a", 5, absl::Now()).ok());
  EXPECT_EQ(pool_->LastSeq(), 3u) << "numbered";
  EXPECT_TRUE(pool_->EventsAfter(2, 100, &behind).empty()) << "not kept";
  // A watcher from now on reads what follows its snapshot at 3.
  pool_->AddWatcher();
  ASSERT_TRUE(pool_->Return({"gpu-1"}, "a").ok());
  auto events = pool_->EventsAfter(3, 100, &behind);
  EXPECT_FALSE(behind);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].seq, 4u);
  EXPECT_EQ(events[0].kind, dynmo::v1::ReleasedEvent::RETURNED);
  pool_->RemoveWatcher();
  pool_->RemoveWatcher();  // one too many: nothing below zero
  pool_->AddWatcher();
  ASSERT_TRUE(pool_->Claim({"gpu-2"}, "a", 5, absl::Now()).ok());
  EXPECT_EQ(pool_->EventsAfter(4, 100, &behind).size(), 1u);
}

// The history keeps the last 4,096 events: a cursor before them is behind.
TEST_F(ReleasedPoolTest, ACursorBeforeTheHistoryIsBehind) {
  for (int i = 0; i < 41; ++i) {
    std::vector<dynmo::v1::ReleasedGpu> gpus;
    for (int k = 0; k < 100; ++k) gpus.push_back(Gpu("h", 1, i * 100 + k));
    ASSERT_TRUE(pool_->Add(std::move(gpus)).ok());
  }
  const uint64_t last = pool_->LastSeq();
  ASSERT_EQ(last, 2u + 4100u);
  bool behind = false;
  EXPECT_TRUE(pool_->EventsAfter(0, 10, &behind).empty());
  EXPECT_TRUE(behind);
  auto events = pool_->EventsAfter(last - 4096, 10, &behind);  // the oldest kept is next
  EXPECT_FALSE(behind);
  ASSERT_EQ(events.size(), 10u);
  EXPECT_EQ(events[0].seq, last - 4095);
}

}  // namespace
}  // namespace dynmo::service
