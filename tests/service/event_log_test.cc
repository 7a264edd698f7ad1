// The event log's rendering: logfmt quoting and escaping, JSON that parses
// with the same keys, bare numbers, levels that filter.
#include "coordinator/service/event_log.h"

#include <cmath>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dynmo::service {
namespace {

TEST(EventLogTest, LogfmtQuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(FormatEventFields(LogFormat::kLogfmt, "plan_aborted",
                              {{"job", "demo"},
                               {"epoch", uint64_t{7}},
                               {"reason", "rank 3 FAILED: \"oom\"\nretry"},
                               {"empty", ""},
                               {"ok", true}}),
            "event=plan_aborted job=demo epoch=7 "
            "reason=\"rank 3 FAILED: \\\"oom\\\"\\nretry\" empty=\"\" ok=true");
  EXPECT_EQ(FormatEventFields(LogFormat::kLogfmt, "x", {{"k", "a=b"}}), "event=x k=\"a=b\"");
}

TEST(EventLogTest, JsonParsesWithTheSameKeysAndBareNumbers) {
  const std::string fields = FormatEventFields(
      LogFormat::kJson, "claim",
      {{"gpus", "gpu-1,gpu-2"}, {"lease_s", int64_t{60}}, {"holder", "b\"\\\x01"},
       {"ratio", 0.25}, {"bad", std::nan("")}, {"name", std::string("\xff")}});
  const nlohmann::json j = nlohmann::json::parse("{" + fields + "}");
  EXPECT_EQ(j["event"], "claim");
  EXPECT_EQ(j["gpus"], "gpu-1,gpu-2");
  EXPECT_EQ(j["lease_s"], 60);
  EXPECT_EQ(j["holder"], "b\"\\\x01");
  EXPECT_DOUBLE_EQ(j["ratio"].get<double>(), 0.25);
  EXPECT_EQ(j["bad"], "nan") << "JSON has no NaN number";
  EXPECT_EQ(j["name"], "\xEF\xBF\xBD") << "invalid UTF-8 is replaced, not thrown";
}

TEST(EventLogTest, LinesCarryTimeAndLevelAndTheLevelFilters) {
  std::ostringstream out;
  ConfigureEventLog(EventLogOptions{LogFormat::kLogfmt, LogLevel::kWarning, &out});
  LogEvent(LogLevel::kInfo, "hidden", {});
  LogEvent(LogLevel::kWarning, "shown", {{"n", 1}});
  std::ostringstream json;
  ConfigureEventLog(EventLogOptions{LogFormat::kJson, LogLevel::kDebug, &json});
  LogEvent(LogLevel::kDebug, "detail", {{"n", 2}});
  ConfigureEventLog(EventLogOptions{});
  const std::string line = out.str();
  EXPECT_EQ(line.find("hidden"), std::string::npos) << line;
  ASSERT_EQ(line.rfind("ts=", 0), 0u) << line;
  EXPECT_EQ(line.back(), '\n');
  EXPECT_NE(line.find("Z level=warning event=shown n=1\n"), std::string::npos) << line;
  const nlohmann::json j = nlohmann::json::parse(json.str());
  EXPECT_EQ(j["level"], "debug");
  EXPECT_EQ(j["event"], "detail");
  EXPECT_EQ(j["n"], 2);
  EXPECT_EQ(j["ts"].get<std::string>().back(), 'Z');
}

TEST(EventLogTest, FlagsNameTheirMistake) {
  EXPECT_TRUE(ParseLogLevel("warning").ok());
  EXPECT_EQ(ParseLogLevel("loud").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLogFormat("xml").status().message(), "--log_format 'xml' is not logfmt or json");
  EXPECT_FALSE(ConfigureEventLog("json", "verbose").ok());
}

}  // namespace
}  // namespace dynmo::service
