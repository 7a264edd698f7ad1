#include "coordinator/service/refusal_log.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/service/event_log.h"

namespace dynmo::service {

std::string Bounded(absl::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  return absl::StrCat(text.substr(0, max_chars), "... (+", text.size() - max_chars, " bytes)");
}

std::string BoundedList(absl::Span<const std::string> items, size_t max_items) {
  std::string out;
  const size_t shown = std::min(items.size(), max_items);
  for (size_t i = 0; i < shown; ++i) {
    absl::StrAppend(&out, i > 0 ? "," : "", Bounded(items[i], 64));
  }
  if (items.size() > shown) absl::StrAppend(&out, "... (+", items.size() - shown, " more)");
  return out;
}

bool RefusalLimiter::Admit(absl::string_view kind, absl::Time now, int64_t* suppressed) {
  absl::MutexLock lock(&mu_);
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) it = kinds_.emplace(std::string(kind), Kind{}).first;
  Kind& k = it->second;
  if (now - k.window_start >= window_) {
    k.window_start = now;
    k.written = 0;
  }
  if (k.written >= lines_per_window_) {
    ++k.dropped;
    return false;
  }
  ++k.written;
  *suppressed = k.dropped;
  k.dropped = 0;
  return true;
}

void LogRefusal(LogLevel level, absl::string_view event, std::vector<LogField> fields) {
  static RefusalLimiter* const limiter = new RefusalLimiter();
  int64_t suppressed = 0;
  if (!limiter->Admit(event, absl::Now(), &suppressed)) return;
  if (suppressed > 0) fields.emplace_back("suppressed", suppressed);
  LogEvent(level, event, fields);
}

}  // namespace dynmo::service
