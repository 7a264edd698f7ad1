// StuckRank: whether a single-node job stopped making progress, and which
// rank to name. Progress is each rank's newest iteration report (as the
// node relay saw it, relay/node_relay.h); a rank that has not reported
// yet counts from the launch. A job is stuck when some rank's newest
// report is older than the timeout. Blamed, in this order: a rank whose
// process is stopped (SIGSTOP, a debugger), then the rank furthest behind
// (lowest iteration, then oldest report, then lowest rank) — in a pipeline
// its neighbours stall right after it, so "furthest behind" is the cause,
// not whoever waited longest.
//
// FindStuckRank is pure; ProcessStopped reads /proc. Thread-compatible.
#ifndef DYNMO_LAUNCHER_STUCK_RANK_H_
#define DYNMO_LAUNCHER_STUCK_RANK_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "absl/types/span.h"

namespace dynmo::launcher {

struct RankLiveness {
  int rank = -1;
  pid_t pid = -1;
  int64_t last_iteration = -1;                    // -1: no report yet
  absl::Time last_progress = absl::InfinitePast();  // newest report, or the launch
  bool stopped = false;                           // process state T (stopped)
};

struct StuckVerdict {
  int rank = -1;
  std::string why;  // one line: who, for how long, the evidence
};

// nullopt while every rank progressed within `timeout` (or timeout <= 0).
std::optional<StuckVerdict> FindStuckRank(absl::Span<const RankLiveness> ranks,
                                          absl::Time now, absl::Duration timeout);

// True when /proc says `pid` is stopped (state T or t).
bool ProcessStopped(pid_t pid);

}  // namespace dynmo::launcher

#endif  // DYNMO_LAUNCHER_STUCK_RANK_H_
