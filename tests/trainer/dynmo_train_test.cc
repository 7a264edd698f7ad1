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
#include "trainer/indexed_dataset.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

std::string Binary() {
  const char* dir = std::getenv("DYNMO_BIN_DIR");
  return std::string(dir ? dir : ".") + "/dynmo-train";
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/dynmo_train_" + name + "_" + std::to_string(getpid());
}

// A port the kernel just handed out and released; good enough on loopback.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct JobResult {
  std::vector<int> exit_codes;    // per rank; -1 when killed on timeout
  std::vector<std::string> logs;  // stdout + stderr per rank
  std::vector<double> losses;     // from rank 0's --log_json
  std::vector<nlohmann::json> records;
  bool ok() const {
    for (int c : exit_codes) if (c != 0) return false;
    return !exit_codes.empty();
  }
  std::string AllLogs() const {
    std::string out;
    for (size_t r = 0; r < logs.size(); ++r) absl::StrAppend(&out, "[rank ", r, "]\n", logs[r]);
    return out;
  }
};

// Starts `world` ranks of dynmo-train with `flags` (+ --log_json), waits for
// all of them (killing every rank after `timeout`), and collects the result.
// world == 0 runs one process with no torchrun variables at all. When
// `kill_rank` >= 0, that rank is SIGKILLed once rank 0 has logged
// `kill_after_iters` iterations.
JobResult RunJobOnce(int world, const std::vector<std::string>& flags,
                     std::chrono::seconds timeout, int kill_rank,
                     int kill_after_iters) {
  static int job = 0;
  const std::string tag = absl::StrCat(job++);
  const std::string json = TempPath("log_" + tag + ".jsonl");
  std::remove(json.c_str());
  std::vector<std::string> args = {Binary()};
  args.insert(args.end(), flags.begin(), flags.end());
  args.push_back("--log_json=" + json);
  const int port = FreePort();
  const int ranks = world == 0 ? 1 : world;

  std::vector<pid_t> pids;
  std::vector<std::string> outputs;
  for (int r = 0; r < ranks; ++r) {
    outputs.push_back(TempPath(absl::StrCat("out_", tag, "_", r)));
    pid_t pid = fork();
    if (pid == 0) {
      if (world > 0) {
        setenv("RANK", std::to_string(r).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      } else {
        for (const char* v : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
          unsetenv(v);
        }
      }
      FILE* out = std::freopen(outputs.back().c_str(), "w", stdout);
      if (out == nullptr) _exit(126);
      dup2(fileno(stdout), fileno(stderr));
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }

  JobResult result;
  result.exit_codes.assign(ranks, -1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int remaining = ranks;
  while (remaining > 0) {
    for (int r = 0; r < ranks; ++r) {
      if (pids[r] == 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        result.exit_codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pids[r] = 0;
        --remaining;
      }
    }
    if (remaining == 0) break;
    if (kill_rank >= 0 && pids[kill_rank] != 0) {
      std::vector<std::string> lines =
          absl::StrSplit(ReadFile(json), '\n', absl::SkipEmpty());
      if (static_cast<int>(lines.size()) >= kill_after_iters) {
        kill(pids[kill_rank], SIGKILL);
        kill_rank = -1;  // reaped by the loop like any other exit
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < ranks; ++r) {
        if (pids[r] != 0) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          pids[r] = 0;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < ranks; ++r) result.logs.push_back(ReadFile(outputs[r]));
  for (absl::string_view line : absl::StrSplit(ReadFile(json), '\n', absl::SkipEmpty())) {
    nlohmann::json j = nlohmann::json::parse(line);
    result.losses.push_back(j["loss"].get<double>());
    result.records.push_back(j);
  }
  return result;
}

// RunJobOnce, retried when the rendezvous port was taken between FreePort
// and the store binding it (parallel ctest runs).
JobResult RunJob(int world, const std::vector<std::string>& flags,
                 std::chrono::seconds timeout = std::chrono::seconds(180),
                 int kill_rank = -1, int kill_after_iters = 0) {
  JobResult r;
  for (int attempt = 0; attempt < 3; ++attempt) {
    r = RunJobOnce(world, flags, timeout, kill_rank, kill_after_iters);
    if (r.AllLogs().find("Address already in use") == std::string::npos) break;
  }
  return r;
}

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
  const auto start = std::chrono::steady_clock::now();
  JobResult run = RunJob(2, TinyModel({"--pp=2", "--steps=100000", "--timeout_s=60"}),
                         std::chrono::seconds(90), /*kill_rank=*/1,
                         /*kill_after_iters=*/2);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(run.exit_codes[1], 128 + SIGKILL);
  EXPECT_EQ(run.exit_codes[0], 1) << run.AllLogs();
  EXPECT_THAT(run.logs[0], HasSubstr("dynmo-train: error: rank 0"));
  // Detected from the broken connection, well before the 60 s timeout.
  EXPECT_LT(seconds, 45) << run.AllLogs();
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
  };
  const std::vector<Case> cases = {
      {0, {"--no_such_flag=1"}, "Unknown command line flag 'no_such_flag'"},
      {0, {"--pp=two"}, "Illegal value 'two' specified for flag 'pp'"},
      {0, TinyModel({"--pp=2"}), "--pp=2 x --dp=1 = 2 ranks but WORLD_SIZE=1"},
      {1, TinyModel({"--pp=2", "--dp=2"}), "= 4 ranks but WORLD_SIZE=1"},
      {0, TinyModel({"--pp=7"}), "--pp=7 stages but the model has only 6 pipeline layers"},
      {0, TinyModel({"--initial_boundaries=0,6"}), ""},  // valid for pp=1
      {0, TinyModel({"--initial_boundaries=0,3,6"}), "--initial_boundaries=0,3,6"},
      {0, TinyModel({"--initial_boundaries=0,a"}), "comma-separated integers"},
      {0, TinyModel({"--heads=5"}), "--hidden=32 is not divisible by --heads=5"},
      {0, TinyModel({"--vocab=64"}), "but --vocab=64"},
      {0, TinyModel({"--data=/nonexistent/corpus.txt"}), "cannot open --data=/nonexistent/corpus.txt"},
      {0, TinyModel({"--steps=0"}), "--steps must be >= 1"},
      {0, TinyModel({"--test_migrate_every=2"}), "needs --test_migration_boundaries"},
      {2, TinyModel({"--pp=2", "--test_migrate_every=2", "--test_migration_boundaries=0,6"}),
       "--test_migration_boundaries entry 0,6"},
  };
  for (const Case& c : cases) {
    auto [code, output] = RunBad(c.world, c.flags);
    if (c.message.empty()) {
      EXPECT_EQ(code, 0) << output;
      continue;
    }
    EXPECT_NE(code, 0) << c.message;
    EXPECT_THAT(output, HasSubstr(c.message));
    // The error is one line (absl prints its own for flag syntax errors).
    std::vector<std::string> lines = absl::StrSplit(output, '\n', absl::SkipEmpty());
    EXPECT_LE(lines.size(), 2u) << output;
  }
}

}  // namespace
}  // namespace dynmo::trainer
