// FindStuckRank: who is named when a job stops making progress.
#include "launcher/stuck_rank.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "gtest/gtest.h"

namespace dynmo::launcher {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'000'000);

RankLiveness Rank(int rank, int64_t iteration, absl::Duration ago, bool stopped = false) {
  return RankLiveness{rank, 100 + rank, iteration, kNow - ago, stopped};
}

TEST(StuckRankTest, NothingWhileEveryRankProgresses) {
  std::vector<RankLiveness> r = {Rank(0, 50, absl::Seconds(1)), Rank(1, 50, absl::Seconds(2))};
  EXPECT_FALSE(FindStuckRank(r, kNow, absl::Seconds(60)));
  EXPECT_FALSE(FindStuckRank(r, kNow, absl::ZeroDuration())) << "0 turns it off";
  EXPECT_FALSE(FindStuckRank({}, kNow, absl::Seconds(60)));
}

TEST(StuckRankTest, TheRankFurthestBehindIsNamedNotTheNeighbourThatWaited) {
  // Rank 2 stopped after iteration 40; its neighbours stalled at 41 a bit
  // later, so their reports are older than the timeout too.
  std::vector<RankLiveness> r = {Rank(0, 41, absl::Seconds(70)), Rank(1, 41, absl::Seconds(80)),
                                 Rank(2, 40, absl::Seconds(75)), Rank(3, 41, absl::Seconds(90))};
  auto v = FindStuckRank(r, kNow, absl::Seconds(60));
  ASSERT_TRUE(v);
  EXPECT_EQ(v->rank, 2);
  EXPECT_NE(v->why.find("rank 2 (pid 102) made no progress for 1m15s"), std::string::npos)
      << v->why;
  EXPECT_NE(v->why.find("its newest iteration is 40, the job's newest is 41"),
            std::string::npos)
      << v->why;
}

TEST(StuckRankTest, AStoppedProcessIsNamedFirst) {
  std::vector<RankLiveness> r = {Rank(0, 30, absl::Seconds(90)),
                                 Rank(1, 41, absl::Seconds(5), /*stopped=*/true),
                                 Rank(2, 41, absl::Seconds(2))};
  auto v = FindStuckRank(r, kNow, absl::Seconds(60));
  ASSERT_TRUE(v);
  EXPECT_EQ(v->rank, 1);
  EXPECT_NE(v->why.find("its process is stopped"), std::string::npos) << v->why;
}

TEST(StuckRankTest, ARankThatNeverReportedCountsFromTheLaunch) {
  std::vector<RankLiveness> r = {Rank(0, 3, absl::Seconds(1)), Rank(1, -1, absl::Seconds(30))};
  EXPECT_FALSE(FindStuckRank(r, kNow, absl::Seconds(60))) << "launched 30 s ago";
  r[1].last_progress = kNow - absl::Seconds(61);
  auto v = FindStuckRank(r, kNow, absl::Seconds(60));
  ASSERT_TRUE(v);
  EXPECT_EQ(v->rank, 1);
  EXPECT_NE(v->why.find("it has not finished an iteration"), std::string::npos) << v->why;
}

TEST(StuckRankTest, ProcessStoppedReadsTheProcessState) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  EXPECT_FALSE(ProcessStopped(child));
  kill(child, SIGSTOP);
  bool stopped = false;
  for (int i = 0; i < 200 && !stopped; ++i) {
    stopped = ProcessStopped(child);
    if (!stopped) usleep(5000);
  }
  EXPECT_TRUE(stopped);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(ProcessStopped(child)) << "a reaped process is not stopped";
}

}  // namespace
}  // namespace dynmo::launcher
