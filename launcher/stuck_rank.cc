#include "launcher/stuck_rank.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace dynmo::launcher {

std::optional<StuckVerdict> FindStuckRank(absl::Span<const RankLiveness> ranks,
                                          absl::Time now, absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration() || ranks.empty()) return std::nullopt;
  const RankLiveness* blamed = nullptr;
  int64_t newest_iteration = -1;
  for (const RankLiveness& r : ranks) {
    newest_iteration = std::max(newest_iteration, r.last_iteration);
    if (now - r.last_progress < timeout) continue;  // progressed recently
    auto worse = [](const RankLiveness& a, const RankLiveness& b) {
      if (a.stopped != b.stopped) return a.stopped;
      if (a.last_iteration != b.last_iteration) return a.last_iteration < b.last_iteration;
      if (a.last_progress != b.last_progress) return a.last_progress < b.last_progress;
      return a.rank < b.rank;
    };
    if (blamed == nullptr || worse(r, *blamed)) blamed = &r;
  }
  // A stopped process anywhere is the cause, even if it is not the oldest.
  for (const RankLiveness& r : ranks) {
    if (blamed != nullptr && r.stopped && !blamed->stopped) blamed = &r;
  }
  if (blamed == nullptr) return std::nullopt;
  const std::string last =
      blamed->last_iteration < 0
          ? std::string("it has not finished an iteration")
          : absl::StrCat("its newest iteration is ", blamed->last_iteration);
  return StuckVerdict{
      blamed->rank,
      absl::StrCat("rank ", blamed->rank, " (pid ", blamed->pid, ") made no progress for ",
                   absl::FormatDuration(absl::Trunc(now - blamed->last_progress, absl::Seconds(1))),
                   " (--stuck_timeout_s): ", last, ", the job's newest is ", newest_iteration,
                   blamed->stopped ? "; its process is stopped (SIGSTOP or a debugger)" : "")};
}

bool ProcessStopped(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return false;
  // pid (comm) STATE ...; comm may hold spaces and parentheses.
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  const char state = line[close + 2];
  return state == 'T' || state == 't';
}

}  // namespace dynmo::launcher
