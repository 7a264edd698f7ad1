// Elastic re-shaping in dynmo-train, end to end: four real rank processes
// on loopback re-group live from pp=4 x dp=1 into pp=2 x dp=2 (and back):
// layers are copied to their new stages with weights and AdamW state, the
// new replicas are checked to hold identical state (CRC-32 of every
// layer's encoded state, per stage), the c10d groups are rebuilt, and the
// global batch stays the same, split over the new replicas.
//
// What is bit-exact and what is not: before the re-shape the losses are
// the static run's, bit for bit. After it the data-parallel mean sums the
// two replicas' gradients (and the loss of two halves of the batch) in a
// different order than one pipeline summing all micro-batches, so the
// losses match the static run only to a tolerance (kAfterReshapeTolerance,
// the largest relative difference observed here with margin). They match
// bit for bit a job that STARTS at pp=2 x dp=2 from a checkpoint of the
// static run taken at the same iteration: the re-shape carries the whole
// state exactly, and both then compute the same arithmetic.
#include <chrono>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/train_job.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

// Relative loss difference allowed after the re-shape against the static
// run: observed here 4.8e-8 (4 -> 2x2) and 1.7e-8 (2x2 -> 4), float32
// sums in another order; checked with a margin of 20.
constexpr double kAfterReshapeTolerance = 1e-6;

std::vector<double> Slice(const std::vector<double>& v, size_t from, size_t to) {
  return std::vector<double>(v.begin() + from, v.begin() + to);
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& want,
                 size_t from) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = from; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], kAfterReshapeTolerance * std::abs(want[i]))
        << "iteration " << i;
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  }
  // Printed so the observed difference stays visible next to the bound.
  std::cout << "largest relative loss difference after the re-shape: " << worst << std::endl;
}

TEST(DynmoTrainReshapeTest, FourStagesBecomeTwoStagesOfTwoReplicasLive) {
  const std::string dir = TempPath("reshape_ckpt");
  std::filesystem::remove_all(dir);
  // The static run, checkpointing after iterations 3 and 6.
  JobResult still = RunJob(4, ElasticTinyModel({"--pp=4", "--save_dir=" + dir, "--save_every=3"}));
  JobResult reshaped = RunJob(4, ElasticTinyModel({"--pp=4", "--test_reshape_at=3:2x2:0,3,6"}));
  ASSERT_TRUE(still.ok()) << still.AllLogs();
  ASSERT_TRUE(reshaped.ok()) << reshaped.AllLogs();
  ASSERT_EQ(still.losses.size(), 7u);
  ASSERT_EQ(reshaped.losses.size(), 7u);
  EXPECT_EQ(Slice(reshaped.losses, 0, 3), Slice(still.losses, 0, 3));
  ExpectClose(reshaped.losses, still.losses, 3);
  // Rank 0 reports the new grid and one state checksum per stage, which
  // both replicas of the stage matched (else the job fails).
  EXPECT_THAT(reshaped.logs[0],
              HasSubstr("iteration 3: re-shaped pp 4 x dp 1 -> pp 2 x dp 2 by the test "
                        "policy (boundaries 0,2,4,5,6 -> 0,3,6"));
  EXPECT_THAT(reshaped.logs[0], HasSubstr("2 micro-batches per replica); replicas "
                                          "identical, state CRC-32 per stage: "));
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(reshaped.records[i]["active_ranks"], 4);
    EXPECT_EQ(reshaped.records[i]["microbatches"], i < 3 ? 4 : 2);
    EXPECT_EQ(reshaped.records[i]["boundaries"],
              i < 3 ? nlohmann::json::array({0, 2, 4, 5, 6})
                    : nlohmann::json::array({0, 3, 6}));
  }
  EXPECT_THAT(reshaped.logs[0], HasSubstr("dynmo-train: done, 7 iterations"));

  // A job that starts at pp=2 x dp=2 from the static run's state after
  // iteration 3 computes exactly what the re-shaped job did.
  std::filesystem::remove_all(dir + "/iter_6");
  JobResult started = RunJob(4, ElasticTinyModel({"--pp=2", "--dp=2", "--microbatches=2",
                                           "--initial_boundaries=0,3,6",
                                           "--load_dir=" + dir}));
  ASSERT_TRUE(started.ok()) << started.AllLogs();
  EXPECT_EQ(started.losses, Slice(reshaped.losses, 3, 7));
  std::filesystem::remove_all(dir);
}

