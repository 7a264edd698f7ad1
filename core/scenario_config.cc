#include "core/scenario_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/cost_model.h"

namespace dynmo::core {
namespace {

struct NamedScenario {
  Scenario scenario;
  const char* name;
};
constexpr NamedScenario kScenarios[] = {
    {Scenario::kPruning, "pruning"},
    {Scenario::kFreezing, "freezing"},
    {Scenario::kSparseAttention, "sparse-attention"},
    {Scenario::kEarlyExit, "early-exit"},
    {Scenario::kMoE, "moe"},
    {Scenario::kMoD, "mod"},
    {Scenario::kDense, "dense"},
};


}  // namespace

absl::StatusOr<Scenario> ParseScenario(absl::string_view name) {
  for (const NamedScenario& s : kScenarios) {
    if (name == s.name) return s.scenario;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown scenario '", name,
      "' (want pruning, freezing, sparse-attention, early-exit, moe, mod or dense)"));
}

std::string ScenarioName(Scenario scenario) {
  for (const NamedScenario& s : kScenarios) {
    if (s.scenario == scenario) return s.name;
  }
  return "unknown";
}

absl::Status ValidateScenarioConfig(const ScenarioConfig& c) {
  if (c.layers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("scenario layers must be >= 1, got ", c.layers));
  }
  if (c.iterations < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("scenario iterations must be >= 1, got ", c.iterations));
  }
  if (!FiniteNonNegative(c.fwd_s) || !FiniteNonNegative(c.bwd_s) ||
      !FiniteNonNegative(c.wgrad_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scenario base times must be finite and >= 0 (fwd=", c.fwd_s,
        " bwd=", c.bwd_s, " wgrad=", c.wgrad_s, ")"));
  }
  if (!(c.attention_share >= 0 && c.attention_share <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scenario attention_share must be in [0, 1], got ", c.attention_share));
  }
  // The caps keep every byte count (CSR adds 4 bytes per weight) in int64.
  if (c.layer_params < 0 || c.layer_params > (int64_t{1} << 40) ||
      c.bytes_per_param < 0 || c.bytes_per_param > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scenario layer_params must be in [0, 2^40] and bytes_per_param in "
        "[0, 64], got ",
        c.layer_params, " and ", c.bytes_per_param));
  }
  if (!(c.timing_noise >= 0 && c.timing_noise <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scenario timing_noise must be in [0, 1], got ", c.timing_noise));
  }
  return absl::OkStatus();
}

}  // namespace dynmo::core
