#include "launcher/orphan_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dynmo::launcher {
namespace {

// The pipe carries int32 process-group ids; this one means "disarm". Writes
// of 4 bytes to a pipe are atomic, so reads never see half a value.
constexpr int32_t kDisarm = 0;
constexpr int kMaxGroups = 4096;

[[noreturn]] void RunGuard(int fd) {
  setpgid(0, 0);
  const int devnull = open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    dup2(devnull, STDIN_FILENO);
    dup2(devnull, STDOUT_FILENO);
    dup2(devnull, STDERR_FILENO);
  }
  // Hold no terminal, socket or pipe end of the launcher's but our own.
  if (fd != 3) {
    dup2(fd, 3);
    fd = 3;
  }
  close_range(4, ~0U, 0);
  pid_t groups[kMaxGroups];
  int count = 0;
  for (;;) {
    int32_t value;
    const ssize_t n = read(fd, &value, sizeof(value));
    if (n < 0 && errno == EINTR) continue;
    if (n == static_cast<ssize_t>(sizeof(value))) {
      if (value == kDisarm) _exit(0);
      if (count < kMaxGroups) groups[count++] = value;
      continue;
    }
    break;  // end of file: the launcher died without disarming us
  }
  for (int i = 0; i < count; ++i) kill(-groups[i], SIGKILL);
  _exit(0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<OrphanGuard>> OrphanGuard::Start() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", strerror(e)));
  }
  if (pid == 0) {
    close(fds[1]);
    RunGuard(fds[0]);
  }
  close(fds[0]);
  return std::unique_ptr<OrphanGuard>(new OrphanGuard(pid, fds[1]));
}

OrphanGuard::~OrphanGuard() { Disarm(); }

void OrphanGuard::RegisterSelf(int registration_fd) {
  const int32_t value = getpid();
  while (write(registration_fd, &value, sizeof(value)) < 0 && errno == EINTR) {
  }
}

void OrphanGuard::Disarm() {
  if (fd_ < 0) return;
  const int32_t value = kDisarm;
  while (write(fd_, &value, sizeof(value)) < 0 && errno == EINTR) {
  }
  close(fd_);
  fd_ = -1;
  int status;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace dynmo::launcher
