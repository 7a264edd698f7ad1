#include "launcher/rank_supervisor.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "launcher/rank_process.h"

namespace dynmo::launcher {
namespace {

// How long to keep reading output after the last rank is gone: a child
// that left the rank's process group may hold its pipe open forever.
constexpr absl::Duration kDrainAfterExit = absl::Seconds(1);

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // EPIPE and friends: nobody is listening
    done += static_cast<size_t>(n);
  }
}

int MillisUntil(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now()) + 1;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 60'000));
}

std::string Ranks(int n) { return absl::StrCat(n, n == 1 ? " rank" : " ranks"); }

}  // namespace

RankSupervisor::~RankSupervisor() {
  for (Rank& r : ranks_) {
    for (int s = 0; s < 2; ++s) {
      if (r.fds[s] >= 0) close(r.fds[s]);
    }
  }
}

absl::Status RankSupervisor::Start(int rank,
                                   const std::vector<std::string>& argv,
                                   const std::vector<std::string>& env) {
  absl::StatusOr<RankProcess> p = SpawnRank(
      rank, argv, env,
      options_.guard != nullptr ? options_.guard->registration_fd() : -1);
  if (!p.ok()) {
    unstartable_rank_ = rank;
    start_error_ = std::string(p.status().message());
    BeginStop(SIGTERM);
    return p.status();
  }
  const std::string prefix = absl::StrCat("[rank ", rank, "] ");
  ranks_.push_back(Rank{rank, p->pid, {p->stdout_fd, p->stderr_fd},
                        {LinePrefixer(prefix), LinePrefixer(prefix)}});
  return absl::OkStatus();
}

void RankSupervisor::SignalRunning(int signo) {
  for (const Rank& r : ranks_) {
    if (r.running) kill(-r.pid, signo);
  }
}

void RankSupervisor::BeginStop(int signo) {
  if (stopping_) return;
  stopping_ = true;
  stopped_ranks_ = static_cast<int>(
      std::count_if(ranks_.begin(), ranks_.end(),
                    [](const Rank& r) { return r.running; }));
  SignalRunning(signo);
  kill_deadline_ = absl::Now() + options_.stop_grace;
}

void RankSupervisor::ReapExited() {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (!r.running) continue;
    int status;
    const pid_t got = waitpid(r.pid, &status, WNOHANG);
    if (got != r.pid) continue;
    r.running = false;
    r.wait_status = status;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && !stopping_) {
      failed_index_ = static_cast<int>(i);
      BeginStop(SIGTERM);
    }
  }
}

void RankSupervisor::CloseOutput(Rank& rank, int stream) {
  WriteAll(stream == 0 ? options_.stdout_fd : options_.stderr_fd,
           rank.prefixers[stream].Finish());
  close(rank.fds[stream]);
  rank.fds[stream] = -1;
}

void RankSupervisor::ReadOutput(Rank& rank, int stream) {
  char buf[64 << 10];
  const ssize_t n = read(rank.fds[stream], buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    CloseOutput(rank, stream);
    return;
  }
  WriteAll(stream == 0 ? options_.stdout_fd : options_.stderr_fd,
           rank.prefixers[stream].Append(absl::string_view(buf, n)));
}

bool RankSupervisor::AnyRunning() const {
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [](const Rank& r) { return r.running; });
}

bool RankSupervisor::AnyOutputOpen() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) {
    return r.fds[0] >= 0 || r.fds[1] >= 0;
  });
}

