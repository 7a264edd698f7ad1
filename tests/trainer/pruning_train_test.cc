// dynmo-train --dynamism=pruning end to end (ranks are real processes):
// gradual global magnitude pruning is the same arithmetic at any pipeline
// depth and under live migration of pruned (CSR) layers with their AdamW
// state (losses bit-identical to pp=1), and with the embedded coordinator
// under the on-event trigger the pruning step's "model changed" leads to a
// plan that the job applies, lowering the imbalance pruning created.
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/train_job.h"
#include "tests/trainer/dynamism_test_util.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

// 4 blocks = 6 pipeline layers; pruning steps after iterations 1, 3, 5
// (Zhu-Gupta from 0% at 1 to 90% at 5: 0, 78.75%, 90%). Forms by threshold:
// timed forms could differ between the runs compared bit for bit.
std::vector<std::string> SmallPruningJob(std::vector<std::string> extra) {
  std::vector<std::string> flags = {
      "--layers=4", "--hidden=64", "--heads=4", "--seq_len=32", "--micro_batch=4",
      "--microbatches=4", "--steps=10", "--lr=0.003", "--seed=5",
      "--intra_op_threads=1", "--layer_clock=cpu", "--timeout_s=60", "--dynamism=pruning",
      "--prune_start=1", "--prune_end=5", "--prune_every=2",
      "--prune_final_sparsity=0.9", "--prune_form=threshold"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(PruningTrainTest, PrunedJobAtPp2AndUnderMigrationMatchesPp1BitForBit) {
  JobResult one = RunJob(1, SmallPruningJob({"--pp=1"}));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_EQ(one.losses.size(), 10u);
  EXPECT_THAT(one.logs[0], HasSubstr("iteration 3: pruned stage 0 to global sparsity 0.787"));
  EXPECT_THAT(one.logs[0], HasSubstr("iteration 5: pruned stage 0 to global sparsity 0.900"));
  JobResult dense = RunJob(1, SmallPruningJob({"--pp=1", "--dynamism=none"}));
  ASSERT_TRUE(dense.ok()) << dense.AllLogs();
  // Identical until the first real pruning step (after iteration 3).
  for (int i = 0; i <= 3; ++i) EXPECT_EQ(one.losses[i], dense.losses[i]) << i;
  EXPECT_NE(one.losses[4], dense.losses[4]) << "pruning changed nothing";

  JobResult two = RunJob(2, SmallPruningJob({"--pp=2"}));
  ASSERT_TRUE(two.ok()) << two.AllLogs();
  EXPECT_EQ(two.losses, one.losses);

  // Pruned blocks (CSR arrays, masks, gathered moments) move both ways
  // across the boundary at iterations 3, 6 and 9.
  JobResult moved = RunJob(2, SmallPruningJob({"--pp=2", "--test_migrate_every=3",
                                               "--test_migration_boundaries=0,5,6;0,1,6"}));
  ASSERT_TRUE(moved.ok()) << moved.AllLogs();
  EXPECT_EQ(moved.losses, one.losses);
  EXPECT_EQ(moved.records.back()["epoch"].get<int64_t>(), 3);
}

// 8 blocks = 10 pipeline layers, uniform start 0,5,10, one pruning step to
// 99% after iteration 4. Dense, stage 1 (4 blocks + the LM head of a
// 4,096-token vocabulary) is already the slower one, but the on-event
// trigger decides only when the model changes. Pruning makes every block
// ~2.5x cheaper (CSR at 99%; at 90% a CSR block is no faster than MKL's
// dense one on this CPU) but not the head, so stage 1 becomes far the
// bottleneck: the imbalance pruning creates, which DynMo must remove.
std::vector<std::string> RebalanceJob(int steps, std::vector<std::string> extra) {
  std::vector<std::string> flags = {
      "--layers=8", "--hidden=128", "--heads=4", "--seq_len=32", "--vocab=4096",
      "--micro_batch=4", "--microbatches=4", absl::StrCat("--steps=", steps),
      "--lr=0.003", "--seed=5", "--intra_op_threads=1", "--layer_clock=cpu", "--timeout_s=120",
      "--pp=2", "--dynamism=pruning", "--prune_start=4", "--prune_end=4",
      "--prune_every=1", "--prune_final_sparsity=0.99"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(PruningTrainTest, EmbeddedCoordinatorRebalancesTheImbalancePruningCreated) {
  // Room for the on-event plan to land on a loaded machine: pruned
  // iterations are cheap, and the assertions look at whatever came after.
  const int steps = 45;
  JobResult r = RunJob(2, RebalanceJob(steps, {"--coordinator=embedded",
                                               absl::StrCat("--job=pruning-", getpid()),
                                               "--balancer=time", "--trigger=on-event"}),
                       std::chrono::seconds(240));
  ASSERT_TRUE(r.ok()) << r.AllLogs();
  ASSERT_EQ(r.records.size(), static_cast<size_t>(steps)) << r.AllLogs();
  EXPECT_THAT(r.logs[0], HasSubstr("iteration 4: pruned stage 0 to global sparsity 0.990"));
  EXPECT_THAT(r.logs[0], HasSubstr("(on-event)"));
  const size_t applied = FirstRebalanced(r.records);
  ASSERT_LT(applied, r.records.size()) << "no plan was applied\n" << r.AllLogs();
  EXPECT_GT(applied, 5u) << "a plan came before pruning changed the model";
  EXPECT_EQ(r.records[applied - 1]["boundaries"].get<std::vector<int>>(),
            (std::vector<int>{0, 5, 10}));
  // The coordinator may decide once more when the other stage's flagged
  // report arrives: the layout that counts is the last one.
  size_t last = applied;
  for (size_t i = applied; i < r.records.size(); ++i) {
    if (r.records[i]["epoch"] != r.records[i - 1]["epoch"]) last = i;
  }
  ASSERT_LT(last + 3, r.records.size()) << "too few iterations after the last plan";
  const std::vector<int> after = r.records.back()["boundaries"].get<std::vector<int>>();
  EXPECT_GT(after[1], 5) << "stage 0 (its blocks pruned, no head) takes more layers\n"
                         << r.AllLogs();
  // Right after pruning, static (iterations 5 .. applied-1) vs re-balanced
  // (from one iteration after the last migration, which is inside its own
  // iteration's time).
  const double pruned_static = MeanImbalance(r.records, 5, applied);
  const double rebalanced = MeanImbalance(r.records, last + 1, r.records.size());
  std::cout << "imbalance dense " << MeanImbalance(r.records, 1, 4) << ", pruned+static "
            << pruned_static << ", re-balanced " << rebalanced << ", boundaries 0,5,10 -> "
            << after[0] << "," << after[1] << "," << after[2] << std::endl;
  EXPECT_LT(rebalanced, pruned_static);
}

}  // namespace
}  // namespace dynmo::trainer
