#include "launcher/rank_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "launcher/orphan_guard.h"

namespace dynmo::launcher {
namespace {

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

void CloseBoth(int fds[2]) {
  if (fds[0] >= 0) close(fds[0]);
  if (fds[1] >= 0) close(fds[1]);
}

// In the forked child: only async-signal-safe calls from here to exec.
[[noreturn]] void ExecRank(pid_t launcher, int devnull, int out, int err,
                           int exec_error, int guard_fd, char** argv,
                           char** envp) {
  setpgid(0, 0);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) {
    _exit(127);  // the launcher is already gone: do not run unsupervised
  }
  // From here a kill of the launcher takes down the whole group: the guard
  // has it before the program runs.
  if (guard_fd >= 0) OrphanGuard::RegisterSelf(guard_fd);
  if (dup2(devnull, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 ||
      dup2(err, STDERR_FILENO) < 0) {
    const int e = errno;
    (void)!write(exec_error, &e, sizeof(e));
    _exit(127);
  }
  // The launcher blocks the signals it reads through a signalfd and ignores
  // SIGPIPE; both would otherwise be inherited through exec.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);
  execvpe(argv[0], argv, envp);
  const int e = errno;
  (void)!write(exec_error, &e, sizeof(e));
  _exit(127);
}

}  // namespace

absl::StatusOr<RankProcess> SpawnRank(int rank,
                                      const std::vector<std::string>& argv,
                                      const std::vector<std::string>& env,
                                      int guard_fd) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  // Everything the child touches is built before fork.
  std::vector<char*> args = CStrings(argv);
  std::vector<char*> envp = CStrings(env);
  int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_error[2] = {-1, -1};
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 ||
      pipe2(exec_error, O_CLOEXEC) != 0) {
    const int e = errno;
    CloseBoth(out);
    CloseBoth(err);
    CloseBoth(exec_error);
    if (devnull >= 0) close(devnull);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(e)));
  }
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    ExecRank(launcher, devnull, out[1], err[1], exec_error[1], guard_fd,
             args.data(), envp.data());
  }
  const int fork_errno = errno;
  close(devnull);
  close(out[1]);
  close(err[1]);
  close(exec_error[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    close(exec_error[0]);
    return absl::InternalError(absl::StrCat("fork: ", strerror(fork_errno)));
  }
  // Also from this side, so the group exists before anyone signals it,
  // whichever process runs first. EACCES once the child has exec'd is fine.
  setpgid(pid, pid);

  // The close-on-exec pipe stays silent when exec succeeds.
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(exec_error[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(exec_error[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    close(out[0]);
    close(err[0]);
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot execute '", argv[0], "': ", strerror(child_errno)));
  }
  return RankProcess{rank, pid, out[0], err[0]};
}

std::string SignalName(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  if (abbrev == nullptr) return absl::StrCat("signal ", signo);
  return absl::StrCat("SIG", abbrev);
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    const int signo = WTERMSIG(wait_status);
    return absl::StrCat("killed by signal ", signo, " (", SignalName(signo),
                        ")", WCOREDUMP(wait_status) ? ", core dumped" : "");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

}  // namespace dynmo::launcher
