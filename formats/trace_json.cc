#include "formats/trace_json.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace dynmo::formats {
namespace {

using core::TraceLayer;
using core::TraceRecord;
using Json = nlohmann::json;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(what);
}

// nlohmann's message without its "[json.exception...] parse error at line 1,
// column 7: " preamble, whose line is the line within our one-line input.
std::string ParseErrorDetail(const Json::parse_error& e) {
  absl::string_view what = e.what();
  if (size_t at = what.find("column"); at != absl::string_view::npos) {
    if (size_t colon = what.find(": ", at); colon != absl::string_view::npos) {
      what.remove_prefix(colon + 2);
    }
  }
  return absl::StrCat("column ", e.byte, ": ", what);
}

absl::StatusOr<double> Time(const Json& layer, const char* key, size_t index) {
  auto it = layer.find(key);
  if (it == layer.end()) {
    return Bad(absl::StrCat("layer ", index, " has no \"", key, "\""));
  }
  if (!it->is_number()) {
    return Bad(absl::StrCat("layer ", index, " \"", key,
                            "\" must be a number, got ", it->dump()));
  }
  return it->get<double>();
}

absl::StatusOr<int64_t> Int64(const Json& value, absl::string_view what) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Bad(absl::StrCat(what, " is too large: ", value.dump()));
    }
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return Bad(absl::StrCat(what, " must be an integer, got ", value.dump()));
}

absl::StatusOr<TraceLayer> LayerOf(const Json& j, size_t index) {
  if (!j.is_object()) {
    return Bad(
        absl::StrCat("layer ", index, " must be an object, got ", j.dump()));
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "fwd" && key != "bwd" && key != "wgrad" && key != "mem_bytes") {
      return Bad(absl::StrCat("layer ", index, " has unknown key \"", key,
                              "\" (want fwd, bwd, wgrad, mem_bytes)"));
    }
  }
  TraceLayer layer;
  absl::StatusOr<double> fwd = Time(j, "fwd", index);
  if (!fwd.ok()) return fwd.status();
  absl::StatusOr<double> bwd = Time(j, "bwd", index);
  if (!bwd.ok()) return bwd.status();
  absl::StatusOr<double> wgrad = Time(j, "wgrad", index);
  if (!wgrad.ok()) return wgrad.status();
  layer.fwd_s = *fwd;
  layer.bwd_s = *bwd;
  layer.wgrad_s = *wgrad;
  if (auto it = j.find("mem_bytes"); it != j.end()) {
    absl::StatusOr<int64_t> bytes =
        Int64(*it, absl::StrCat("layer ", index, " \"mem_bytes\""));
    if (!bytes.ok()) return bytes.status();
    layer.mem_bytes = *bytes;
  }
  return layer;
}

absl::StatusOr<TraceRecord> RecordOf(absl::string_view line) {
  Json j;
  try {
    j = Json::parse(line.begin(), line.end());
  } catch (const Json::parse_error& e) {
    return Bad(absl::StrCat("invalid JSON at ", ParseErrorDetail(e)));
  } catch (const Json::exception& e) {  // e.g. a number beyond double
    return Bad(absl::StrCat("invalid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return Bad(
        absl::StrCat("a record must be a JSON object, got ", j.type_name()));
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "iter" && key != "layers") {
      return Bad(absl::StrCat("unknown key \"", key,
                              "\" (a record has iter and layers)"));
    }
  }
  TraceRecord record;
  auto iter = j.find("iter");
  if (iter == j.end()) return Bad("record has no \"iter\"");
  absl::StatusOr<int64_t> k = Int64(*iter, "\"iter\"");
  if (!k.ok()) return k.status();
  record.iter = *k;
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array()) {
    return Bad("record needs a \"layers\" array");
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    absl::StatusOr<TraceLayer> layer = LayerOf((*layers)[i], i);
    if (!layer.ok()) return layer.status();
    record.layers.push_back(*layer);
  }
  return record;
}

}  // namespace

absl::StatusOr<core::Trace> ParseTraceJsonl(absl::string_view text) {
  core::Trace trace;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);  // also a CRLF file's '\r'
    if (line.empty()) continue;
    absl::StatusOr<TraceRecord> record = RecordOf(line);
    absl::Status status = record.status();
    if (status.ok()) {
      status = core::ValidateTraceRecord(
          *record, trace.empty() ? nullptr : &trace.back());
    }
    if (!status.ok()) {
      return Bad(absl::StrCat("line ", line_number, ": ", status.message()));
    }
    trace.push_back(*std::move(record));
  }
  if (trace.empty()) return Bad("the trace has no records");
  return trace;
}

std::string TraceToJsonl(const core::Trace& trace) {
  std::string out;
  for (const TraceRecord& record : trace) {
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const TraceLayer& l : record.layers) {
      layers.push_back({{"fwd", l.fwd_s},
                        {"bwd", l.bwd_s},
                        {"wgrad", l.wgrad_s},
                        {"mem_bytes", l.mem_bytes}});
    }
    nlohmann::ordered_json line = {{"iter", record.iter},
                                   {"layers", std::move(layers)}};
    absl::StrAppend(&out, line.dump(), "\n");
  }
  return out;
}

}  // namespace dynmo::formats
