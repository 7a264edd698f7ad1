#include "trainer/run/local_coordinator.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dynmo::trainer {
namespace {

// dynmo-coordinator beside this executable, else the name for PATH lookup.
std::string CoordinatorBinary() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, static_cast<size_t>(n));
    dir = dir.substr(0, dir.find_last_of('/'));
    const std::string beside = dir + "/dynmo-coordinator";
    if (access(beside.c_str(), X_OK) == 0) return beside;
  }
  return "dynmo-coordinator";
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalCoordinator>> LocalCoordinator::Start(
    const std::vector<std::string>& flags) {
  const std::string binary = CoordinatorBinary();
  const char* tmp = std::getenv("TMPDIR");
  const std::string port_file = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                                             "/dynmo-coordinator-", getpid(), ".port");
  std::remove(port_file.c_str());
  std::vector<std::string> args = {binary, "--listen=127.0.0.1:0",
                                   "--port_file=" + port_file};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("cannot fork the local coordinator");
  if (pid == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) _exit(1);
    // Not the rank's sockets (its process group's peers must see them close
    // when the rank dies) nor any other descriptor beyond stdio.
    if (close_range(3, ~0U, 0) != 0) {
      for (int fd = 3; fd < 4096; ++fd) close(fd);
    }
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "dynmo-train: cannot run %s\n", argv[0]);
    _exit(127);
  }
  std::unique_ptr<LocalCoordinator> started(new LocalCoordinator(pid, 0, port_file));
  for (int poll = 0; poll < 400; ++poll) {  // 20 s
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      started->pid_ = -1;
      return absl::UnavailableError(absl::StrCat(
          binary, " exited before listening (status ", status,
          "); is dynmo-coordinator built beside dynmo-train or on PATH?"));
    }
    std::ifstream in(port_file);
    std::string line;
    int port = 0;
    if (in && std::getline(in, line) && absl::SimpleAtoi(line, &port) && port > 0) {
      started->port_ = port;
      return started;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(binary, " did not report its port within 20 s"));
}

LocalCoordinator::~LocalCoordinator() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  std::remove(port_file_.c_str());
}

}  // namespace dynmo::trainer
