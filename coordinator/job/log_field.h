// LogLevel and LogField: the level and the key=value fields of one event of
// the coordinator's event log (coordinator/service/event_log.h), as plain
// values, so that code which produces events without writing them (the job
// machine, job_machine.h) needs no logger. Keys are string literals (kept
// as views); values are rendered text.
//
// Thread-compatible value types.
#ifndef DYNMO_COORDINATOR_JOB_LOG_FIELD_H_
#define DYNMO_COORDINATOR_JOB_LOG_FIELD_H_

#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dynmo::service {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

// One key=value of an event. Text is quoted and escaped as the format
// wants; numbers and booleans stay bare (JSON numbers, logfmt words).
class LogField {
 public:
  LogField(absl::string_view key, absl::string_view text)
      : key_(key), value_(text), bare_(false) {}
  LogField(absl::string_view key, const char* text)
      : LogField(key, absl::string_view(text)) {}
  LogField(absl::string_view key, const std::string& text)
      : LogField(key, absl::string_view(text)) {}
  LogField(absl::string_view key, bool value)
      : key_(key), value_(value ? "true" : "false"), bare_(true) {}
  template <typename Int,
            std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool>, int> = 0>
  LogField(absl::string_view key, Int value)
      : key_(key), value_(absl::StrCat(value)), bare_(true) {}
  // A non-finite double is written as text ("inf", "nan"): JSON has no
  // number for it.
  LogField(absl::string_view key, double value);

  absl::string_view key() const { return key_; }
  absl::string_view value() const { return value_; }
  bool bare() const { return bare_; }

 private:
  absl::string_view key_;
  std::string value_;
  bool bare_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_LOG_FIELD_H_
