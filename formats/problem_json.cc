#include "formats/problem_json.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "formats/plan_formats.h"

namespace dynmo::formats {
namespace {

using nlohmann::json;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(std::string(what));
}

// Reads a number field; absent -> fallback. NaN and infinities cannot be
// written in JSON, so "finite" is guaranteed by the parser itself.
absl::StatusOr<double> Number(const json& obj, const char* key, double fallback,
                              absl::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (!it->is_number()) {
    return Bad(absl::StrCat(where, ": \"", key, "\" must be a number"));
  }
  return it->get<double>();
}

absl::StatusOr<int64_t> Integer(const json& obj, const char* key,
                                int64_t fallback, absl::string_view where) {
  auto it = obj.find(key);
  if (it == obj.end()) return fallback;
  if (!it->is_number()) {
    return Bad(absl::StrCat(where, ": \"", key, "\" must be a number"));
  }
  const double d = it->get<double>();
  if (d != std::floor(d) || std::fabs(d) > 9.0e18) {
    return Bad(absl::StrCat(where, ": \"", key, "\" must be an integer"));
  }
  return static_cast<int64_t>(d);
}

// An optional per-stage array of numbers.
absl::StatusOr<std::vector<double>> StageArray(const json& root,
                                               const char* key, int stages) {
  auto it = root.find(key);
  if (it == root.end()) return std::vector<double>();
  if (!it->is_array() || static_cast<int>(it->size()) != stages) {
    return Bad(absl::StrCat("\"", key, "\" must be an array of ", stages,
                            " numbers (one per stage)"));
  }
  std::vector<double> out;
  for (const json& v : *it) {
    if (!v.is_number()) {
      return Bad(absl::StrCat("\"", key, "\" must hold only numbers"));
    }
    out.push_back(v.get<double>());
  }
  return out;
}

absl::Status ParseLayer(const json& j, int i, core::LayerCost& l) {
  const std::string where = absl::StrCat("layer ", i);
  if (!j.is_object()) return Bad(absl::StrCat(where, " must be an object"));
  const bool has_time = j.contains("time");
  const bool has_split = j.contains("fwd") || j.contains("bwd") || j.contains("wgrad");
  if (has_time == has_split) {
    return Bad(absl::StrCat(where, " needs \"time\" or \"fwd\"/\"bwd\"/\"wgrad\", "
                                   "exactly one of the two forms"));
  }
  l.id = i;
  if (has_time) {
    absl::StatusOr<double> t = Number(j, "time", 0, where);
    if (!t.ok()) return t.status();
    l.fwd_s = *t;
  } else {
    absl::StatusOr<double> f = Number(j, "fwd", 0, where);
    absl::StatusOr<double> b = Number(j, "bwd", 0, where);
    absl::StatusOr<double> w = Number(j, "wgrad", 0, where);
    for (const auto* s : {&f, &b, &w}) {
      if (!s->ok()) return s->status();
    }
    l.fwd_s = *f;
    l.bwd_s = *b;
    l.wgrad_s = *w;
  }
  absl::StatusOr<int64_t> params = Integer(j, "params", 0, where);
  absl::StatusOr<int64_t> mem = Integer(j, "mem_bytes", 0, where);
  absl::StatusOr<int64_t> act = Integer(j, "activation_bytes", 0, where);
  for (const auto* s : {&params, &mem, &act}) {
    if (!s->ok()) return s->status();
  }
  l.params = *params;
  l.resident_bytes = *mem;
  l.activation_bytes = *act;
  return absl::OkStatus();
}

// "current": boundaries as given (checked against the model when it is
// solved), or a split in another trainer's words (plan_formats.h), decoded
// here where the model's layer and stage counts are known.
absl::StatusOr<core::Boundaries> ParseCurrent(const json& cur, int layers, int stages) {
  const bool foreign = cur.is_string() || cur.is_object() ||
                       (cur.is_array() && !cur.empty() && cur[0].is_array());
  if (foreign) {
    absl::StatusOr<core::Boundaries> b = ReadAnySplit(cur, {layers, stages});
    if (!b.ok()) return Bad(absl::StrCat("\"current\": ", b.status().message()));
    return b;
  }
  if (!cur.is_array()) return Bad("\"current\" must be an array of boundaries");
  core::Boundaries b;
  for (const json& v : cur) {
    if (!v.is_number_integer()) {
      return Bad("\"current\" must hold integer boundaries");
    }
    b.push_back(static_cast<int>(v.get<int64_t>()));
  }
  return b;
}

}  // namespace

