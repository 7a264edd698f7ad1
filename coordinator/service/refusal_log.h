// RefusalLog: the event-log lines of refused requests (bad credentials,
// refused claims and returns, a Session's refused messages), bounded in
// size and in rate, so that a hostile or broken client cannot flood the log:
//
// - every text field is cut to kMaxRefusalFieldChars, lists to their first
//   kMaxRefusalListItems items, each with what was left out ("... (+N)");
// - each kind of refusal logs at most `lines_per_window` lines a window
//   (10 a minute); the ones it drops are counted and the next line of that
//   kind carries `suppressed=N`.
//
// RefusalLimiter is the rule, with the time passed in (tests drive it);
// LogRefusal applies the process's limiter at absl::Now() and writes the
// line. Thread-safe.
#ifndef DYNMO_COORDINATOR_SERVICE_REFUSAL_LOG_H_
#define DYNMO_COORDINATOR_SERVICE_REFUSAL_LOG_H_

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "coordinator/job/log_field.h"

namespace dynmo::service {

inline constexpr size_t kMaxRefusalFieldChars = 256;
inline constexpr size_t kMaxRefusalListItems = 8;

// `text` cut to `max_chars` bytes, "... (+N bytes)" appended when cut.
std::string Bounded(absl::string_view text, size_t max_chars = kMaxRefusalFieldChars);
// The first `max_items` of `items` (each Bounded to 64 bytes) joined by
// commas, "... (+N more)" appended when there were more.
std::string BoundedList(absl::Span<const std::string> items,
                        size_t max_items = kMaxRefusalListItems);

class RefusalLimiter {
 public:
  explicit RefusalLimiter(int lines_per_window = 10,
                          absl::Duration window = absl::Minutes(1))
      : lines_per_window_(lines_per_window), window_(window) {}

  // Whether a line of `kind` may be written at `now`; when it may,
  // `*suppressed` is the number of lines of that kind dropped since the
  // last one written (and the count restarts).
  bool Admit(absl::string_view kind, absl::Time now, int64_t* suppressed);

 private:
  struct Kind {
    absl::Time window_start = absl::InfinitePast();
    int written = 0;
    int64_t dropped = 0;
  };
  const int lines_per_window_;
  const absl::Duration window_;
  absl::Mutex mu_;
  std::map<std::string, Kind, std::less<>> kinds_ ABSL_GUARDED_BY(mu_);
};

// Writes the `event` line when the process's limiter admits it, with a
// `suppressed` field appended when lines were dropped before it. The
// caller bounds the fields (Bounded, BoundedList).
void LogRefusal(LogLevel level, absl::string_view event, std::vector<LogField> fields);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_REFUSAL_LOG_H_
