// JSON codec for dynmo-plan: a partitioning problem in, a decision out.
//
// Problem: {"stages":S,
//           "layers":[{"time":T | "fwd":F,"bwd":B,"wgrad":W,
//                      "params":P,"mem_bytes":M,"activation_bytes":A}, ...],
//           "capacity_bytes":[S numbers], "speed":[S numbers],
//           "inflight_microbatches":[S integers],
//           "link":{"boundary_bytes":N,"bandwidth_bytes_per_s":X,
//                   "overlapped":bool},
//           "current":[b0..bS]}
// Everything but "stages" and "layers" is optional. "current" may also be
// given in another trainer's format (plan_formats.h): a torchtitan list of
// FQN lists, a Megatron layout string, or an object keyed by the format. Parsing checks shape and
// types and names the field at fault; the numbers' meaning is checked by
// core::ValidateModel when the problem is solved.
#ifndef DYNMO_FORMATS_PROBLEM_JSON_H_
#define DYNMO_FORMATS_PROBLEM_JSON_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/boundaries.h"
#include "core/cost_model.h"
#include "core/measures.h"
#include "core/migration.h"
#include "core/repack.h"
#include "nlohmann/json.hpp"

namespace dynmo::formats {

struct PlanProblem {
  core::PipelineModel model;
  std::optional<core::Boundaries> current;
};

absl::StatusOr<PlanProblem> ParsePlanProblem(absl::string_view text);

nlohmann::json MigrationToJson(const core::MigrationPlan& plan);
nlohmann::json SummaryToJson(const core::PartitionSummary& summary);
nlohmann::json CommSplitToJson(const std::vector<core::CommSplit>& split);

}  // namespace dynmo::formats

#endif  // DYNMO_FORMATS_PROBLEM_JSON_H_
