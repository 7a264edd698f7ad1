// JobMachine's side of a plan: the decision made a plan and handed to the
// plan lifecycle (plan_lifecycle.h), and what the lifecycle's outcome does
// to the job — the layout switched (GPUs released, a re-shape), the record
// persisted, then the messages and events passed on. The lifecycle decides
// every step; this only carries it out, in its order.
//
// Part of JobMachine (job_machine.h).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/job/job_machine.h"

namespace dynmo::service {

absl::StatusOr<dynmo::v1::Plan> JobMachine::Issue(const Decision& d,
                                                  const std::string& reason,
                                                  absl::Time now, JobEffects* out) {
  wire::Plan issued = d;  // the decision is the plan's layout part
  issued.job = name_;
  issued.apply_iteration = std::max<int64_t>(roster_.newest_iteration(), 0) +
                           options_.plan_lead_iterations;
  issued.reason = reason;
  issued.decided_unix_nanos = absl::ToUnixNanos(now);
  issued.commit_with_prepare = options_.in_band_commit;
  dynmo::v1::Plan plan;
  wire::PlanToProto(issued, &plan);
  if (absl::Status s = Carry(plans_.Issue(std::move(plan), now), now, out); !s.ok()) {
    return s;
  }
  rebalancer_.OnPlanIssued(roster_.newest_iteration());
  return plans_.in_flight()->plan();
}

absl::Status JobMachine::Carry(PlanReady ready, absl::Time now, JobEffects* out) {
  JobEffects switched;
  if (ready.applied.has_value()) {
    SwitchLayout(*ready.applied, now, &switched);
  } else if (ready.rank_layout != nullptr) {
    SetStagesOf(*ready.rank_layout, &layout_);
  }
  if (ready.resumed) {
    roster_.OnResumed();
    rebalancer_.OnResumed();
  }
  if (ready.persist != PlanReady::Persist::kNo) {
    if (absl::Status s = journal_->CommitJob(Record()); !s.ok()) {
      if (ready.persist == PlanReady::Persist::kFirst) {
        // Nothing of `ready` leaves: the lifecycle undoes or aborts it.
        Carry(plans_.Undurable(s, now), now, out).IgnoreError();
        return s;
      }
      rebalancer_.Note(std::string(s.message()));  // "state not persisted (...)"
    }
  }
  out->Append(std::move(ready.effects));
  out->Append(std::move(switched));
  return absl::OkStatus();
}

void JobMachine::Reshape(const dynmo::v1::Reshape& reshape) {
  const int pp = reshape.pipeline_size();
  const int dp = reshape.data_parallel_size();
  // The global batch stays: each of the dp replicas runs its share.
  const int global = layout_.microbatches * roster_.shape().data_parallel_size;
  roster_.Reshape(pp, dp);
  layout_.microbatches = std::max(1, global / dp);
  // The profile is per replica: start it again for the new replicas (each
  // layer's costs arrive with the next reports of its new owners).
  profile_ = core::CostProfile(
      dp, roster_.shape().num_layers,
      core::CostProfileOptions{options_.smoothing, options_.noise_smoothing});
  rebalancer_.Rearm();
}

void JobMachine::SwitchLayout(const dynmo::v1::Plan& plan, absl::Time now,
                              JobEffects* out) {
  std::vector<dynmo::v1::ReleasedGpu> released = roster_.ReleasedBy(plan, now);
  layout_.boundaries.assign(plan.boundaries().begin(), plan.boundaries().end());
  layout_.active_stages.assign(plan.active_stages().begin(),
                               plan.active_stages().end());
  if (plan.has_reshape()) {
    Reshape(plan.reshape());
    Log(options_.plan_event_level, "reshape",
        {{"job", name_},
         {"epoch", plan.epoch()},
         {"pipeline_size", plan.reshape().pipeline_size()},
         {"data_parallel_size", plan.reshape().data_parallel_size()},
         {"copy_bytes", plan.reshape().copy_bytes()}},
        out);
  }
  if (!released.empty()) {
    Log(options_.plan_event_level, "repack",
        {{"job", name_},
         {"epoch", plan.epoch()},
         {"stages", absl::StrJoin(plan.active_stages(), ",")},
         {"gpus_released", released.size()}},
        out);
  }
  // The job record naming them is committed (Carry persists before they
  // leave); the pool commits its own.
  for (auto& gpu : released) out->released.push_back(std::move(gpu));
}

}  // namespace dynmo::service
