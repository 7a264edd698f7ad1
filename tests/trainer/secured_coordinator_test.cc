// dynmo-train ranks against a secured dynmo-coordinator daemon: named
// principals (--principals_file) AND mutual TLS with a throwaway CA. Ranks
// that carry the trainers' token and a client certificate train and apply
// the coordinator's plans; ranks without the token are refused at start-up
// and say so.
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/coordinator_daemon.h"
#include "tests/trainer/train_job.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

class SecuredCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string problem = MakeSecuredFiles(TempPath("secured"), &files_);
    if (!problem.empty()) GTEST_SKIP() << problem;
    std::vector<std::string> flags = files_.DaemonFlags();
    for (const char* f : {"--trigger=every:3", "--balancer=time", "--plan_lead_iterations=5"}) {
      flags.push_back(f);
    }
    daemon_ = std::make_unique<CoordinatorDaemon>(FreePort(), flags, files_.CtlFlags(),
                                                  files_.Path("coordinator.log"));
    ASSERT_TRUE(daemon_->WaitReady()) << ReadFile(files_.Path("coordinator.log"));
  }

  // A 2-stage job skewed 9:1 over TLS, with `extra` flags.
  std::vector<std::string> Job(const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> flags = {
        "--layers=8", "--hidden=32", "--heads=4", "--seq_len=16", "--micro_batch=2",
        "--microbatches=4", "--steps=30", "--lr=0.01", "--seed=7", "--intra_op_threads=1",
        "--layer_clock=cpu", "--pp=2", "--initial_boundaries=0,9,10", "--timeout_s=60",
        "--coordinator=" + daemon_->address(), "--job=" + name,
        "--coordinator_connect_timeout_s=30"};
    for (const std::string& f : files_.TlsFlags()) flags.push_back(f);
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }

  SecuredFiles files_;
  std::unique_ptr<CoordinatorDaemon> daemon_;
};

TEST_F(SecuredCoordinatorTest, RanksWithTheTokenAndACertificateApplyPlans) {
  JobResult r = RunJob(2, Job("secured", {"--coordinator_token_file=" +
                                          files_.Path("train_token")}),
                       std::chrono::seconds(120));
  ASSERT_TRUE(r.ok()) << r.AllLogs() << ReadFile(files_.Path("coordinator.log"));
  ASSERT_EQ(r.records.size(), 30u);
  int64_t last_epoch = 0;
  for (const nlohmann::json& rec : r.records) {
    EXPECT_GE(rec["epoch"].get<int64_t>(), last_epoch) << "epochs never go back";
    last_epoch = rec["epoch"].get<int64_t>();
  }
  EXPECT_GE(last_epoch, 1) << r.AllLogs();
  EXPECT_THAT(r.logs[0], HasSubstr("applied plan epoch"));
  // The operator sees the job, created by the trainers' principal.
  const std::string out = Capture(daemon_->Ctl("--json job secured"));
  const nlohmann::json job = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(job.is_discarded()) << out;
  EXPECT_EQ(job["summary"]["owner"], "trainer") << out;
  EXPECT_GE(std::stoll(job["summary"]["applied_epoch"].get<std::string>()), 1) << out;
  EXPECT_THAT(ReadFile(files_.Path("coordinator.log")), HasSubstr("event=plan_applied job=secured"));
}

TEST_F(SecuredCoordinatorTest, RanksWithoutTheTokenAreRefused) {
  JobResult r = RunJob(2, Job("intruder", {}), std::chrono::seconds(120));
  EXPECT_FALSE(r.ok()) << r.AllLogs();
  EXPECT_TRUE(r.records.empty()) << "no iteration ran";
  EXPECT_THAT(r.logs[0], HasSubstr("refused this rank")) << r.AllLogs();
  EXPECT_NE(Capture(daemon_->Ctl("job intruder") + " 2>&1").find("no job named"),
            std::string::npos)
      << "a refused rank created no job";
  EXPECT_THAT(ReadFile(files_.Path("coordinator.log")),
              HasSubstr("event=auth_refused role=agent"));
}

}  // namespace
}  // namespace dynmo::trainer
