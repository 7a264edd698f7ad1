// Per-layer checkpoints end to end (trainer/state/checkpoint.h): a job saved at
// pp=4 and resumed at pp=2 or pp=1 continues with per-iteration losses
// bit-identical to the run that was never interrupted (one intra-op thread,
// as the migration tests compare), and a missing or foreign checkpoint stops
// the job with a one-line error and a non-zero exit.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/train_job.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> TinyModel(std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--layers=4", "--hidden=32", "--heads=4",
                                    "--seq_len=16", "--micro_batch=2",
                                    "--microbatches=4", "--lr=0.01",
                                    "--seed=7", "--intra_op_threads=1"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

std::vector<double> LossesFrom(const JobResult& r, int64_t first_iter) {
  std::vector<double> out;
  for (const nlohmann::json& rec : r.records) {
    if (rec["iter"].get<int64_t>() >= first_iter) out.push_back(rec["loss"].get<double>());
  }
  return out;
}

TEST(DynmoTrainCheckpointTest, SavedAtPp4ResumedAtPp2AndPp1GivesIdenticalLosses) {
  const std::string dir = TempPath("ckpt");
  JobResult whole = RunJob(1, TinyModel({"--steps=7"}));
  // Saves iter_2 and iter_4; a migration between them moves layers first.
  JobResult saved = RunJob(4, TinyModel({"--steps=4", "--pp=4", "--save_dir=" + dir,
                                         "--save_every=2", "--test_migrate_every=3",
                                         "--test_migration_boundaries=0,3,4,5,6"}));
  ASSERT_TRUE(whole.ok()) << whole.AllLogs();
  ASSERT_TRUE(saved.ok()) << saved.AllLogs();
  EXPECT_THAT(saved.logs[0], HasSubstr("saved checkpoint " + dir + "/iter_4"));
  std::ifstream manifest(dir + "/iter_4/manifest.json");
  ASSERT_TRUE(manifest.good());
  const nlohmann::json m = nlohmann::json::parse(manifest);
  EXPECT_EQ(m["iteration"], 4);
  EXPECT_EQ(m["num_layers"], 6);
  EXPECT_EQ(m["saved_at"]["pp"], 4);
  EXPECT_EQ(m["saved_at"]["boundaries"], nlohmann::json::array({0, 3, 4, 5, 6}));
  EXPECT_EQ(m["samples_consumed"], 4 * 8);

  JobResult two = RunJob(2, TinyModel({"--steps=7", "--pp=2", "--load_dir=" + dir}));
  JobResult one = RunJob(0, TinyModel({"--steps=7", "--load_dir=" + dir}));
  ASSERT_TRUE(two.ok()) << two.AllLogs();
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  EXPECT_THAT(two.logs[0], HasSubstr("resumed from " + dir + "/iter_4"));
  ASSERT_EQ(two.records.size(), 3u);
  EXPECT_EQ(two.records.front()["iter"], 4);
  const std::vector<double> expected = LossesFrom(whole, 4);
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(LossesFrom(two, 4), expected);
  EXPECT_EQ(LossesFrom(one, 4), expected);
  // The losses before the save match too: the saved run is the same job.
  EXPECT_EQ(saved.losses, std::vector<double>(whole.losses.begin(), whole.losses.begin() + 4));
}

TEST(DynmoTrainCheckpointTest, AnIncompleteNewerCheckpointIsSkipped) {
  const std::string dir = TempPath("ckpt_partial");
  JobResult saved = RunJob(2, TinyModel({"--steps=2", "--pp=2", "--save_dir=" + dir}));
  ASSERT_TRUE(saved.ok()) << saved.AllLogs();
  // A save that died before its manifest: layer files, no manifest.
  mkdir((dir + "/iter_9").c_str(), 0755);
  std::ofstream(dir + "/iter_9/layer_0.state") << "partial";
  JobResult resumed = RunJob(0, TinyModel({"--steps=3", "--load_dir=" + dir}));
  ASSERT_TRUE(resumed.ok()) << resumed.AllLogs();
  EXPECT_THAT(resumed.logs[0], HasSubstr("resumed from " + dir + "/iter_2"));
  ASSERT_EQ(resumed.records.size(), 1u);
  EXPECT_EQ(resumed.records[0]["iter"], 2);
}

TEST(DynmoTrainCheckpointTest, MissingOrForeignCheckpointsAreOneLineErrors) {
  const std::string dir = TempPath("ckpt_foreign");
  JobResult saved = RunJob(0, TinyModel({"--steps=2", "--save_dir=" + dir}));
  ASSERT_TRUE(saved.ok()) << saved.AllLogs();
  struct Case {
    int world;
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {0, TinyModel({"--steps=3", "--load_dir=/nonexistent/ckpt"}),
       "--load_dir=/nonexistent/ckpt: no such directory"},
      {0, TinyModel({"--steps=3", "--load_dir=" + TempPath("ckpt_foreign_missing")}),
       "no such directory"},
      {0, TinyModel({"--steps=3", "--layers=6", "--load_dir=" + dir}),
       "different model: --layers=4 (this job: 6)"},
      {0, TinyModel({"--steps=3", "--hidden=64", "--load_dir=" + dir}),
       "--hidden=32 (this job: 64)"},
      {0, TinyModel({"--steps=3", "--microbatches=2", "--load_dir=" + dir}),
       "global batch of 8 samples"},
      {0, TinyModel({"--steps=2", "--load_dir=" + dir}), "nothing left of --steps=2"},
      {2, TinyModel({"--steps=3", "--pp=2", "--layers=2", "--load_dir=" + dir}),
       "different model"},
      {0, TinyModel({"--steps=3", "--save_every=2"}), "--save_every needs --save_dir"},
  };
  for (const Case& c : cases) {
    JobResult r = RunJob(c.world, c.flags, std::chrono::seconds(60));
    EXPECT_NE(r.exit_codes[0], 0) << c.message;
    EXPECT_THAT(r.logs[0], HasSubstr(c.message));
    EXPECT_THAT(r.logs[0], HasSubstr("dynmo-train: "));
    for (size_t rank = 1; rank < r.exit_codes.size(); ++rank) {
      EXPECT_NE(r.exit_codes[rank], 0) << "rank " << rank << ": " << c.message;
    }
  }
  // An empty directory holds no checkpoint.
  const std::string empty = TempPath("ckpt_empty");
  mkdir(empty.c_str(), 0755);
  JobResult r = RunJob(0, TinyModel({"--steps=3", "--load_dir=" + empty}));
  EXPECT_EQ(r.exit_codes[0], 1);
  EXPECT_THAT(r.logs[0], HasSubstr("holds no complete checkpoint"));
}

}  // namespace
}  // namespace dynmo::trainer
