// The coordinator's event log: one line per decision (a plan issued,
// committed, applied or aborted with its reason, a re-pack, a claim or
// return, an auth failure, a persistence error, a job created or deleted),
// levelled (debug|info|warning|error) and made of key=value fields:
//
//   ts=2026-11-24T08:00:00.123Z level=info event=plan_applied job=demo epoch=3 ...
//
// (logfmt, the default) or, with --log_format=json, one JSON object a line
// with the same keys. Lines go to stderr, which journald and kubectl logs
// read as they are. spdlog does the levels, the timestamps and the sink;
// this file only renders the fields, so the header names no spdlog type
// and nothing that includes it needs spdlog's headers.
//
// Thread-safe: LogEvent may be called from any thread (spdlog's _mt sinks
// serialise the writes); ConfigureEventLog swaps the logger atomically.
// Before any ConfigureEventLog, events go to stderr as logfmt at info.
#ifndef DYNMO_COORDINATOR_SERVICE_EVENT_LOG_H_
#define DYNMO_COORDINATOR_SERVICE_EVENT_LOG_H_

#include <initializer_list>
#include <ostream>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "coordinator/job/log_field.h"

namespace dynmo::service {

enum class LogFormat { kLogfmt, kJson };

// "debug" | "info" | "warning" | "error"; INVALID_ARGUMENT otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);
// "logfmt" | "json"; INVALID_ARGUMENT otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name);

struct EventLogOptions {
  LogFormat format = LogFormat::kLogfmt;
  LogLevel level = LogLevel::kInfo;
  // Where lines go; null: stderr. Tests pass a stream they read back.
  std::ostream* out = nullptr;
};

// Replaces the process's event logger.
void ConfigureEventLog(const EventLogOptions& options);
// The same from the --log_format / --log_level flags' text; an error names
// the bad flag and leaves the logger as it was.
absl::Status ConfigureEventLog(absl::string_view format, absl::string_view level);

// Writes one event when `level` is at or above the configured level.
void LogEvent(LogLevel level, absl::string_view event,
              absl::Span<const LogField> fields);

// The event and its fields as `format` renders them after the timestamp
// and level (no newline): `event=E k=v ...` or `"event":"E","k":v,...`.
std::string FormatEventFields(LogFormat format, absl::string_view event,
                              absl::Span<const LogField> fields);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_EVENT_LOG_H_
