// Kills at every step of the plan protocol, under real training (issue 25
// item 7); the plain repeated kills are coordinator_kill9_test.cc. Its own
// binary so that ctest runs it alone with a longer limit
// (tests/trainer/CMakeLists.txt): it trains twice 2,000 iterations.
#include <signal.h>

#include <atomic>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/coordinator_daemon.h"
#include "tests/trainer/train_job.h"

namespace dynmo::trainer {
namespace {

// A 64-bit field of a summary: protobuf's JSON prints them as strings and
// leaves out zeros.
int64_t Int(const nlohmann::json& summary, const char* key) {
  if (!summary.contains(key)) return 0;
  const nlohmann::json& v = summary[key];
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
}

// The job's summary as the daemon has it, or null while it is down or the
// job is not registered yet.
nlohmann::json Summary(const CoordinatorDaemon& daemon) {
  const nlohmann::json j =
      nlohmann::json::parse(Capture(daemon.Ctl("--json job kill9 2>/dev/null")), nullptr, false);
  return j.is_discarded() || !j.contains("summary") ? nlohmann::json() : j["summary"];
}

// An operator asks for a plan (the policy's balancer alternating between
// `uniform` and `parameters`, which split this model differently: its first
// block is a mixture of experts, three blocks' worth of parameters), and
// the daemon is SIGKILLed and restarted over its state dir right after the
// PREPARE went out, after every rank PREPARED (the COMMIT logged), when
// the ranks reached the apply iteration (their APPLIED acks in flight), or
// after the plan was APPLIED, in turn, kPlanKills times. Then it is
// SIGSTOPped for longer than the agents' RPC deadline (5 s) and continued.
// The job finishes with losses bit-identical to a run without a
// coordinator, no rank hangs, and no epoch goes back, on either side.
constexpr int kPlanKills = 20;

std::vector<std::string> PlanJob(const std::string& coordinator, int steps) {
  return {"--layers=8", "--hidden=32", "--heads=4", "--seq_len=16", "--micro_batch=2",
          "--microbatches=4", "--steps=" + std::to_string(steps), "--lr=0.01", "--seed=7",
          "--intra_op_threads=1", "--layer_clock=cpu", "--pp=2", "--dynamism=moe",
          "--moe_first=1", "--moe_every=8", "--initial_boundaries=0,5,10", "--timeout_s=300",
          "--coordinator=" + coordinator, "--job=kill9"};
}

nlohmann::json Json(const std::string& text) {
  return nlohmann::json::parse(text, nullptr, false);
}

TEST(CoordinatorKill9Test, KillsAtEveryStepOfThePlanProtocolAndAStopLoseNothing) {
  constexpr int kPlanSteps = 2000;
  const JobResult reference = RunJob(2, PlanJob("none", kPlanSteps), std::chrono::seconds(420));
  ASSERT_TRUE(reference.ok()) << reference.AllLogs();

  const std::string dir = TempPath("kill9_plans");
  ASSERT_EQ(Capture("mkdir -p " + dir + " && echo ok"), "ok\n");
  const std::string log = dir + "/coordinator.log";
  CoordinatorDaemon daemon(FreePort(),
                           {"--state_dir=" + dir + "/state", "--trigger=manual",
                            "--plan_lead_iterations=20"},
                           "", log);
  ASSERT_TRUE(daemon.WaitReady()) << ReadFile(log);

  std::atomic<bool> done{false};
  int kills = 0;
  int at_step[4] = {0, 0, 0, 0};
  bool stopped = false;
  std::vector<std::string> problems;
  auto logged = [&](const std::string& event, uint64_t epoch) {
    return ReadFile(log).find("event=" + event + " job=kill9 epoch=" + std::to_string(epoch)) !=
           std::string::npos;
  };
  // Until `pred` holds or training ended (false then).
  auto wait_for = [&](const std::function<bool()>& pred) {
    while (!done) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  std::thread killer([&] {
    uint64_t epoch = 0;
    int64_t heard = -1;
    for (int round = 0; kills < kPlanKills && !done; ++round) {
      // The (restarted) daemon hears the ranks again and has their profile.
      if (!wait_for([&] {
            const nlohmann::json s = Summary(daemon);
            return !s.is_null() && Int(s, "last_iteration") > heard + 3;
          })) {
        break;
      }
      const char* balancer = round % 2 == 0 ? "parameters" : "uniform";
      Capture(daemon.Ctl(std::string("policy kill9 --balancer=") + balancer +
                         " --trigger=manual >/dev/null 2>&1"));
      const nlohmann::json r = Json(Capture(daemon.Ctl("--json rebalance kill9 2>/dev/null")));
      if (r.is_discarded() || !r.value("issued", false)) {
        heard = Int(Summary(daemon), "last_iteration");
        continue;  // no complete profile yet, or nothing to change
      }
      epoch = static_cast<uint64_t>(Int(r["plan"], "epoch"));
      const int64_t apply = Int(r["plan"], "apply_iteration");
      const int step = kills % 4;
      bool reached = true;
      if (step == 1) reached = wait_for([&] { return logged("plan_committed", epoch); });
      if (step == 2) {
        reached = wait_for([&] { return Int(Summary(daemon), "last_iteration") >= apply; });
      }
      if (step == 3) reached = wait_for([&] { return logged("plan_applied", epoch); });
      if (!reached) break;
      daemon.Stop(SIGKILL);
      ++kills;
      ++at_step[step];
      daemon.Start();
      if (!daemon.WaitReady()) {
        problems.push_back("restart " + std::to_string(kills) + " did not come up");
        break;
      }
      const nlohmann::json s = Summary(daemon);
      if (s.is_null()) {
        problems.push_back("restart " + std::to_string(kills) + " lost the job");
      } else if (static_cast<uint64_t>(Int(s, "epoch")) < epoch) {
        problems.push_back("restart " + std::to_string(kills) + " went back from epoch " +
                           std::to_string(epoch));
      }
      heard = s.is_null() ? heard : Int(s, "last_iteration");
    }
    // A stop longer than the agents' deadlines, then the ranks are heard
    // again by the same process.
    if (!done) {
      const pid_t pid = daemon.pid();
      kill(pid, SIGSTOP);
      std::this_thread::sleep_for(std::chrono::seconds(8));
      kill(pid, SIGCONT);
      stopped = true;
      const int64_t before = Int(Summary(daemon), "last_iteration");
      if (!wait_for([&] { return Int(Summary(daemon), "last_iteration") > before + 5; })) {
        problems.push_back("the ranks were not heard again after SIGCONT");
      }
      std::cout << "kill9 plans: the kills and the stop were over at iteration " << before
                << std::endl;
    }
  });
  const JobResult r = RunJob(2, PlanJob(daemon.address(), kPlanSteps), std::chrono::seconds(420));
  done = true;
  killer.join();

  ASSERT_TRUE(r.ok()) << r.AllLogs();
  EXPECT_TRUE(problems.empty()) << problems.front() << "\n" << ReadFile(log);
  EXPECT_EQ(kills, kPlanKills) << "training ended before every kill";
  EXPECT_TRUE(stopped) << "training ended before the SIGSTOP";
  ASSERT_EQ(r.losses.size(), static_cast<size_t>(kPlanSteps));
  EXPECT_EQ(r.losses, reference.losses) << "a kill changed the training";
  int64_t last_epoch = 0;
  for (const nlohmann::json& rec : r.records) {
    EXPECT_GE(rec["epoch"].get<int64_t>(), last_epoch) << "a rank's epoch went back";
    last_epoch = rec["epoch"].get<int64_t>();
  }
  // The figures docs/operations.md quotes.
  std::cout << "kill9 plans: " << kills << " kills (after PREPARE " << at_step[0]
            << ", after COMMIT " << at_step[1] << ", at the apply iteration " << at_step[2]
            << ", after APPLIED " << at_step[3] << "), a " << 8 << " s SIGSTOP, "
            << r.losses.size() << " iterations with losses equal to the run without a "
            << "coordinator, ranks ended under epoch " << last_epoch << std::endl;
}

}  // namespace
}  // namespace dynmo::trainer