absl::StatusOr<PlanProblem> ParsePlanProblem(absl::string_view text) {
  json root = json::parse(text.begin(), text.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded()) return Bad("input is not valid JSON");
  if (!root.is_object()) return Bad("input must be a JSON object");
  PlanProblem p;
  auto stages_it = root.find("stages");
  if (stages_it == root.end() || !stages_it->is_number_integer() ||
      stages_it->get<int64_t>() < 1 || stages_it->get<int64_t>() > 1000000) {
    return Bad("\"stages\" must be a positive integer");
  }
  const int stages = static_cast<int>(stages_it->get<int64_t>());
  auto layers_it = root.find("layers");
  if (layers_it == root.end() || !layers_it->is_array() || layers_it->empty()) {
    return Bad("\"layers\" must be a non-empty array");
  }
  for (size_t i = 0; i < layers_it->size(); ++i) {
    core::LayerCost l;
    if (absl::Status st = ParseLayer((*layers_it)[i], static_cast<int>(i), l);
        !st.ok()) {
      return st;
    }
    p.model.layers.push_back(l);
  }
  p.model.stages.assign(stages, core::StageSpec{});
  absl::StatusOr<std::vector<double>> caps = StageArray(root, "capacity_bytes", stages);
  absl::StatusOr<std::vector<double>> speed = StageArray(root, "speed", stages);
  absl::StatusOr<std::vector<double>> inflight =
      StageArray(root, "inflight_microbatches", stages);
  for (const auto* s : {&caps, &speed, &inflight}) {
    if (!s->ok()) return s->status();
  }
  for (int s = 0; s < stages; ++s) {
    if (!caps->empty()) {
      if ((*caps)[s] < 0) {
        return Bad(absl::StrCat("capacity_bytes of stage ", s, " is negative"));
      }
      p.model.stages[s].capacity_bytes = static_cast<int64_t>((*caps)[s]);
    }
    if (!speed->empty()) p.model.stages[s].speed = (*speed)[s];
    if (!inflight->empty()) {
      p.model.stages[s].inflight_microbatches = static_cast<int>((*inflight)[s]);
    }
  }
  if (auto link = root.find("link"); link != root.end()) {
    if (!link->is_object()) return Bad("\"link\" must be an object");
    absl::StatusOr<int64_t> bytes = Integer(*link, "boundary_bytes", 0, "link");
    absl::StatusOr<double> bw = Number(*link, "bandwidth_bytes_per_s", 0, "link");
    if (!bytes.ok()) return bytes.status();
    if (!bw.ok()) return bw.status();
    p.model.link.boundary_bytes = *bytes;
    p.model.link.bandwidth_bytes_per_s = *bw;
    if (auto ov = link->find("overlapped"); ov != link->end()) {
      if (!ov->is_boolean()) return Bad("link: \"overlapped\" must be true or false");
      p.model.link.overlapped = ov->get<bool>();
    }
  }
  if (auto cur = root.find("current"); cur != root.end()) {
    absl::StatusOr<core::Boundaries> b =
        ParseCurrent(*cur, static_cast<int>(p.model.layers.size()), stages);
    if (!b.ok()) return b.status();
    p.current = *std::move(b);
  }
  return p;
}

json MigrationToJson(const core::MigrationPlan& plan) {
  json arr = json::array();
  for (const core::LayerMigration& m : plan.migrations) {
    arr.push_back({{"layer", m.layer},
                   {"from", m.from_stage},
                   {"to", m.to_stage},
                   {"bytes", m.bytes},
                   {"round", m.round}});
  }
  return arr;
}

json SummaryToJson(const core::PartitionSummary& s) {
  return {{"loads", s.loads},
          {"memory_bytes", s.memory_bytes},
          {"bottleneck", s.bottleneck},
          {"imbalance", s.imbalance},
          {"lower_bound", s.lower_bound}};
}

json CommSplitToJson(const std::vector<core::CommSplit>& split) {
  json arr = json::array();
  for (const core::CommSplit& c : split) {
    arr.push_back({{"stage", c.stage}, {"color", c.color}, {"key", c.key}});
  }
  return arr;
}

}  // namespace dynmo::formats
