// dynmo-train --dynamism=freezing end to end (ranks are real processes):
// freezing the front of the model is the same arithmetic at any pipeline
// depth and under live migration (losses bit-identical to pp=1), and with
// the embedded coordinator under the on-event trigger the frozen, now cheap
// first stage is detected and the job is re-balanced while it trains.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/train_job.h"
#include "tests/trainer/dynamism_test_util.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

// 8 blocks = 10 pipeline layers. Checks after iterations 1, 3, 5, ...; the
// threshold is far above any plasticity, so the check after iteration 3
// (the first with a reference) freezes layers 0..4: embedding + blocks 1-4,
// the whole first stage of the uniform pp=2 split 0,5,10.
std::vector<std::string> FreezingJob(int steps, std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {
      "--layers=8", "--hidden=64", "--heads=4", "--seq_len=32",
      "--micro_batch=4", "--microbatches=4", "--steps=" + std::to_string(steps),
      "--lr=0.01", "--seed=7", "--intra_op_threads=1", "--layer_clock=cpu", "--timeout_s=60",
      "--dynamism=freezing", "--freeze_every=2", "--freeze_window=1",
      "--freeze_threshold=100", "--freeze_max_layers=5"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(FreezingTrainTest, FreezingAtPp2AndUnderMigrationMatchesPp1BitForBit) {
  JobResult one = RunJob(1, FreezingJob(10, {"--pp=1"}));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_EQ(one.losses.size(), 10u);
  EXPECT_THAT(one.logs[0], HasSubstr("iteration 3: froze layers 0..4"));
  JobResult unfrozen = RunJob(1, {"--layers=8", "--hidden=64", "--heads=4", "--seq_len=32",
                                  "--micro_batch=4", "--microbatches=4", "--steps=10",
                                  "--lr=0.01", "--seed=7", "--pp=1"});
  ASSERT_TRUE(unfrozen.ok()) << unfrozen.AllLogs();
  for (int i = 0; i <= 4; ++i) EXPECT_EQ(one.losses[i], unfrozen.losses[i]) << i;
  EXPECT_NE(one.losses[9], unfrozen.losses[9]) << "frozen layers stopped training";

  // Stage 0 entirely frozen: no gradient crosses the boundary at all.
  JobResult two = RunJob(2, FreezingJob(10, {"--pp=2"}));
  ASSERT_TRUE(two.ok()) << two.AllLogs();
  EXPECT_EQ(two.losses, one.losses);

  // Frozen layers move both ways across the boundary (0,7,10 then 0,3,10)
  // and stay frozen: frozen-ness comes from the job-wide prefix.
  JobResult moved = RunJob(2, FreezingJob(10, {"--pp=2", "--test_migrate_every=3",
                                               "--test_migration_boundaries=0,7,10;0,3,10"}));
  ASSERT_TRUE(moved.ok()) << moved.AllLogs();
  EXPECT_EQ(moved.losses, one.losses);
  EXPECT_EQ(moved.records.back()["epoch"].get<int64_t>(), 3);
}

TEST(FreezingTrainTest, EmbeddedCoordinatorRebalancesAfterTheFrontFreezes) {
  JobResult r = RunJob(2, FreezingJob(30, {"--pp=2", "--coordinator=embedded",
                                           "--job=freezing", "--balancer=time",
                                           "--trigger=on-event"}),
                       std::chrono::seconds(150));
  ASSERT_TRUE(r.ok()) << r.AllLogs();
  ASSERT_EQ(r.records.size(), 30u) << r.AllLogs();
  EXPECT_THAT(r.logs[0], HasSubstr("froze layers 0..4"));
  EXPECT_THAT(r.logs[0], HasSubstr("(on-event)"));
  const size_t applied = FirstRebalanced(r.records);
  ASSERT_LT(applied, r.records.size()) << "no plan was applied\n" << r.AllLogs();
  EXPECT_GT(applied, 4u) << "the on-event trigger fired before anything froze";
  EXPECT_EQ(r.records[applied - 1]["boundaries"].get<std::vector<int>>(),
            (std::vector<int>{0, 5, 10}));
  // The frozen first stage takes more layers.
  const std::vector<int> after = r.records.back()["boundaries"].get<std::vector<int>>();
  EXPECT_GT(after[1], 5) << r.AllLogs();
  // Imbalance while frozen and static vs once re-balanced (one iteration
  // after the migration, to skip its own cost).
  const double frozen_static = MeanImbalance(r.records, 5, applied);
  const double rebalanced = MeanImbalance(r.records, applied + 1, r.records.size());
  std::cout << "imbalance frozen+static " << frozen_static << ", re-balanced "
            << rebalanced << ", boundaries 0,5,10 -> " << after[0] << "," << after[1]
            << "," << after[2] << std::endl;
  EXPECT_LT(rebalanced, frozen_static);
}

}  // namespace
}  // namespace dynmo::trainer
