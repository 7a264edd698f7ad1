#include "formats/chrome_trace.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dynmo::formats {
namespace {

using Json = nlohmann::ordered_json;

constexpr double kMicros = 1e6;

// Names the process and one of its threads (tracks).
void NameTracks(Json& events, absl::string_view process, const std::vector<std::string>& threads) {
  events.push_back({{"ph", "M"}, {"pid", 0}, {"tid", 0}, {"name", "process_name"},
                    {"args", {{"name", std::string(process)}}}});
  for (size_t t = 0; t < threads.size(); ++t) {
    events.push_back({{"ph", "M"}, {"pid", 0}, {"tid", static_cast<int>(t)},
                      {"name", "thread_name"}, {"args", {{"name", threads[t]}}}});
    events.push_back({{"ph", "M"}, {"pid", 0}, {"tid", static_cast<int>(t)},
                      {"name", "thread_sort_index"},
                      {"args", {{"sort_index", static_cast<int>(t)}}}});
  }
}

const char* ActionLetter(core::OpKind kind) {
  switch (kind) {
    case core::OpKind::kForward: return "F";
    case core::OpKind::kBackward: return "B";
    case core::OpKind::kWeightGrad: return "W";
  }
  return "?";
}

}  // namespace

Json SimResultToChromeTrace(const core::SimResult& result, absl::string_view title) {
  Json events = Json::array();
  std::vector<std::string> stages;
  for (size_t s = 0; s < result.stage_busy_s.size(); ++s) {
    stages.push_back(absl::StrCat("stage ", s));
  }
  NameTracks(events, title, stages);
  for (const core::SimOp& op : result.timeline) {
    events.push_back({{"ph", "X"},
                      {"pid", 0},
                      {"tid", op.stage},
                      {"name", absl::StrCat("PP:", op.stage, ActionLetter(op.kind), op.microbatch)},
                      {"cat", ActionLetter(op.kind)},
                      {"ts", op.start_s * kMicros},
                      {"dur", (op.end_s - op.start_s) * kMicros},
                      {"args", {{"stage", op.stage}, {"microbatch", op.microbatch}}}});
  }
  Json trace;
  trace["traceEvents"] = std::move(events);
  trace["displayTimeUnit"] = "ms";
  trace["otherData"] = {{"title", std::string(title)},
                        {"iteration_time_s", result.iteration_time_s},
                        {"bubble_ratio", result.bubble_ratio}};
  return trace;
}

Json TimelineToChromeTrace(const std::vector<TimelineTrack>& tracks,
                           const std::vector<TimelineMark>& marks, absl::string_view title) {
  Json events = Json::array();
  std::vector<std::string> names;
  for (const TimelineTrack& t : tracks) names.push_back(t.name);
  NameTracks(events, title, names);
  for (size_t t = 0; t < tracks.size(); ++t) {
    const TimelineTrack& track = tracks[t];
    double at = 0;
    for (size_t i = 0; i < track.seconds.size() && i < track.iterations.size(); ++i) {
      events.push_back({{"ph", "X"},
                        {"pid", 0},
                        {"tid", static_cast<int>(t)},
                        {"name", absl::StrCat("iteration ", track.iterations[i])},
                        {"ts", at * kMicros},
                        {"dur", track.seconds[i] * kMicros}});
      // Marks on this track at this iteration's start.
      for (const TimelineMark& m : marks) {
        if (m.track != track.name || m.iteration != track.iterations[i]) continue;
        Json args = Json::object();
        for (const auto& [k, v] : m.args) args[k] = v;
        events.push_back({{"ph", "i"},
                          {"s", "t"},
                          {"pid", 0},
                          {"tid", static_cast<int>(t)},
                          {"name", m.name},
                          {"ts", at * kMicros},
                          {"args", std::move(args)}});
      }
      at += track.seconds[i];
    }
  }
  Json trace;
  trace["traceEvents"] = std::move(events);
  trace["displayTimeUnit"] = "ms";
  trace["otherData"] = {{"title", std::string(title)}};
  return trace;
}

}  // namespace dynmo::formats
