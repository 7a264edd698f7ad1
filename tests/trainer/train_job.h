// Runs dynmo-train jobs for the end-to-end trainer tests: every rank is a
// real process of the built binary (found through DYNMO_BIN_DIR), configured
// with torchrun's variables on loopback, its output captured per rank. Shared
// by the suites that need whole jobs; each test binary includes it once.
#ifndef DYNMO_TESTS_TRAINER_TRAIN_JOB_H_
#define DYNMO_TESTS_TRAINER_TRAIN_JOB_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dynmo::trainer {
namespace {

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
  // Pinned to the CPU unless the test names a device: the suites compare
  // losses bit for bit, which only the deterministic CPU kernels promise,
  // and on the GPU machine --device=auto would pick CUDA.
  if (std::none_of(flags.begin(), flags.end(), [](const std::string& f) {
        return f.rfind("--device=", 0) == 0;
      })) {
    args.push_back("--device=cpu");
  }
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

// The tiny model the elastic suites (re-packing, re-shaping) train: 7
// iterations of a 4-block GPT, one intra-op thread, CPU layer clocks.
[[maybe_unused]] std::vector<std::string> ElasticTinyModel(
    std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--layers=4", "--hidden=32", "--heads=4",
                                    "--seq_len=16", "--micro_batch=2",
                                    "--microbatches=4", "--steps=7", "--lr=0.01",
                                    "--seed=7", "--intra_op_threads=1", "--layer_clock=cpu",
                                    "--timeout_s=60"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

// RunJobOnce, retried when the rendezvous port was taken between FreePort
// and the store binding it (parallel ctest runs).
[[maybe_unused]] JobResult RunJob(int world, const std::vector<std::string>& flags,
                 std::chrono::seconds timeout = std::chrono::seconds(180),
                 int kill_rank = -1, int kill_after_iters = 0) {
  JobResult r;
  for (int attempt = 0; attempt < 3; ++attempt) {
    r = RunJobOnce(world, flags, timeout, kill_rank, kill_after_iters);
    if (r.AllLogs().find("Address already in use") == std::string::npos) break;
  }
  return r;
}

}  // namespace
}  // namespace dynmo::trainer

#endif  // DYNMO_TESTS_TRAINER_TRAIN_JOB_H_
