#include "coordinator/job/record_validation.h"

#include <cmath>
#include <cstdint>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/job/validation.h"

namespace dynmo::service {
namespace {

absl::Status Invalid(std::string what) { return absl::InvalidArgumentError(std::move(what)); }

bool Finite(double v) { return std::isfinite(v); }

// A plan of the record: issued (epoch in [1, newest]) and its boundaries a
// cut of the model's layers.
absl::Status CheckPlan(const dynmo::v1::PlanRecord& p, const dynmo::v1::JobRecord& r,
                       const char* which) {
  const uint64_t epoch = p.plan().epoch();
  if (epoch == 0 || epoch > r.epoch()) {
    return Invalid(absl::StrCat(which, " plan has epoch ", epoch, ", outside [1, ", r.epoch(),
                                "] (the newest issued)"));
  }
  const auto& b = p.plan().boundaries();
  if (b.empty()) return absl::OkStatus();
  if (b.size() > kMaxRanksPerJob + 1 || b[0] != 0 || b[b.size() - 1] != r.num_layers()) {
    return Invalid(absl::StrCat(which, " plan of epoch ", epoch,
                                " has boundaries that do not cut layers 0..", r.num_layers()));
  }
  for (int i = 1; i < b.size(); ++i) {
    if (b[i] < b[i - 1]) {
      return Invalid(absl::StrCat(which, " plan of epoch ", epoch, " has decreasing boundaries"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRanks(const dynmo::v1::JobRecord& r) {
  const int64_t world = static_cast<int64_t>(r.pipeline_size()) * r.data_parallel_size();
  if (r.ranks_size() > world) {
    return Invalid(absl::StrCat("record holds ", r.ranks_size(), " ranks of a job of ", world));
  }
  std::set<int> seen;
  for (const dynmo::v1::RankRecord& k : r.ranks()) {
    if (k.rank() < 0 || k.rank() >= world || !seen.insert(k.rank()).second) {
      return Invalid(absl::StrCat("rank ", k.rank(), " outside [0, ", world, ") or twice"));
    }
    if (k.pipeline_rank() < 0 || k.pipeline_rank() >= r.pipeline_size() ||
        k.data_parallel_rank() < 0 || k.data_parallel_rank() >= r.data_parallel_size()) {
      return Invalid(absl::StrCat("rank ", k.rank(), " has coordinates outside the job's shape"));
    }
    if (k.host().size() > 256 || k.device() < 0 || k.memory_capacity_bytes() < 0 ||
        k.memory_capacity_bytes() > kMaxBytes) {
      return Invalid(absl::StrCat("rank ", k.rank(), " has a host, device or memory out of bounds"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckProgress(const dynmo::v1::JobProgress& p, int pipeline_size) {
  if (p.last_iteration() < -1 || p.last_iteration() > kMaxIteration || p.reports() < 0) {
    return Invalid("progress: iteration or report count out of bounds");
  }
  if (!Finite(p.imbalance()) || !Finite(p.bottleneck_s()) || !Finite(p.lower_bound_s()) ||
      !Finite(p.bubble_ratio()) || p.stage_load_s_size() > pipeline_size) {
    return Invalid("progress: a figure is not finite or has too many stages");
  }
  for (double v : p.stage_load_s()) {
    if (!Finite(v)) return Invalid("progress: a stage load is not finite");
  }
  return absl::OkStatus();
}

}  // namespace

dynmo::v1::RegisterRequest RegistrationOf(const dynmo::v1::JobRecord& r) {
  dynmo::v1::RegisterRequest q;
  q.set_job(r.name());
  q.set_pipeline_size(r.pipeline_size());
  q.set_data_parallel_size(r.data_parallel_size());
  q.set_num_layers(r.num_layers());
  q.set_model_fingerprint(r.model_fingerprint());
  q.set_microbatches(r.microbatches());
  q.set_schedule(r.schedule());
  q.set_planned_iterations(r.planned_iterations());
  q.set_applied_epoch(r.applied_epoch());
  *q.mutable_boundaries() = r.boundaries();
  *q.mutable_active_stages() = r.active_stages();
  return q;
}

absl::Status ValidateJobRecord(const dynmo::v1::JobRecord& r) {
  if (absl::Status s = ValidateJobName(r.name()); !s.ok()) return s;
  if (r.owner().size() > 256) return Invalid("owner longer than 256 bytes");
  if (r.tombstone()) {
    if (r.pipeline_size() != 0 || r.ranks_size() > 0 || r.history_size() > 0) {
      return Invalid("a tombstone holds a name and an owner only");
    }
    return absl::OkStatus();
  }
  if (absl::Status s = ValidateRegister(RegistrationOf(r)); !s.ok()) return s;
  if (r.epoch() > kMaxEpoch || r.applied_epoch() > r.epoch()) {
    return Invalid(absl::StrCat("applied epoch ", r.applied_epoch(),
                                " beyond the newest issued epoch ", r.epoch()));
  }
  if (r.boundaries_size() == 0) return Invalid("record holds no layout (boundaries)");
  for (const dynmo::v1::PlanRecord& p : r.history()) {
    if (absl::Status s = CheckPlan(p, r, "a history"); !s.ok()) return s;
  }
  if (r.has_in_flight() && r.in_flight().has_plan()) {
    if (absl::Status s = CheckPlan(r.in_flight(), r, "the in-flight"); !s.ok()) return s;
  }
  if (absl::Status s = CheckRanks(r); !s.ok()) return s;
  return CheckProgress(r.progress(), r.pipeline_size());
}

}  // namespace dynmo::service
