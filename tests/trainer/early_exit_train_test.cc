// dynmo-train --dynamism=early-exit end to end (ranks are real processes):
// the token mask travels with the activations so pp=2 computes what pp=1
// computes (bit-identical losses), and with the embedded coordinator under
// the on-event trigger the exit profile's change is detected and the job,
// whose later blocks became cheap, is re-balanced while it trains.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/train_job.h"
#include "tests/trainer/dynamism_test_util.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

// 8 blocks = 10 pipeline layers, exit points after blocks 2..7. From
// iteration 4 on every token is confident enough (threshold 0) and leaves
// at block 2, so blocks 3..8 only copy tokens through (and give keys and
// values): the uniform pp=2 split 0,5,10 leaves stage 1 nearly idle.
std::vector<std::string> EarlyExitJob(int steps, std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {
      "--layers=8", "--hidden=64", "--heads=4", "--seq_len=32",
      "--micro_batch=4", "--microbatches=4", "--steps=" + std::to_string(steps),
      "--lr=0.01", "--seed=7", "--intra_op_threads=1", "--layer_clock=cpu", "--timeout_s=60",
      "--dynamism=early-exit", "--exit_after=2", "--exit_threshold=0",
      "--exit_warmup_iters=4"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(EarlyExitTrainTest, TokenMaskTravelsBetweenStagesSoPp2MatchesPp1BitForBit) {
  JobResult one = RunJob(1, EarlyExitJob(8, {"--pp=1"}));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  EXPECT_THAT(one.logs[0], HasSubstr("iteration 4: early exit: tokens in flight after "
                                     "blocks 1..8: 1.00 0.00 0.00"));
  // Exit point at block 4 on stage 0, its survivors' mask crosses to stage 1.
  JobResult two = RunJob(2, EarlyExitJob(8, {"--pp=2", "--initial_boundaries=0,4,10"}));
  ASSERT_TRUE(two.ok()) << two.AllLogs();
  EXPECT_EQ(two.losses, one.losses);
}

TEST(EarlyExitTrainTest, EmbeddedCoordinatorRebalancesOnceTokensExit) {
  JobResult r = RunJob(2, EarlyExitJob(30, {"--pp=2", "--coordinator=embedded",
                                            "--job=early-exit", "--balancer=time",
                                            "--trigger=on-event"}),
                       std::chrono::seconds(150));
  ASSERT_TRUE(r.ok()) << r.AllLogs();
  ASSERT_EQ(r.records.size(), 30u) << r.AllLogs();
  EXPECT_THAT(r.logs[0], HasSubstr("early exit: tokens in flight"));
  const size_t applied = FirstRebalanced(r.records);
  ASSERT_LT(applied, r.records.size()) << "no plan was applied\n" << r.AllLogs();
  EXPECT_GT(applied, 4u) << "the on-event trigger fired before any token exited";
  EXPECT_EQ(r.records[applied - 1]["boundaries"].get<std::vector<int>>(),
            (std::vector<int>{0, 5, 10}));
  // The now cheap later blocks go to stage 1 with more of them.
  const std::vector<int> after = r.records.back()["boundaries"].get<std::vector<int>>();
  EXPECT_LT(after[1], 5) << r.AllLogs();
  const double exited_static = MeanImbalance(r.records, 5, applied);
  const double rebalanced = MeanImbalance(r.records, applied + 1, r.records.size());
  std::cout << "imbalance exited+static " << exited_static << ", re-balanced "
            << rebalanced << ", boundaries 0,5,10 -> " << after[0] << "," << after[1]
            << "," << after[2] << std::endl;
  EXPECT_LT(rebalanced, exited_static);
}

}  // namespace
}  // namespace dynmo::trainer