TEST(DynmoTrainReshapeTest, TwoReplicasBecomeAFourStagePipelineLive) {
  const std::vector<std::string> grid = {"--pp=2", "--dp=2", "--microbatches=2"};
  std::vector<std::string> reshaping = grid;
  reshaping.push_back("--test_reshape_at=2:4x1");
  JobResult one = RunJob(1, ElasticTinyModel());
  JobResult still = RunJob(4, ElasticTinyModel(grid));
  JobResult reshaped = RunJob(4, ElasticTinyModel(reshaping));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_TRUE(still.ok()) << still.AllLogs();
  ASSERT_TRUE(reshaped.ok()) << reshaped.AllLogs();
  EXPECT_EQ(Slice(reshaped.losses, 0, 2), Slice(still.losses, 0, 2));
  // After it the job is a 4-stage pipeline over the whole batch: the
  // arithmetic of pp=1 (not bit for bit: the first iterations' gradients
  // were dp means).
  ExpectClose(reshaped.losses, one.losses, 2);
  EXPECT_THAT(reshaped.logs[0], HasSubstr("re-shaped pp 2 x dp 2 -> pp 4 x dp 1"));
  EXPECT_EQ(reshaped.records[6]["boundaries"], nlohmann::json::array({0, 2, 4, 5, 6}));
  EXPECT_EQ(reshaped.records[6]["microbatches"], 4);
}

TEST(DynmoTrainReshapeTest, ShapesThatDoNotFitAreRefusedOnEveryRank) {
  struct Case {
    std::vector<std::string> flags;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"--pp=4", "--test_reshape_at=3:3x1"}, "needs 3 ranks but the job runs on 4"},
      {{"--pp=4", "--microbatches=2", "--test_reshape_at=3:1x4"},
       "global batch of 2 micro-batches"},
      {{"--pp=4", "--test_reshape_at=3:2x2:0,5,7"}, "boundaries 0,5,7"},
      {{"--pp=4", "--test_reshape_at=3:2by2"}, "PPxDP must be two positive integers"},
      {{"--pp=4", "--test_reshape_at=3:2x2", "--test_migrate_every=2",
        "--test_migration_boundaries=0,1,2,3,6"},
       "cannot be combined"},
  };
  for (const Case& c : cases) {
    JobResult r = RunJob(4, ElasticTinyModel(c.flags), std::chrono::seconds(60));
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(r.exit_codes[rank], 2) << r.AllLogs();  // a bad command line
      EXPECT_THAT(r.logs[rank], HasSubstr(c.error)) << r.logs[rank];
    }
  }
}

TEST(DynmoTrainReshapeTest, TheEmbeddedCoordinatorReshapesAFourStageJob) {
  // Policy elastic = reshape: the coordinator's cost model finds a shorter
  // pipeline with more replicas faster on the measured layers (the tiny
  // model fits one rank), sends Plan.reshape, and every rank regroups live.
  const std::vector<std::string> common = {"--steps=30"};
  JobResult one = RunJob(1, ElasticTinyModel(common));
  JobResult four = RunJob(
      4, ElasticTinyModel({"--steps=30", "--pp=4", "--coordinator=embedded", "--job=reshape",
                           "--trigger=every:3", "--repack", "--elastic=reshape"}),
      std::chrono::seconds(180));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_TRUE(four.ok()) << four.AllLogs();
  ASSERT_EQ(four.losses.size(), 30u) << four.AllLogs();
  EXPECT_THAT(four.logs[0], HasSubstr("re-shaped pp 4 x dp 1 -> pp ")) << four.AllLogs();
  // Shown so the grid the cost model chose stays visible.
  const size_t at = four.logs[0].find("re-shaped");
  if (at != std::string::npos) {
    std::cout << four.logs[0].substr(at, four.logs[0].find('\n', at) - at) << std::endl;
  }
  const nlohmann::json& last = four.records.back();
  EXPECT_GT(last["epoch"].get<int64_t>(), 0);
  EXPECT_EQ(last["active_ranks"], 4);  // nothing released
  EXPECT_LT(last["microbatches"].get<int>(), four.records.front()["microbatches"].get<int>());
  ExpectClose(four.losses, one.losses, 0);
}

}  // namespace
}  // namespace dynmo::trainer
