// Repeated kill -9 and restart of the coordinator under real training:
// dynmo-train ranks report to a dynmo-coordinator daemon that is SIGKILLed
// and restarted over the same state dir kKills times while they train. The
// trainer never waits on the coordinator, so the job finishes with losses
// bit-identical to a run without a coordinator; every restart comes up
// from its state file (a corrupt one is refused at start-up), its epochs
// never go back, and the ranks' epochs never go back either.
#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/coordinator_daemon.h"
#include "tests/trainer/train_job.h"

namespace dynmo::trainer {
namespace {

constexpr int kKills = 5;
constexpr int kSteps = 150;

// A 64-bit field of a summary: protobuf's JSON prints them as strings and
// leaves out zeros.
int64_t Int(const nlohmann::json& summary, const char* key) {
  if (!summary.contains(key)) return 0;
  const nlohmann::json& v = summary[key];
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
}

std::vector<std::string> Job(const std::string& coordinator) {
  return {"--layers=8", "--hidden=32", "--heads=4", "--seq_len=16", "--micro_batch=2",
          "--microbatches=4", "--steps=" + std::to_string(kSteps), "--lr=0.01", "--seed=7",
          "--intra_op_threads=1", "--layer_clock=cpu", "--pp=2",
          "--initial_boundaries=0,9,10", "--timeout_s=120", "--coordinator=" + coordinator,
          "--job=kill9"};
}

// The job's summary as the daemon has it, or null while it is down or the
// job is not registered yet.
nlohmann::json Summary(const CoordinatorDaemon& daemon) {
  const nlohmann::json j =
      nlohmann::json::parse(Capture(daemon.Ctl("--json job kill9 2>/dev/null")), nullptr, false);
  return j.is_discarded() || !j.contains("summary") ? nlohmann::json() : j["summary"];
}

TEST(CoordinatorKill9Test, TrainingSurvivesRepeatedKillsWithNothingLost) {
  const JobResult reference = RunJob(2, Job("none"), std::chrono::seconds(240));
  ASSERT_TRUE(reference.ok()) << reference.AllLogs();

  const std::string dir = TempPath("kill9");
  ASSERT_EQ(Capture("mkdir -p " + dir + " && echo ok"), "ok\n");
  const std::string log = dir + "/coordinator.log";
  CoordinatorDaemon daemon(FreePort(),
                           {"--state_dir=" + dir + "/state", "--trigger=every:3",
                            "--balancer=time", "--plan_lead_iterations=5"},
                           "", log);
  ASSERT_TRUE(daemon.WaitReady()) << ReadFile(log);

  // Kill k happens once the coordinator has heard of iteration 10 k, and
  // only after the restarted one heard from the ranks again.
  std::atomic<bool> done{false};
  int kills = 0;
  std::vector<std::string> problems;
  std::thread killer([&] {
    uint64_t epoch = 0;
    int64_t heard = -1;
    for (int k = 1; k <= kKills && !done; ++k) {
      while (!done) {
        const nlohmann::json s = Summary(daemon);
        if (!s.is_null() && Int(s, "last_iteration") >= 10 * k &&
            Int(s, "last_iteration") != heard) {
          epoch = static_cast<uint64_t>(Int(s, "epoch"));
          heard = Int(s, "last_iteration");
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (done) break;
      daemon.Stop(SIGKILL);
      ++kills;
      daemon.Start();
      if (!daemon.WaitReady()) {
        problems.push_back("restart " + std::to_string(k) + " did not come up");
        break;
      }
      const nlohmann::json s = Summary(daemon);
      if (s.is_null()) {
        problems.push_back("restart " + std::to_string(k) + " lost the job");
      } else if (static_cast<uint64_t>(Int(s, "epoch")) < epoch) {
        problems.push_back("restart " + std::to_string(k) + " went back from epoch " +
                           std::to_string(epoch));
      }
    }
  });
  const JobResult r = RunJob(2, Job(daemon.address()), std::chrono::seconds(240));
  done = true;
  killer.join();

  ASSERT_TRUE(r.ok()) << r.AllLogs();
  EXPECT_TRUE(problems.empty()) << problems.front() << "\n" << ReadFile(log);
  EXPECT_EQ(kills, kKills) << "training ended before every kill";
  ASSERT_EQ(r.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(r.losses, reference.losses) << "a kill changed the training";
  int64_t last_epoch = 0;
  for (const nlohmann::json& rec : r.records) {
    EXPECT_GE(rec["epoch"].get<int64_t>(), last_epoch) << "a rank's epoch went back";
    last_epoch = rec["epoch"].get<int64_t>();
  }
  // The coordinator, restarted once more, agrees with the ranks: it is
  // never ahead of the epoch they ended under.
  daemon.Stop(SIGKILL);
  daemon.Start();
  ASSERT_TRUE(daemon.WaitReady()) << ReadFile(log);
  const nlohmann::json s = Summary(daemon);
  ASSERT_FALSE(s.is_null()) << ReadFile(log);
  EXPECT_LE(Int(s, "applied_epoch"), last_epoch) << s.dump();
  EXPECT_NE(s["plan_state"], "preparing") << s.dump();
  // The figures docs/operations.md quotes.
  std::cout << "kill9: " << kills << " kills survived, " << r.losses.size()
            << " iterations with losses equal to the run without a coordinator, ranks ended "
            << "under epoch " << last_epoch << ", the coordinator applied "
            << Int(s, "applied_epoch") << std::endl;
}

}  // namespace
}  // namespace dynmo::trainer
