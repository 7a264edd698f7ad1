// RankSupervisor: runs the ranks of one single-node job to the end. Start()
// launches each rank (rank_process.h); Run() then multiplexes, on the
// launcher's main thread, the ranks' output (each line prefixed "[rank R] ",
// rank stdout to the launcher's stdout, stderr to its stderr), their exits
// and the launcher's own signals, until every rank is gone.
//
// Stopping: the first rank that exits non-zero or by a signal, or a
// SIGINT/SIGTERM/SIGHUP to the launcher, stops all the others: that signal
// (SIGTERM for a failed rank) goes to each running rank's process group,
// SIGKILL follows after the grace period, and a second launcher signal
// sends SIGKILL at once. When the last rank is reaped, whatever is left in
// their process groups is SIGKILLed, on success too: no rank leaves
// orphans behind.
//
// Not thread-safe. The calling thread must have SIGCHLD, SIGINT, SIGTERM
// and SIGHUP blocked (Run() reads them from a signalfd) and should be the
// main thread (see SpawnRank).
#ifndef DYNMO_LAUNCHER_RANK_SUPERVISOR_H_
#define DYNMO_LAUNCHER_RANK_SUPERVISOR_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "launcher/line_prefixer.h"
#include "launcher/orphan_guard.h"
#include "launcher/stuck_rank.h"

namespace dynmo::launcher {

struct SupervisorOptions {
  absl::Duration stop_grace = absl::Seconds(5);  // SIGTERM, then SIGKILL
  int stdout_fd = 1;
  int stderr_fd = 2;
  OrphanGuard* guard = nullptr;  // each rank registers its group if set
  // Asked about every `watch_every` while the job runs, with each running
  // rank and its pid: a verdict (stuck_rank.h) stops the job like a failed
  // rank (exit 1, its line as the summary). Unset: no watching.
  std::function<std::optional<StuckVerdict>(
      absl::Time now, const std::vector<std::pair<int, pid_t>>& running)>
      watchdog;
  absl::Duration watch_every = absl::Seconds(1);
};

// How the job ended: the launcher's exit status and, unless every rank
// exited 0, one line that says why.
struct LaunchOutcome {
  int exit_code = 0;  // 0, 1 (a rank failed), 127 (cannot exec), 128+signal
  std::string summary;
};

class RankSupervisor {
 public:
  explicit RankSupervisor(SupervisorOptions options)
      : options_(std::move(options)) {}
  ~RankSupervisor();

  RankSupervisor(const RankSupervisor&) = delete;
  RankSupervisor& operator=(const RankSupervisor&) = delete;

  // Starts `rank` running argv with environment env. On error (the program
  // cannot be executed) the job is already stopping; call Run() to finish.
  absl::Status Start(int rank, const std::vector<std::string>& argv,
                     const std::vector<std::string>& env);

  // Supervises the started ranks until all are reaped and their output is
  // drained; returns how the job ended.
  LaunchOutcome Run();

 private:
  struct Rank {
    int rank;
    pid_t pid;
    int fds[2];  // stdout, stderr read ends; -1 once at end of file
    LinePrefixer prefixers[2];
    bool running = true;
    int wait_status = 0;
  };

  void BeginStop(int signo);
  void SignalRunning(int signo);
  void ReapExited();
  void ReadOutput(Rank& rank, int stream);
  void CloseOutput(Rank& rank, int stream);
  bool AnyRunning() const;
  bool AnyOutputOpen() const;
  LaunchOutcome Outcome() const;

  const SupervisorOptions options_;
  std::vector<Rank> ranks_;

  bool stopping_ = false;
  bool killed_ = false;         // SIGKILL already sent to running ranks
  absl::Time kill_deadline_;
  int stopped_ranks_ = 0;       // ranks still running when stopping began
  int launcher_signal_ = 0;     // what stopped the job, if a signal did
  int failed_index_ = -1;       // index in ranks_ of the first failed rank
  int unstartable_rank_ = -1;   // rank whose program could not be executed
  std::optional<StuckVerdict> stuck_;  // the watchdog stopped the job
  std::string start_error_;
};

}  // namespace dynmo::launcher

#endif  // DYNMO_LAUNCHER_RANK_SUPERVISOR_H_
