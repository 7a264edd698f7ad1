// OrphanGuard: a tiny watchdog process that SIGKILLs the ranks' process
// groups if the launcher dies without disarming it, kill -9 included, which
// no handler in the launcher could catch. PR_SET_PDEATHSIG already takes
// each rank down with the launcher; the guard is what also takes down the
// ranks' own children (a shell's `sleep`, a data-loader worker), which the
// death signal does not reach. Each rank registers its own process group
// between fork and exec (RegisterSelf) and the launcher disarms the guard once it has reaped every rank
// and killed what was left of their groups.
//
// Start() forks, so call it before any thread starts. The guard sits in its
// own process group (a terminal Ctrl-C does not reach it) and holds nothing
// but the pipe it reads; it notices the launcher's death as end-of-file on
// that pipe. Not thread-safe.
#ifndef DYNMO_LAUNCHER_ORPHAN_GUARD_H_
#define DYNMO_LAUNCHER_ORPHAN_GUARD_H_

#include <sys/types.h>

#include <memory>

#include "absl/status/statusor.h"

namespace dynmo::launcher {

class OrphanGuard {
 public:
  // Returns a running guard with nothing to guard yet.
  static absl::StatusOr<std::unique_ptr<OrphanGuard>> Start();
  // Disarms the guard if still armed.
  ~OrphanGuard();

  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  // Tells the guard the launcher has cleaned up after itself; the guard
  // exits killing nothing and is reaped. Idempotent.
  void Disarm();

  // The pipe a forked child registers its own process group on, with
  // RegisterSelf, before it execs: then the group is guarded before the
  // program can start a child of its own, whenever the launcher dies.
  // Close-on-exec; -1 once disarmed.
  int registration_fd() const { return fd_; }

  // In a forked child, before exec (async-signal-safe): adds the child's
  // own process group (its pid) to those to kill should the launcher die.
  static void RegisterSelf(int registration_fd);

  pid_t pid() const { return pid_; }

 private:
  OrphanGuard(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  pid_t pid_;
  int fd_;  // write end of the pipe the guard reads; -1 once disarmed
};

}  // namespace dynmo::launcher

#endif  // DYNMO_LAUNCHER_ORPHAN_GUARD_H_
