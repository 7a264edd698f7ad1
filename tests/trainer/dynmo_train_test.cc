// dynmo-train end to end: ranks are real processes of the built binary on
// loopback, configured through torchrun's environment variables, exactly as
// a launcher starts them. The central check is numerical: with
// deterministic CPU kernels (one intra-op thread, fixed seeds) the
// per-iteration losses of a pipelined run are bit-identical to pp=1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/train_job.h"
#include "trainer/data/indexed_dataset.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;


// The tiny model every numerical test trains: 4 blocks (6 pipeline layers),
// hidden 32, 4 heads, 16 tokens, 4 micro-batches of 2, 3 steps.
std::vector<std::string> TinyModel(std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--layers=4", "--hidden=32", "--heads=4",
                                    "--seq_len=16", "--micro_batch=2",
                                    "--microbatches=4", "--steps=3", "--lr=0.01",
                                    "--seed=7", "--intra_op_threads=1"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(DynmoTrainTest, SingleProcessRunsWithoutLauncherAndLearns) {
  JobResult run = RunJob(0, TinyModel({"--steps=8"}));
  ASSERT_TRUE(run.ok()) << run.AllLogs();
  ASSERT_EQ(run.losses.size(), 8u);
  EXPECT_LT(run.losses.back(), run.losses.front()) << run.AllLogs();
  EXPECT_THAT(run.logs[0], HasSubstr("iter 7 | loss"));
  EXPECT_THAT(run.logs[0], HasSubstr("dynmo-train: done"));
  const nlohmann::json& r = run.records.back();
  EXPECT_EQ(r["iter"], 7);
  EXPECT_EQ(r["boundaries"], nlohmann::json::array({0, 6}));
  EXPECT_EQ(r["epoch"], 0);
  EXPECT_EQ(r["stage_times"].size(), 1u);
  EXPECT_GT(r["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(r["layer_forward_s"].size(), 6u);
}

TEST(DynmoTrainTest, TwoStagePipelineLossesEqualSingleStageBitForBit) {
  JobResult one = RunJob(1, TinyModel({"--pp=1"}));
  JobResult two = RunJob(2, TinyModel({"--pp=2"}));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_TRUE(two.ok()) << two.AllLogs();
  ASSERT_EQ(one.losses.size(), 3u);
  EXPECT_EQ(two.losses, one.losses);
  EXPECT_EQ(two.records[0]["boundaries"], nlohmann::json::array({0, 3, 6}));
  EXPECT_EQ(two.records[0]["stage_times"].size(), 2u);
}

TEST(DynmoTrainTest, FourStagePipelineAndSkewedPartitionsEqualSingleStage) {
  JobResult one = RunJob(1, TinyModel());
  JobResult four = RunJob(4, TinyModel({"--pp=4"}));
  JobResult skewed = RunJob(2, TinyModel({"--pp=2", "--initial_boundaries=0,1,6"}));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_TRUE(four.ok()) << four.AllLogs();
  ASSERT_TRUE(skewed.ok()) << skewed.AllLogs();
  EXPECT_EQ(four.losses, one.losses);
  EXPECT_EQ(skewed.losses, one.losses);
  EXPECT_EQ(skewed.records[0]["boundaries"], nlohmann::json::array({0, 1, 6}));
}

TEST(DynmoTrainTest, DataParallelMatchesTheSameGlobalBatchOnOneReplica) {
  // dp=2 x 2 micro-batches covers the same samples as dp=1 x 4 micro-batches;
  // only the order of floating-point sums differs.
  JobResult single = RunJob(2, TinyModel({"--pp=2", "--dp=1", "--microbatches=4"}));
  JobResult replicated = RunJob(4, TinyModel({"--pp=2", "--dp=2", "--microbatches=2"}));
  ASSERT_TRUE(single.ok()) << single.AllLogs();
  ASSERT_TRUE(replicated.ok()) << replicated.AllLogs();
  ASSERT_EQ(replicated.losses.size(), single.losses.size());
  for (size_t i = 0; i < single.losses.size(); ++i) {
    EXPECT_NEAR(replicated.losses[i], single.losses[i], 1e-5 * single.losses[i]) << i;
  }
}

TEST(DynmoTrainTest, TrainsOnAMegatronIndexedDataset) {
  const std::string prefix = TempPath("mmidx");
  std::vector<std::vector<int64_t>> docs;
  for (int d = 0; d < 20; ++d) {
    std::vector<int64_t> doc;
    for (int t = 0; t < 50; ++t) doc.push_back((d * 7 + t * 3) % 500);
    docs.push_back(doc);
  }
  ASSERT_TRUE(WriteIndexedDataset(prefix, IndexedDType::kUInt16, docs).ok());
  JobResult run = RunJob(2, TinyModel({"--pp=2", "--vocab=512", "--data=" + prefix}));
  ASSERT_TRUE(run.ok()) << run.AllLogs();
  EXPECT_EQ(run.losses.size(), 3u);
  EXPECT_THAT(run.logs[0], HasSubstr("data " + prefix));
}

// Live migration: a test policy moves layers (weights + AdamW state) between
// ranks every two iterations; the losses must not change by a single bit.
TEST(DynmoTrainTest, LiveMigrationKeepsLossesBitIdenticalAtPp2AndPp4) {
  const std::vector<std::string> steps = {"--steps=7"};
  JobResult one = RunJob(1, TinyModel(steps));
  JobResult two = RunJob(2, TinyModel({"--steps=7", "--pp=2", "--test_migrate_every=2",
                                       "--test_migration_boundaries=0,1,6;0,5,6;0,3,6"}));
  JobResult four = RunJob(4, TinyModel({"--steps=7", "--pp=4", "--test_migrate_every=2",
                                        "--test_migration_boundaries=0,1,2,3,6;0,3,4,5,6"}));
  ASSERT_TRUE(one.ok()) << one.AllLogs();
  ASSERT_TRUE(two.ok()) << two.AllLogs();
  ASSERT_TRUE(four.ok()) << four.AllLogs();
  ASSERT_EQ(one.losses.size(), 7u);
  EXPECT_EQ(two.losses, one.losses);
  EXPECT_EQ(four.losses, one.losses);
  // The records show the partitions and plan epochs the iterations ran under.
  EXPECT_EQ(two.records[1]["boundaries"], nlohmann::json::array({0, 3, 6}));
  EXPECT_EQ(two.records[2]["boundaries"], nlohmann::json::array({0, 1, 6}));
  EXPECT_EQ(two.records[4]["boundaries"], nlohmann::json::array({0, 5, 6}));
  EXPECT_EQ(two.records[6]["boundaries"], nlohmann::json::array({0, 3, 6}));
  EXPECT_EQ(two.records[6]["epoch"], 3);
  EXPECT_EQ(four.records[2]["boundaries"], nlohmann::json::array({0, 1, 2, 3, 6}));
  EXPECT_EQ(four.records[4]["boundaries"], nlohmann::json::array({0, 3, 4, 5, 6}));
}

TEST(DynmoTrainTest, LiveMigrationWithDataParallelReplicasIsBitIdentical) {
  const std::vector<std::string> shape = {"--steps=5", "--pp=2", "--dp=2", "--microbatches=2"};
  std::vector<std::string> migrating = shape;
  migrating.push_back("--test_migrate_every=2");
  migrating.push_back("--test_migration_boundaries=0,4,6;0,2,6");
  JobResult still = RunJob(4, TinyModel(shape));
  JobResult moving = RunJob(4, TinyModel(migrating));
  ASSERT_TRUE(still.ok()) << still.AllLogs();
  ASSERT_TRUE(moving.ok()) << moving.AllLogs();
  ASSERT_EQ(still.losses.size(), 5u);
  EXPECT_EQ(moving.losses, still.losses);
  EXPECT_EQ(moving.records[4]["boundaries"], nlohmann::json::array({0, 2, 6}));
}

TEST(DynmoTrainTest, AKilledRankStopsItsPeersWithAClearError) {
  // The collective timeout (1000 s) is far beyond the harness's guard
  // (240 s, after which it SIGKILLs rank 0): rank 0 exiting 1 with the error
  // proves it saw the broken connection, with no clock in the assertion.
  JobResult run = RunJob(2, TinyModel({"--pp=2", "--steps=100000", "--timeout_s=1000"}),
                         std::chrono::seconds(240), /*kill_rank=*/1,
                         /*kill_after_iters=*/2);
  EXPECT_EQ(run.exit_codes[1], 128 + SIGKILL);
  EXPECT_EQ(run.exit_codes[0], 1) << run.AllLogs();
  EXPECT_THAT(run.logs[0], HasSubstr("dynmo-train: error: rank 0"));
}

TEST(DynmoTrainTest, ARankThatDiesDuringRendezvousStopsRankZeroWithinTheTimeout) {
  // Rank 1 is killed at once: in the store rendezvous or Gloo's full-mesh
  // connect, depending on how far it got. Rank 0 must give up by its 5 s
  // timeout; a rank 0 that hung would be SIGKILLed by the harness's guard
  // (exit 137), so the exit code says it, not a clock.
  JobResult run = RunJob(2, TinyModel({"--pp=2", "--timeout_s=5"}),
                         std::chrono::seconds(240), /*kill_rank=*/1,
                         /*kill_after_iters=*/0);
  EXPECT_EQ(run.exit_codes[1], 128 + SIGKILL);
  EXPECT_EQ(run.exit_codes[0], 1) << run.AllLogs();
  EXPECT_THAT(run.logs[0], HasSubstr("dynmo-train: error: rank 0 connecting"));
}

// Runs one process with `flags` and returns (exit code, output).
std::pair<int, std::string> RunBad(int world, std::vector<std::string> flags) {
  JobResult r = RunJob(world, flags, std::chrono::seconds(60));
  return {r.exit_codes[0], r.logs[0]};
}

TEST(DynmoTrainTest, BadFlagsAndInconsistentConfigsGiveOneLineErrors) {
  struct Case {
    int world;
    std::vector<std::string> flags;
    std::string message;
    // Found once the run starts (the corpus read, the device resolved):
    // exit 1 after the start-up line, not a bad command line (exit 2).
    bool at_start = false;
  };
  const std::vector<Case> cases = {
      {0, {"--no_such_flag=1"}, "unknown flag '--no_such_flag'"},
      {0, {"--pp=two"}, "invalid value 'two' for --pp"},
      {0, {"stray"}, "unexpected argument 'stray'"},
      {0, TinyModel({"--pp=2"}), "--pp=2 x --dp=1 = 2 ranks but WORLD_SIZE=1"},
      {1, TinyModel({"--pp=2", "--dp=2"}), "= 4 ranks but WORLD_SIZE=1"},
      {0, TinyModel({"--pp=7"}), "--pp=7 stages but the model has only 6 pipeline layers"},
      {0, TinyModel({"--initial_boundaries=0,6"}), ""},  // valid for pp=1
      {0, TinyModel({"--initial_boundaries=0,3,6"}), "--initial_boundaries=0,3,6"},
      {0, TinyModel({"--initial_boundaries=0,a"}), "comma-separated integers"},
      {0, TinyModel({"--heads=5"}), "--hidden=32 is not divisible by --heads=5"},
      {0, TinyModel({"--vocab=64"}), "but --vocab=64", true},
      {0, TinyModel({"--data=/nonexistent/corpus.txt"}), "cannot open --data=/nonexistent/corpus.txt",
       true},
      {0, TinyModel({"--steps=0"}), "--steps must be >= 1"},
      {0, TinyModel({"--backend=mpi"}), "--backend must be gloo, nccl or nccl-double, not 'mpi'"},
      // NCCL moves GPU tensors: asking for it on the CPU is a clear error.
      {0, TinyModel({"--backend=nccl", "--device=cpu"}),
       "--backend=nccl needs a CUDA device", true},
      {0, TinyModel({"--device=tpu"}), "--device must be auto, cpu, cuda or cuda:N"},
      {0, TinyModel({"--test_migrate_every=2"}), "needs --test_migration_boundaries"},
      {0, TinyModel({"--perfetto_out=/tmp", "--perfetto_iterations=0"}),
       "--perfetto_iterations in [1, 1000]"},
      {0, TinyModel({"--perfetto_out=/no/such/dir"}), "--perfetto_out: cannot write /no/such/dir/"},
      {2, TinyModel({"--pp=2", "--test_migrate_every=2", "--test_migration_boundaries=0,6"}),
       "--test_migration_boundaries entry 0,6"},
  };
  for (const Case& c : cases) {
    auto [code, output] = RunBad(c.world, c.flags);
    if (c.message.empty()) {
      EXPECT_EQ(code, 0) << output;
      continue;
    }
    // A bad command line: exit 2 and one line, as in every DynMo program.
    EXPECT_EQ(code, c.at_start ? 1 : 2) << c.message << ": " << output;
    EXPECT_THAT(output, HasSubstr(c.message));
    std::vector<std::string> lines = absl::StrSplit(output, '\n', absl::SkipEmpty());
    EXPECT_EQ(lines.size(), c.at_start ? 2u : 1u) << output;
  }
}

}  // namespace
}  // namespace dynmo::trainer
