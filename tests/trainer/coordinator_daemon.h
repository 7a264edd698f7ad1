// A dynmo-coordinator daemon (from DYNMO_BIN_DIR) for the trainer tests
// that run dynmo-train ranks against a real coordinator: started with the
// given flags on a loopback port, reachable with dynmo-ctl (the same
// credentials the ranks use), and killable with SIGKILL and restartable
// over the same flags and state dir. Not thread-safe: one thread drives it.
#ifndef DYNMO_TESTS_TRAINER_COORDINATOR_DAEMON_H_
#define DYNMO_TESTS_TRAINER_COORDINATOR_DAEMON_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {
namespace {

std::string BinDir() {
  const char* dir = std::getenv("DYNMO_BIN_DIR");
  return dir ? dir : ".";
}

// Runs `command` and returns its standard output.
std::string Capture(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// The files of a secured coordinator, written by MakeSecuredFiles into
// one directory: a throwaway CA with server and client certificates
// (tests/make-test-certs.sh), and a principals file naming the trainers
// (token train_token, roles agent and operator: rank 0 sets the job's
// policy) and an operator (token ops_token).
struct SecuredFiles {
  std::string dir;
  std::string Path(const std::string& name) const { return dir + "/" + name; }
  // The daemon's flags: principals and mutual TLS.
  std::vector<std::string> DaemonFlags() const {
    return {"--principals_file=" + Path("principals"), "--tls_cert=" + Path("server.pem"),
            "--tls_key=" + Path("server.key"), "--tls_client_ca=" + Path("ca.pem")};
  }
  // A client's TLS flags (every client's, cli/coordinator_flags.h).
  std::vector<std::string> TlsFlags() const {
    return {"--coordinator_tls_ca=" + Path("ca.pem"),
            "--coordinator_tls_cert=" + Path("client.pem"),
            "--coordinator_tls_key=" + Path("client.key"),
            "--coordinator_tls_server_name=localhost"};
  }
  // dynmo-ctl's flags, as the operator.
  std::string CtlFlags() const {
    std::string out = "--coordinator_token_file=" + Path("ops_token");
    for (const std::string& f : TlsFlags()) out += " " + f;
    return out;
  }
};

// Empty on success, else what failed.
[[maybe_unused]] std::string MakeSecuredFiles(const std::string& dir, SecuredFiles* files) {
  files->dir = dir;
  if (Capture(absl::StrCat("mkdir -p ", dir, " && ", DYNMO_SOURCE_DIR,
                           "/tests/make-test-certs.sh ", dir, " 2>&1 && echo ok")) != "ok\n") {
    return "tests/make-test-certs.sh failed (is openssl installed?)";
  }
  const std::string write = absl::StrCat(
      "cd ", dir, " && printf 'trainer-s3cret-0123456789\\n' > train_token && ",
      "printf 'operator-s3cret-0123456789\\n' > ops_token && ",
      "printf 'trainer-s3cret-0123456789 trainer agent,operator tenant=ml\\noperator-s3cret-0123456789 ops operator tenant=ml\\n' > principals",
      " && echo ok");
  if (Capture(write) != "ok\n") return "cannot write the token and principals files";
  return "";
}

class CoordinatorDaemon {
 public:
  // `flags`: the daemon's, after --listen. `ctl_flags`: what dynmo-ctl
  // needs to be let in (--coordinator_token_file, --coordinator_tls_*). Its stdout and stderr are
  // appended to `log` ("": inherited).
  CoordinatorDaemon(int port, std::vector<std::string> flags, std::string ctl_flags,
                    std::string log = "")
      : address_(absl::StrCat("127.0.0.1:", port)),
        flags_(std::move(flags)),
        ctl_flags_(std::move(ctl_flags)),
        log_(std::move(log)) {
    Start();
  }
  ~CoordinatorDaemon() { Stop(SIGTERM); }

  void Start() {
    pid_ = fork();
    if (pid_ == 0) {
      if (!log_.empty()) {
        if (std::freopen(log_.c_str(), "a", stdout) == nullptr) _exit(126);
        dup2(fileno(stdout), fileno(stderr));
      }
      std::vector<std::string> args = {BinDir() + "/dynmo-coordinator",
                                       "--listen=" + address_};
      args.insert(args.end(), flags_.begin(), flags_.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  // Sends `sig` and reaps the daemon.
  void Stop(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // The daemon answers `dynmo-ctl jobs` (waits up to 20 s; false at once
  // when it exited).
  bool WaitReady() {
    for (int i = 0; i < 200; ++i) {
      if (pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      if (Capture(Ctl("jobs") + " >/dev/null 2>&1 && echo up") == "up\n") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  std::string Ctl(const std::string& args) const {
    return absl::StrCat(BinDir(), "/dynmo-ctl --coordinator=", address_, " ", ctl_flags_,
                        " ", args);
  }
  const std::string& address() const { return address_; }
  // The running daemon's process id (-1 when stopped).
  pid_t pid() const { return pid_; }

 private:
  std::string address_;
  std::vector<std::string> flags_;
  std::string ctl_flags_;
  std::string log_;
  pid_t pid_ = -1;
};

}  // namespace
}  // namespace dynmo::trainer

#endif  // DYNMO_TESTS_TRAINER_COORDINATOR_DAEMON_H_
