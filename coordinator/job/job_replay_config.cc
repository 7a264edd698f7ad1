// The replay's configuration checks and the registration its simulated
// ranks send (job_replay.h).
#include "coordinator/job/job_replay.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/rebalance_trigger.h"
#include "core/stage_program.h"

namespace dynmo::service {
namespace {

constexpr char kJob[] = "replay";

}  // namespace

absl::Status ValidateJobReplayConfig(const JobReplayConfig& c) {
  if (c.pp < 1 || c.dp < 1 || c.microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pp, dp and microbatches must be >= 1, got ", c.pp, ", ", c.dp, ", ", c.microbatches));
  }
  if (absl::StatusOr<core::Schedule> s = core::ParseSchedule(c.schedule); !s.ok()) {
    return s.status();
  }
  if (!std::isfinite(c.migration_bandwidth_bytes_per_s) ||
      c.migration_bandwidth_bytes_per_s < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "migration bandwidth must be finite and >= 0 (0 = free), got ",
        c.migration_bandwidth_bytes_per_s));
  }
  for (const SpeedChange& sc : c.stragglers) {
    if (sc.rank < 0 || sc.rank >= c.pp * c.dp) {
      return absl::InvalidArgumentError(absl::StrCat(
          "straggler rank ", sc.rank, " outside [0, ", c.pp * c.dp, ")"));
    }
    if (!std::isfinite(sc.speed) || sc.speed <= 0 || sc.speed > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("straggler speed must be in (0, 1], got ", sc.speed));
    }
    if (sc.from_iteration < 0 || (sc.to_iteration >= 0 && sc.to_iteration <= sc.from_iteration)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "straggler iterations must be 0 <= from < to, got ", sc.from_iteration, " and ",
          sc.to_iteration));
    }
  }
  if (c.probe_every < 0 || !std::isfinite(c.probe_s) || c.probe_s <= 0) {
    return absl::InvalidArgumentError("probe_every must be >= 0 and probe_s > 0");
  }
  if (c.probe_every > 0 && c.probe_steady_every < c.probe_every) {
    return absl::InvalidArgumentError(absl::StrCat(
        "probe_steady_every must be >= probe_every (", c.probe_every, "), got ",
        c.probe_steady_every));
  }
  if (c.bytes_per_param < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes per parameter must be >= 0, got ", c.bytes_per_param));
  }
  if (!std::isfinite(c.change_threshold) || c.change_threshold < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("change threshold must be finite and >= 0, got ", c.change_threshold));
  }
  if (c.options.default_policy.trigger.kind == Trigger::Kind::kOnChange) {
    return absl::InvalidArgumentError(
        "trigger 'on-change' is the trace replay's, not the coordinator's: use every:N, "
        "on-event, auto or manual");
  }
  return core::ValidateTrigger(c.options.default_policy.trigger);
}

dynmo::v1::RegisterRequest ReplayRegistration(const core::Trace& trace,
                                              const JobReplayConfig& config, int rank) {
  dynmo::v1::RegisterRequest r;
  r.set_job(kJob);
  r.set_rank(rank);
  r.set_pipeline_rank(rank / config.dp);
  r.set_data_parallel_rank(rank % config.dp);
  r.set_pipeline_size(config.pp);
  r.set_data_parallel_size(config.dp);
  r.set_host(absl::StrCat("sim-", rank));
  r.set_device(0);
  if (config.stage_capacity_bytes >= 0) r.set_memory_capacity_bytes(config.stage_capacity_bytes);
  r.set_num_layers(trace.empty() ? 0 : static_cast<int>(trace.front().layers.size()));
  r.set_microbatches(config.microbatches);
  r.set_schedule(config.schedule);
  // The trace's length is the run's: a live job names its --steps.
  if (!trace.empty()) r.set_planned_iterations(trace.back().iter + 1);
  return r;
}

}  // namespace dynmo::service
