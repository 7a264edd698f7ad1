// dynmo-train driven by the DynMo coordinator: ranks are real processes of
// the built binary on loopback (torchrun variables, as a launcher sets
// them) with --coordinator embedded, so rank 0 serves the coordinator and
// every rank runs an agent against it. The job starts from a skewed
// partition; the time balancer under an every:N trigger must move layers
// (in-band agreement, live migration) towards balance while training goes on.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
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

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;


// The layers' spread of stage sizes: max - min layers per stage.
int Skew(const std::vector<int>& b) {
  int lo = 1 << 30, hi = 0;
  for (size_t s = 0; s + 1 < b.size(); ++s) {
    lo = std::min(lo, b[s + 1] - b[s]);
    hi = std::max(hi, b[s + 1] - b[s]);
  }
  return hi - lo;
}

std::vector<std::string> SkewedJob(std::vector<std::string> extra = {}) {
  // 8 blocks = 10 pipeline layers; stage 0 holds 9 of them.
  std::vector<std::string> flags = {
      "--layers=8", "--hidden=32", "--heads=4", "--seq_len=16",
      "--micro_batch=2", "--microbatches=4", "--steps=30", "--lr=0.01",
      "--seed=7", "--intra_op_threads=1", "--layer_clock=cpu", "--pp=2",
      "--initial_boundaries=0,9,10", "--timeout_s=60"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(DynmoTrainAgentTest, EmbeddedCoordinatorRebalancesASkewedPipeline) {
  JobResult r = RunJob(2, SkewedJob({"--coordinator=embedded", "--job=skewed",
                                     "--balancer=time", "--trigger=every:3"}),
                       std::chrono::seconds(60));
  ASSERT_TRUE(r.ok()) << r.AllLogs();
  ASSERT_EQ(r.records.size(), 30u) << r.AllLogs();
  const std::vector<int> first = r.records.front()["boundaries"].get<std::vector<int>>();
  EXPECT_EQ(first, (std::vector<int>{0, 9, 10}));
  int64_t last_epoch = 0;
  int epoch_changes = 0;
  for (const nlohmann::json& rec : r.records) {
    const double loss = rec["loss"].get<double>();
    EXPECT_TRUE(std::isfinite(loss)) << rec.dump();
    const int64_t epoch = rec["epoch"].get<int64_t>();
    EXPECT_GE(epoch, last_epoch) << "epochs never go back";
    if (epoch > last_epoch) ++epoch_changes;
    last_epoch = epoch;
  }
  EXPECT_GE(epoch_changes, 1) << r.AllLogs();
  const std::vector<int> last = r.records.back()["boundaries"].get<std::vector<int>>();
  EXPECT_LT(Skew(last), Skew(first)) << r.AllLogs();
  EXPECT_THAT(r.logs[0], HasSubstr("applied plan epoch"));
}

TEST(DynmoTrainAgentTest, NoCoordinatorKeepsThePartition) {
  unsetenv("DYNMO_COORDINATOR");
  JobResult r = RunJob(2, SkewedJob({"--steps=4"}), std::chrono::seconds(60));
  ASSERT_TRUE(r.ok()) << r.AllLogs();
  for (const nlohmann::json& rec : r.records) {
    EXPECT_EQ(rec["epoch"].get<int64_t>(), 0);
    EXPECT_EQ(rec["boundaries"].get<std::vector<int>>(), (std::vector<int>{0, 9, 10}));
  }
}

TEST(DynmoTrainAgentTest, BadCoordinatorFlagIsAOneLineError) {
  JobResult r = RunJob(0, SkewedJob({"--pp=1", "--initial_boundaries=",
                                     "--coordinator=nowhere"}),
                       std::chrono::seconds(30));
  ASSERT_EQ(r.exit_codes, (std::vector<int>{2})) << r.AllLogs();
  EXPECT_THAT(r.logs[0], HasSubstr("--coordinator must be embedded, none or HOST:PORT"));
}

TEST(DynmoTrainAgentTest, UnreachableCoordinatorIsAClearErrorAtStartUp) {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());  // nobody listens
  // A process that waited forever would be SIGKILLed by the harness (exit
  // 137): exit 1 with the message is the proof, not a clock.
  JobResult r = RunJob(0, SkewedJob({"--pp=1", "--initial_boundaries=", "--steps=2",
                                     "--coordinator=" + address,
                                     "--coordinator_connect_timeout_s=2"}),
                       std::chrono::seconds(240));
  ASSERT_EQ(r.exit_codes, (std::vector<int>{1})) << r.AllLogs();
  EXPECT_THAT(r.logs[0], HasSubstr("cannot reach the DynMo coordinator at " + address +
                                   " within 2 s"));
  EXPECT_TRUE(r.records.empty()) << "no iteration ran";
}

TEST(DynmoTrainAgentTest, RejectedPolicyIsAnError) {
  JobResult r = RunJob(0, SkewedJob({"--pp=1", "--initial_boundaries=", "--steps=2",
                                     "--coordinator=embedded", "--trigger=sometimes"}),
                       std::chrono::seconds(30));
  ASSERT_EQ(r.exit_codes, (std::vector<int>{1})) << r.AllLogs();
  EXPECT_THAT(r.logs[0], HasSubstr("--balancer/--trigger"));
}

}  // namespace
}  // namespace dynmo::trainer
