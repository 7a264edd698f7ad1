// End-to-end tests of dynmo-launch (from DYNMO_BIN_DIR) with small shell
// programs as ranks: the environment each rank sees, the rank prefix on
// every line, stopping the job when a rank fails or the launcher is
// signalled or killed with -9 (no rank or rank's child survives), the
// embedded coordinator, and usage errors.
//
// The test process makes itself a child subreaper, so the ranks orphaned by
// a kill -9 of the launcher become its children and it can reap them: kill
// -0 succeeds on an unreaped zombie, and PID 1 in a container may never
// reap.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// The lines of `text` that a rank wrote (the launcher's own start with
// "dynmo-launch:").
std::vector<std::string> RankLines(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& l : Lines(text)) {
    if (!absl::StartsWith(l, "dynmo-launch:")) out.push_back(l);
  }
  return out;
}

bool Gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

// Reaps zombies reparented to us (we are a subreaper).
void ReapOrphans() {
  int status;
  while (waitpid(-1, &status, WNOHANG) > 0) {
  }
}

struct Finished {
  bool exited = false;
  int exit_code = -1;
  std::string out, err;
  absl::Duration took;
};

class LaunchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { prctl(PR_SET_CHILD_SUBREAPER, 1); }

  void SetUp() override {
    const char* bin = std::getenv("DYNMO_BIN_DIR");
    if (bin == nullptr) GTEST_SKIP() << "DYNMO_BIN_DIR not set";
    bin_ = bin;
    char tmpl[] = "/tmp/dynmo_launch_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    if (launcher_ > 0) {
      kill(launcher_, SIGKILL);
      waitpid(launcher_, nullptr, 0);
    }
    ReapOrphans();
    if (!dir_.empty() && !HasFailure()) std::filesystem::remove_all(dir_);
  }

  // Starts dynmo-launch with `args`; its stdout and stderr go to files.
  void Start(const std::vector<std::string>& args,
             const std::vector<std::string>& extra_env = {}) {
    std::vector<std::string> argv = {bin_ + "/dynmo-launch"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    const std::string out = dir_ + "/out", err = dir_ + "/err";
    started_ = absl::Now();
    launcher_ = fork();
    if (launcher_ == 0) {
      const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(o, 1);
      dup2(e, 2);
      std::vector<char*> a, v;
      for (auto& s : argv) a.push_back(s.data());
      for (auto& s : env) v.push_back(s.data());
      a.push_back(nullptr);
      v.push_back(nullptr);
      execve(a[0], a.data(), v.data());
      _exit(126);
    }
    ASSERT_GT(launcher_, 0);
  }

  // Waits for the launcher to end (SIGKILLs it after `limit`, a guard
  // against a hang far above any loaded machine's time, not a measurement).
  Finished Wait(absl::Duration limit = absl::Seconds(120)) {
    Finished f;
    int status = 0;
    const absl::Time deadline = absl::Now() + limit;
    while (waitpid(launcher_, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        ADD_FAILURE() << "dynmo-launch still running after " << limit;
        kill(launcher_, SIGKILL);
        waitpid(launcher_, &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    launcher_ = -1;
    f.took = absl::Now() - started_;
    f.exited = WIFEXITED(status);
    f.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    f.out = ReadFile(dir_ + "/out");
    f.err = ReadFile(dir_ + "/err");
    return f;
  }

  Finished Launch(const std::vector<std::string>& args,
                  const std::vector<std::string>& extra_env = {}) {
    Start(args, extra_env);
    return Wait();
  }

  // Waits until each file exists and holds a pid; returns the pids.
  std::vector<pid_t> WaitForPids(const std::vector<std::string>& names) {
    std::vector<pid_t> pids;
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (const std::string& name : names) {
      int pid = 0;
      while (!absl::SimpleAtoi(absl::StripAsciiWhitespace(
                                   ReadFile(dir_ + "/" + name)),
                               &pid) &&
             absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      EXPECT_GT(pid, 0) << "no pid in " << name;
      pids.push_back(pid);
    }
    return pids;
  }

  // True once every pid is gone (reaping what is reparented to us).
  bool AllGoneWithin(const std::vector<pid_t>& pids, absl::Duration limit) {
    const absl::Time deadline = absl::Now() + limit;
    for (;;) {
      ReapOrphans();
      bool all = true;
      for (pid_t p : pids) all = all && Gone(p);
      if (all) return true;
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  // A rank that records its shell's pid and its child's, then waits far
  // longer than any test runs: a launch that returns at all stopped it (no
  // clock decides these tests; ctest's timeout catches a launcher that hangs).
  std::string SleepingRank() const {
    return absl::StrCat("sleep 600 & echo $! > ", dir_, "/child.$RANK; echo $$ > ",
                        dir_, "/pid.$RANK; wait");
  }

  std::string bin_, dir_;
  pid_t launcher_ = -1;
  absl::Time started_;
};

TEST_F(LaunchTest, EveryRankGetsTorchrunEnvironment) {
  const Finished f = Launch(
      {"--nproc", "3", "--coordinator", "none", "--job", "demo", "--", "sh",
       "-c",
       "echo env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR "
       "$MASTER_PORT $DYNMO_JOB ${DYNMO_COORDINATOR-unset}"},
      {"DYNMO_COORDINATOR=10.9.9.9:1", "RANK=99"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const std::vector<std::string> lines = RankLines(f.out);
  ASSERT_EQ(lines.size(), 3u) << f.out;
  std::map<int, std::vector<std::string>> by_rank;
  for (const std::string& l : lines) {
    std::vector<std::string> w = absl::StrSplit(l, ' ');
    ASSERT_EQ(w.size(), 11u) << l;
    int rank;
    ASSERT_TRUE(absl::SimpleAtoi(absl::StripSuffix(w[1], "]"), &rank)) << l;
    by_rank[rank] = w;
  }
  ASSERT_EQ(by_rank.size(), 3u);
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(by_rank[0][8], &port));
  EXPECT_GT(port, 0);
  for (int r = 0; r < 3; ++r) {
    const std::vector<std::string>& w = by_rank[r];
    const std::string R = absl::StrCat(r);
    EXPECT_EQ(w[0], "[rank");
    EXPECT_EQ(w[2], "env");
    EXPECT_EQ(w[3], R);  // RANK, not the inherited 99
    EXPECT_EQ(w[4], R);
    EXPECT_EQ(w[5], "3");
    EXPECT_EQ(w[6], "3");
    EXPECT_EQ(w[7], "127.0.0.1");
    EXPECT_EQ(w[8], absl::StrCat(port)) << "ranks disagree on MASTER_PORT";
    EXPECT_EQ(w[9], "demo");
    EXPECT_EQ(w[10], "unset") << "--coordinator none must drop the inherited one";
  }
}

TEST_F(LaunchTest, PassesMasterPortAndExternalCoordinatorThrough) {
  const Finished f = Launch(
      {"--nproc=2", "--master_port=29555", "--coordinator=10.0.0.1:50051",
       "--relay=false", "--", "sh", "-c",
       "echo $MASTER_PORT $DYNMO_COORDINATOR $DYNMO_JOB"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const std::vector<std::string> lines = RankLines(f.out);
  ASSERT_EQ(lines.size(), 2u) << f.out;
  for (const std::string& l : lines) {
    EXPECT_THAT(l, HasSubstr("] 29555 10.0.0.1:50051 sh")) << l;
  }
}

TEST_F(LaunchTest, PrefixesEveryLineOfStdoutAndStderrWithItsRank) {
  const Finished f =
      Launch({"--nproc", "2", "--coordinator", "none", "--", "sh", "-c",
              "echo out1; echo err1 >&2; printf 'out2\\nlast-unterminated'; "
              "echo err2 >&2"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  for (const auto& [text, expected] :
       {std::pair<std::string, std::vector<std::string>>{
            f.out, {"out1", "out2", "last-unterminated"}},
        {f.err, {"err1", "err2"}}}) {
    std::map<int, std::vector<std::string>> by_rank;
    for (const std::string& l : RankLines(text)) {
      ASSERT_THAT(l, StartsWith("[rank "));
      const size_t close = l.find("] ");
      ASSERT_NE(close, std::string::npos) << l;
      int rank;
      ASSERT_TRUE(absl::SimpleAtoi(l.substr(6, close - 6), &rank)) << l;
      by_rank[rank].push_back(l.substr(close + 2));
    }
    ASSERT_EQ(by_rank.size(), 2u) << text;
    EXPECT_EQ(by_rank[0], expected);
    EXPECT_EQ(by_rank[1], expected);
  }
}

TEST_F(LaunchTest, LongLinesFromConcurrentRanksNeverInterleave) {
  // 4 ranks x 200 lines of 5000 bytes: many times a pipe's atomic write.
  const Finished f = Launch(
      {"--nproc", "4", "--coordinator", "none", "--", "awk",
       "BEGIN { s = sprintf(\"%5000s\", \"\"); gsub(/ /, \"x\", s); "
       "for (i = 0; i < 200; i++) print ENVIRON[\"RANK\"] \":\" i \":\" s }"});
  ASSERT_EQ(f.exit_code, 0) << f.err;
  const std::string xs(5000, 'x');
  std::map<int, int> next;
  const std::vector<std::string> lines = RankLines(f.out);
  ASSERT_EQ(lines.size(), 800u);
  for (const std::string& l : lines) {
    std::vector<std::string> parts = absl::StrSplit(l, ':');
    ASSERT_EQ(parts.size(), 3u) << l.substr(0, 80);
    int rank, i;
    ASSERT_TRUE(absl::SimpleAtoi(parts[0].substr(parts[0].find("] ") + 2), &rank));
    ASSERT_EQ(parts[0], absl::StrCat("[rank ", rank, "] ", rank));
    ASSERT_TRUE(absl::SimpleAtoi(parts[1], &i));
    EXPECT_EQ(i, next[rank]++) << "rank " << rank << " lines out of order";
    ASSERT_EQ(parts[2], xs) << "line " << i << " of rank " << rank;
  }
}

TEST_F(LaunchTest, FailingRankStopsSleepingSiblingsQuicklyAndIsNamed) {
  Start({"--nproc", "3", "--coordinator", "none", "--", "sh", "-c",
         absl::StrCat("if [ $RANK = 1 ]; then while [ ! -s ", dir_,
                      "/pid.2 ]; do sleep 0.01; done; exit 3; fi; ",
                      SleepingRank())});
  const std::vector<pid_t> pids =
      WaitForPids({"pid.0", "child.0", "pid.2", "child.2"});
  const Finished f = Wait();
  EXPECT_EQ(f.exit_code, 1);
  EXPECT_THAT(f.err, HasSubstr("dynmo-launch: rank 1 (pid "));
  EXPECT_THAT(f.err,
              HasSubstr("failed: exited with status 3; stopped the other 2 ranks"));
  EXPECT_TRUE(AllGoneWithin(pids, absl::Seconds(60)))
      << "a rank or its child survived the stop";
}

TEST_F(LaunchTest, RankKilledBySignalIsNamedWithTheSignal) {
  const Finished f = Launch({"--nproc", "2", "--coordinator", "none", "--",
                             "sh", "-c",
                             "if [ $RANK = 0 ]; then kill -KILL $$; fi; sleep 600"});
  EXPECT_EQ(f.exit_code, 1);
  EXPECT_THAT(f.err, HasSubstr("rank 0 (pid "));
  EXPECT_THAT(f.err, HasSubstr("failed: killed by signal 9 (SIGKILL)"));
}

TEST_F(LaunchTest, SigtermToLauncherStopsEveryRankAndExitsNonZero) {
  Start({"--nproc", "2", "--", "sh", "-c", SleepingRank()});
  const std::vector<pid_t> pids =
      WaitForPids({"pid.0", "child.0", "pid.1", "child.1"});
  kill(launcher_, SIGTERM);
  const Finished f = Wait();
  EXPECT_EQ(f.exit_code, 128 + SIGTERM);
  EXPECT_THAT(f.err, HasSubstr("dynmo-launch: received SIGTERM; stopped 2 ranks"));
  EXPECT_TRUE(AllGoneWithin(pids, absl::Seconds(60)));
}

TEST_F(LaunchTest, KillNineOfLauncherLeavesNoRankOrRankChildAlive) {
  Start({"--nproc", "2", "--", "sh", "-c", SleepingRank()});
  const std::vector<pid_t> pids =
      WaitForPids({"pid.0", "child.0", "pid.1", "child.1"});
  for (pid_t p : pids) ASSERT_FALSE(Gone(p));
  kill(launcher_, SIGKILL);
  waitpid(launcher_, nullptr, 0);
  launcher_ = -1;
  EXPECT_TRUE(AllGoneWithin(pids, absl::Seconds(60)))
      << "orphans survived kill -9 of the launcher";
}

TEST_F(LaunchTest, RanksReachTheEmbeddedCoordinatorThroughTheNodeRelay) {
  const Finished f = Launch({"--nproc", "2", "--", "sh", "-c",
                             "echo at $DYNMO_COORDINATOR; exec \"$0\" "
                             "--coordinator \"$DYNMO_COORDINATOR\" jobs",
                             bin_ + "/dynmo-ctl"});
  ASSERT_EQ(f.exit_code, 0) << f.out << f.err;
  EXPECT_THAT(f.err, HasSubstr("(embedded), ranks through the node relay at unix:"));
  std::string socket;
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(f.out, HasSubstr(absl::StrCat("[rank ", r, "] at unix:/")));
    EXPECT_THAT(f.out, HasSubstr(absl::StrCat("[rank ", r, "] JOB ")))
        << "dynmo-ctl jobs did not answer through the relay";
  }
  const size_t at = f.out.find("] at unix:");
  ASSERT_NE(at, std::string::npos);
  socket = f.out.substr(at + 10, f.out.find('\n', at) - at - 10);
  EXPECT_NE(access(socket.c_str(), F_OK), 0)
      << "the relay's socket " << socket << " outlived the launch";
}

TEST_F(LaunchTest, AnUnreadableRelayTokenFileFailsTheLaunchInOneLine) {
  const Finished f = Launch({"--nproc=1", "--coordinator=127.0.0.1:1",
                             "--coordinator_token_file=/no/such/token", "--", "true"});
  EXPECT_EQ(f.exit_code, 1);
  EXPECT_THAT(f.err, HasSubstr("dynmo-launch: cannot start the node relay: "));
  EXPECT_THAT(f.err, HasSubstr("/no/such/token"));
  EXPECT_EQ(f.out, "");
}

TEST_F(LaunchTest, WithoutTheRelayRanksDialTheEmbeddedCoordinator) {
  const Finished f = Launch({"--nproc", "2", "--relay=false", "--", "sh", "-c",
                             "echo at $DYNMO_COORDINATOR; exec \"$0\" "
                             "--coordinator \"$DYNMO_COORDINATOR\" jobs",
                             bin_ + "/dynmo-ctl"});
  ASSERT_EQ(f.exit_code, 0) << f.out << f.err;
  EXPECT_THAT(f.err, Not(HasSubstr("relay")));
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(f.out, HasSubstr(absl::StrCat("[rank ", r, "] at 127.0.0.1:")));
    EXPECT_THAT(f.out, HasSubstr(absl::StrCat("[rank ", r, "] JOB ")));
  }
}

TEST_F(LaunchTest, UnexecutableProgramExits127NamingIt) {
  const Finished f =
      Launch({"--nproc", "2", "--coordinator", "none", "--", "/no/such/prog"});
  EXPECT_EQ(f.exit_code, 127);
  EXPECT_THAT(f.err, HasSubstr("rank 0 could not start: cannot execute "
                               "'/no/such/prog': No such file or directory"));
}

TEST_F(LaunchTest, BadFlagsExitTwoWithOneClearLine) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nproc=0", "--", "true"}, "--nproc is required"},
      {{"--", "true"}, "--nproc is required"},
      {{"--nproc=abc", "--", "true"}, "invalid value 'abc' for --nproc"},
      {{"--nproc", "2", "--bogus=1", "--", "true"}, "unknown flag '--bogus'"},
      {{"--nproc", "2", "--bogus", "--", "true"}, "unknown flag '--bogus'"},
      {{"--nproc", "2"}, "missing program"},
      {{"--nproc", "2", "--"}, "missing program"},
      {{"--nproc", "2", "true"}, "unexpected argument 'true'"},
      {{"--nproc"}, "flag --nproc needs a value"},
      {{"--nproc=1", "--coordinator=embeded", "--", "true"},
       "--coordinator must be embedded, none or HOST:PORT"},
      {{"--nproc=1", "--master_port=70000", "--", "true"},
       "--master_port must be 0 to 65535"},
      {{"--nproc=1", "--relay=maybe", "--", "true"}, "invalid value 'maybe' for --relay"},
      {{"--nproc=1", "--coordinator_tls_cert=c.pem", "--", "true"},
       "--coordinator_tls_cert and --coordinator_tls_key go together"},
      {{"--nproc=1", "--relay=false", "--coordinator_token_file=t", "--", "true"},
       "are the relay's: they need --relay"},

  };
  for (const auto& [args, why] : cases) {
    const Finished f = Launch(args);
    const std::string cmd = absl::StrJoin(args, " ");
    EXPECT_EQ(f.exit_code, 2) << cmd;
    EXPECT_EQ(Lines(f.err).size(), 1u) << cmd << "\n" << f.err;
    EXPECT_THAT(f.err, StartsWith("dynmo-launch: ")) << cmd;
    EXPECT_THAT(f.err, HasSubstr(why)) << cmd;
    EXPECT_EQ(f.out, "") << cmd;
  }
}

TEST_F(LaunchTest, HelpListsTheFlagsAndExitsZero) {
  const Finished f = Launch({"--help"});
  EXPECT_EQ(f.exit_code, 0);
  EXPECT_THAT(f.out, HasSubstr("usage: dynmo-launch --nproc N"));
  EXPECT_THAT(f.out, HasSubstr("--stop_grace_s"));
}

}  // namespace
