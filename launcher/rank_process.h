// SpawnRank: forks and execs one rank of a job, wired the way the
// supervisor needs it: stdout and stderr on pipes the launcher reads, stdin
// on /dev/null (a rank outside the foreground group must never read the
// terminal), its own process group (so the launcher can signal the rank and
// all its children at once, and a terminal Ctrl-C reaches only the launcher,
// which forwards it), and PR_SET_PDEATHSIG=SIGKILL (if the launcher's main
// thread dies, even by kill -9, the rank dies too). Call from the thread
// that lives as long as the launcher: the death signal follows the forking
// thread, not the process. Safe to call with other threads running: the
// child does only async-signal-safe work before exec.
#ifndef DYNMO_LAUNCHER_RANK_PROCESS_H_
#define DYNMO_LAUNCHER_RANK_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dynmo::launcher {

struct RankProcess {
  int rank = 0;
  pid_t pid = -1;  // also the id of its process group
  int stdout_fd = -1;  // read ends; the caller owns and closes them
  int stderr_fd = -1;
};

// Returns the started rank running argv[0] (searched in PATH) with the
// environment `env` ("KEY=VALUE" entries). Returns an error, having reaped
// the child, when the program cannot be executed. With `guard_fd` >= 0 (an
// OrphanGuard's registration_fd()), the child writes its process group id
// there before it execs, so no kill of the launcher can fall between the
// rank starting a child and its group being guarded.
absl::StatusOr<RankProcess> SpawnRank(int rank,
                                      const std::vector<std::string>& argv,
                                      const std::vector<std::string>& env,
                                      int guard_fd = -1);

// Returns how a process ended, from a waitpid status: "exited with status
// 3", "killed by signal 9 (SIGKILL)".
std::string DescribeWaitStatus(int wait_status);

// Returns "SIGINT" for SIGINT, "signal 64" for a signal without a name.
std::string SignalName(int signo);

}  // namespace dynmo::launcher

#endif  // DYNMO_LAUNCHER_RANK_PROCESS_H_
