// dynmo-train ranks under dynmo-launch, through the node relay (the
// launcher's default): the ranks' sessions reach the embedded coordinator
// on one stream and plans still apply; a rank that stops making progress is
// named by the launcher, which stops the job.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/trainer/coordinator_daemon.h"
#include "tests/trainer/train_job.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

std::string Bin(const std::string& name) {
  const char* dir = std::getenv("DYNMO_BIN_DIR");
  return std::string(dir ? dir : ".") + "/" + name;
}

std::vector<std::string> SmallJob(std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--pp=2", "--layers=4", "--hidden=32", "--heads=4",
                                    "--seq_len=16", "--micro_batch=2", "--microbatches=4",
                                    "--lr=0.01", "--seed=7", "--intra_op_threads=1",
                                    "--log_interval=1", "--device=cpu"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

// dynmo-launch in the background, its output in a file.
struct Launch {
  pid_t pid = -1;
  std::string log;

  Launch(const std::vector<std::string>& launcher_flags,
         const std::vector<std::string>& train_flags) {
    log = TempPath("launch_relay") + ".log";
    std::vector<std::string> argv = {Bin("dynmo-launch")};
    argv.insert(argv.end(), launcher_flags.begin(), launcher_flags.end());
    argv.push_back("--");
    argv.push_back(Bin("dynmo-train"));
    argv.insert(argv.end(), train_flags.begin(), train_flags.end());
    pid = fork();
    if (pid == 0) {
      std::FILE* f = std::freopen(log.c_str(), "w", stdout);
      (void)f;
      dup2(1, 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }

  // Exit status, or -1 after `timeout` (the launcher is then SIGKILLed).
  int Wait(std::chrono::seconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string Output() const { return ReadFile(log); }
};

// The pid of the launcher's child that runs rank `rank` (RANK in its
// environment), or -1.
pid_t RankPid(pid_t launcher, int rank) {
  std::ifstream children(absl::StrCat("/proc/", launcher, "/task/", launcher, "/children"));
  std::string line;
  std::getline(children, line);
  for (absl::string_view p : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    std::ifstream env(absl::StrCat("/proc/", p, "/environ"));
    std::string all((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    for (absl::string_view kv : absl::StrSplit(all, '\0')) {
      if (kv == absl::StrCat("RANK=", rank)) {
        int pid = -1;
        return absl::SimpleAtoi(p, &pid) ? pid : -1;
      }
    }
  }
  return -1;
}

TEST(LaunchRelayTest, RanksUnderTheLauncherShareOneStreamAndApplyPlans) {
  Launch run({"--nproc=2", "--job=relayed"},
             SmallJob({"--steps=40", "--initial_boundaries=0,5,6", "--balancer=time",
                       "--trigger=every:5"}));
  ASSERT_EQ(run.Wait(std::chrono::seconds(240)), 0) << run.Output();
  const std::string out = run.Output();
  EXPECT_THAT(out, HasSubstr("ranks through the node relay at unix:/"));
  EXPECT_THAT(out, HasSubstr("coordinator unix:/")) << "dynmo-train dialled the relay";
  EXPECT_THAT(out, HasSubstr("applied plan epoch 1"));
  EXPECT_THAT(out, HasSubstr("[rank 0] dynmo-train: done, 40 iterations"));
}

TEST(LaunchRelayTest, TheRelayCarriesTokenAndMutualTlsToASecuredCoordinator) {
  SecuredFiles files;
  const std::string problem = MakeSecuredFiles(TempPath("launch_secured"), &files);
  if (!problem.empty()) GTEST_SKIP() << problem;
  std::vector<std::string> flags = files.DaemonFlags();
  for (const char* f : {"--trigger=every:5", "--balancer=time", "--plan_lead_iterations=5"}) {
    flags.push_back(f);
  }
  CoordinatorDaemon daemon(FreePort(), flags, files.CtlFlags(), files.Path("coordinator.log"));
  ASSERT_TRUE(daemon.WaitReady()) << ReadFile(files.Path("coordinator.log"));
  std::vector<std::string> launcher = {"--nproc=2", "--job=relayed-secured",
                                       "--coordinator=" + daemon.address(),
                                       "--coordinator_token_file=" + files.Path("train_token")};
  for (const std::string& f : files.TlsFlags()) launcher.push_back(f);
  Launch run(launcher, SmallJob({"--steps=40", "--initial_boundaries=0,5,6"}));
  ASSERT_EQ(run.Wait(std::chrono::seconds(240)), 0)
      << run.Output() << ReadFile(files.Path("coordinator.log"));
  const std::string out = run.Output();
  EXPECT_THAT(out, HasSubstr("ranks through the node relay at unix:/"));
  EXPECT_THAT(out, HasSubstr("applied plan epoch 1"));
  EXPECT_THAT(out, HasSubstr("[rank 0] dynmo-train: done, 40 iterations"));
  EXPECT_THAT(ReadFile(files.Path("coordinator.log")),
              HasSubstr("event=plan_applied job=relayed-secured epoch=1"));
}

TEST(LaunchRelayTest, AStoppedRankIsNamedAndTheJobStopped) {
  Launch run({"--nproc=2", "--job=stuck", "--stuck_timeout_s=3", "--stop_grace_s=1"},
             SmallJob({"--steps=1000000", "--timeout_s=1000"}));
  // Wait for rank 1 to finish an iteration, then freeze it.
  pid_t rank1 = -1;
  for (int i = 0; i < 2400 && rank1 < 0; ++i) {
    if (absl::StrContains(run.Output(), "[rank 0] iter 2 ")) rank1 = RankPid(run.pid, 1);
    if (rank1 < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(rank1, 0) << run.Output();
  kill(rank1, SIGSTOP);
  // The launcher's watchdog, not the trainer's 1000 s collective timeout
  // nor this harness's guard, ends the job.
  EXPECT_EQ(run.Wait(std::chrono::seconds(200)), 1) << run.Output();
  const std::string out = run.Output();
  EXPECT_THAT(out, HasSubstr("dynmo-launch: rank 1 (pid "));
  EXPECT_THAT(out, HasSubstr("made no progress for"));
  EXPECT_THAT(out, HasSubstr("its process is stopped"));
}

}  // namespace
}  // namespace dynmo::trainer
