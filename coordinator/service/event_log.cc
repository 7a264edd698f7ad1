#include "coordinator/service/event_log.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "spdlog/logger.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace dynmo::service {
namespace {

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarning: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
  }
  return spdlog::level::info;
}

// spdlog writes the time (UTC, milliseconds) and level; %v is ours.
std::shared_ptr<spdlog::logger> MakeLogger(const EventLogOptions& o) {
  spdlog::sink_ptr sink;
  if (o.out != nullptr) {
    sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(*o.out, /*force_flush=*/true);
  } else {
    sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();  // flushes every line
  }
  auto logger = std::make_shared<spdlog::logger>("dynmo", std::move(sink));
  logger->set_pattern(o.format == LogFormat::kJson
                          ? R"({"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l",%v})"
                          : "ts=%Y-%m-%dT%H:%M:%S.%eZ level=%l %v",
                      spdlog::pattern_time_type::utc);
  logger->set_level(ToSpdlog(o.level));
  return logger;
}

struct Current {
  std::shared_ptr<spdlog::logger> logger;
  LogFormat format;
};

std::shared_ptr<const Current>& Slot() {
  static auto* slot = new std::shared_ptr<const Current>(
      std::make_shared<const Current>(Current{MakeLogger({}), LogFormat::kLogfmt}));
  return *slot;
}

std::shared_ptr<const Current> Load() { return std::atomic_load(&Slot()); }

bool NeedsQuotes(absl::string_view v) {
  if (v.empty()) return true;
  for (unsigned char c : v) {
    if (c <= ' ' || c == '=' || c == '"' || c == '\\' || c == 0x7f) return true;
  }
  return false;
}

void AppendLogfmtValue(absl::string_view v, std::string* out) {
  if (!NeedsQuotes(v)) return absl::StrAppend(out, v);
  out->push_back('"');
  for (unsigned char c : v) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\t': out->append("\\t"); break;
      case '\r': out->append("\\r"); break;
      default:
        if (c < ' ' || c == 0x7f) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

std::string JsonString(absl::string_view v) {
  // Invalid UTF-8 (a job name is the client's bytes) becomes U+FFFD.
  return nlohmann::json(std::string(v)).dump(-1, ' ', false,
                                             nlohmann::json::error_handler_t::replace);
}

}  // namespace

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "debug") return LogLevel::kDebug;
  if (n == "info") return LogLevel::kInfo;
  if (n == "warning") return LogLevel::kWarning;
  if (n == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_level '", name, "' is not debug, info, warning or error"));
}

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name) {
  if (name == "logfmt") return LogFormat::kLogfmt;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("--log_format '", name, "' is not logfmt or json"));
}

void ConfigureEventLog(const EventLogOptions& options) {
  std::atomic_store(&Slot(), std::make_shared<const Current>(
                                 Current{MakeLogger(options), options.format}));
}

absl::Status ConfigureEventLog(absl::string_view format, absl::string_view level) {
  absl::StatusOr<LogFormat> f = ParseLogFormat(format);
  if (!f.ok()) return f.status();
  absl::StatusOr<LogLevel> l = ParseLogLevel(level);
  if (!l.ok()) return l.status();
  ConfigureEventLog(EventLogOptions{*f, *l, nullptr});
  return absl::OkStatus();
}

std::string FormatEventFields(LogFormat format, absl::string_view event,
                              absl::Span<const LogField> fields) {
  std::string out;
  if (format == LogFormat::kJson) {
    absl::StrAppend(&out, "\"event\":", JsonString(event));
    for (const LogField& f : fields) {
      absl::StrAppend(&out, ",", JsonString(f.key()), ":",
                      f.bare() ? std::string(f.value()) : JsonString(f.value()));
    }
    return out;
  }
  out = "event=";
  AppendLogfmtValue(event, &out);
  for (const LogField& f : fields) {
    absl::StrAppend(&out, " ", f.key(), "=");
    AppendLogfmtValue(f.value(), &out);
  }
  return out;
}

void LogEvent(LogLevel level, absl::string_view event,
              absl::Span<const LogField> fields) {
  const std::shared_ptr<const Current> current = Load();
  const spdlog::level::level_enum l = ToSpdlog(level);
  if (!current->logger->should_log(l)) return;
  current->logger->log(l, spdlog::string_view_t(FormatEventFields(current->format, event, fields)));
}

}  // namespace dynmo::service