LaunchOutcome RankSupervisor::Run() {
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, s);
  const int signal_fd = signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) {
    // Without it we cannot see exits or signals; stop rather than hang.
    BeginStop(SIGKILL);
  }

  bool cleaned_up = false;
  absl::Time drain_deadline = absl::InfiniteFuture();
  absl::Time next_watch = absl::Now() + options_.watch_every;
  for (;;) {
    ReapExited();
    if (options_.watchdog && !stopping_ && absl::Now() >= next_watch) {
      std::vector<std::pair<int, pid_t>> running;
      for (const Rank& r : ranks_) {
        if (r.running) running.emplace_back(r.rank, r.pid);
      }
      stuck_ = options_.watchdog(absl::Now(), running);
      if (stuck_) BeginStop(SIGTERM);
      next_watch = absl::Now() + options_.watch_every;
    }
    if (stopping_ && !killed_ && AnyRunning() &&
        absl::Now() >= kill_deadline_) {
      SignalRunning(SIGKILL);
      killed_ = true;
    }
    if (!AnyRunning() && !cleaned_up) {
      // What the ranks left behind in their groups goes too.
      for (const Rank& r : ranks_) kill(-r.pid, SIGKILL);
      cleaned_up = true;
      drain_deadline = absl::Now() + kDrainAfterExit;
    }
    if (cleaned_up && (!AnyOutputOpen() || absl::Now() >= drain_deadline)) {
      break;
    }

    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, int>> owners;  // (rank index, stream)
    if (signal_fd >= 0) fds.push_back({signal_fd, POLLIN, 0});
    for (size_t i = 0; i < ranks_.size(); ++i) {
      for (int s = 0; s < 2; ++s) {
        if (ranks_[i].fds[s] < 0) continue;
        fds.push_back({ranks_[i].fds[s], POLLIN, 0});
        owners.push_back({i, s});
      }
    }
    int timeout_ms = signal_fd >= 0 ? -1 : 50;
    if (cleaned_up) {
      timeout_ms = MillisUntil(drain_deadline);
    } else if (stopping_ && !killed_) {
      timeout_ms = MillisUntil(kill_deadline_);
    } else if (options_.watchdog) {
      const int watch_ms = MillisUntil(next_watch);
      timeout_ms = timeout_ms < 0 ? watch_ms : std::min(timeout_ms, watch_ms);
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      BeginStop(SIGKILL);
      killed_ = true;
      continue;
    }

    size_t next = 0;
    if (signal_fd >= 0) {
      if (fds[0].revents != 0) {
        signalfd_siginfo info;
        while (read(signal_fd, &info, sizeof(info)) ==
               static_cast<ssize_t>(sizeof(info))) {
          const int signo = static_cast<int>(info.ssi_signo);
          if (signo == SIGCHLD) continue;  // reaped at the top of the loop
          if (!stopping_) {
            launcher_signal_ = signo;
            BeginStop(signo);
          } else if (!killed_) {
            SignalRunning(SIGKILL);  // asked twice: no more grace
            killed_ = true;
          }
        }
      }
      next = 1;
    }
    for (size_t k = 0; k < owners.size(); ++k) {
      if (fds[next + k].revents == 0) continue;
      ReadOutput(ranks_[owners[k].first], owners[k].second);
    }
  }

  for (Rank& r : ranks_) {
    for (int s = 0; s < 2; ++s) {
      if (r.fds[s] >= 0) CloseOutput(r, s);
    }
  }
  if (signal_fd >= 0) close(signal_fd);
  return Outcome();
}

LaunchOutcome RankSupervisor::Outcome() const {
  const int others = std::max(0, stopped_ranks_);
  const std::string stopped =
      others == 0 ? "no other rank was running"
                  : absl::StrCat("stopped the other ", Ranks(others));
  if (launcher_signal_ != 0) {
    return {128 + launcher_signal_,
            absl::StrCat("dynmo-launch: received ", SignalName(launcher_signal_),
                         "; stopped ", Ranks(stopped_ranks_))};
  }
  if (stuck_) {
    return {1, absl::StrCat("dynmo-launch: ", stuck_->why, "; stopped ",
                            Ranks(stopped_ranks_))};
  }
  if (unstartable_rank_ >= 0) {
    return {127, absl::StrCat("dynmo-launch: rank ", unstartable_rank_,
                              " could not start: ", start_error_, "; ",
                              stopped)};
  }
  if (failed_index_ >= 0) {
    const Rank& r = ranks_[failed_index_];
    return {1, absl::StrCat("dynmo-launch: rank ", r.rank, " (pid ", r.pid,
                            ") failed: ", DescribeWaitStatus(r.wait_status),
                            "; ", stopped)};
  }
  return {0, ""};
}

}  // namespace dynmo::launcher
