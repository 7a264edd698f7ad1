// JobState's plan effects: what the job does when its plan protocol
// (plan_protocol.h) asks for a step — issue a PREPARE, commit, abort, apply
// a plan to the layout and release GPUs — and the fan-out of plan messages
// to the sessions of the participating ranks. The protocol decides; these
// carry it out: persist first (an epoch is durable before any rank sees
// it), then queue the messages (sent after the job's lock is released).
//
// Part of JobState (job_state.h); every function runs under the job's lock.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/service/job_state.h"
#include "coordinator/service/plan_convert.h"

namespace dynmo::service {

using dynmo::v1::CoordinatorMessage;

std::pair<int, int> JobState::SendToParticipants(const CoordinatorMessage& m) {
  auto shared = std::make_shared<const CoordinatorMessage>(m);
  int ranks = 0, sessions = 0;
  for (SessionRanks& s : roster_.ParticipantSessions(layout_.active_stages)) {
    ranks += static_cast<int>(s.ranks.size());
    ++sessions;
    outbox_.Queue(std::move(s.sink), std::move(s.ranks), shared);
  }
  return {ranks, sessions};
}

void JobState::ResendInFlight(const std::shared_ptr<SessionSink>& sink,
                              absl::Span<const int> ranks) {
  if (sink == nullptr || ranks.empty()) return;
  const PlanProtocol::Missed missed = protocol_.MissedMessages();
  std::vector<int> to;
  for (int rank : ranks) {
    if (!missed.active_ranks_only ||
        RankRoster::IsActiveStage(layout_.active_stages, roster_.at(rank).pipeline_rank)) {
      to.push_back(rank);
    }
  }
  if (to.empty()) return;
  for (const CoordinatorMessage& m : missed.messages) {
    outbox_.Queue(sink, to, std::make_shared<const CoordinatorMessage>(m));
  }
}

void JobState::RunStepLocked(const PlanStep& step) {
  switch (step.kind) {
    case PlanStep::Kind::kCommit: return CommitLocked();
    case PlanStep::Kind::kAbort: return AbortLocked(step.why);
    case PlanStep::Kind::kApply: return ApplyLocked(step.why);
    default: return;  // kNone; kResendCommit is the ack's (ApplyAckLocked)
  }
}

absl::StatusOr<dynmo::v1::Plan> JobState::IssueLocked(
    const Decision& d, const std::string& reason, absl::Time now) {
  dynmo::v1::Plan plan;
  plan.set_job(name_);
  plan.set_apply_iteration(std::max<int64_t>(rebalancer_.newest_iteration(), 0) +
                           options_.plan_lead_iterations);
  SetPlanLayout(d, &plan);
  plan.set_reason(reason);
  plan.set_decided_unix_nanos(absl::ToUnixNanos(now));
  plan.set_commit_with_prepare(options_.in_band_commit);
  const CoordinatorMessage prepare = protocol_.Issue(
      std::move(plan), roster_.CountParticipants(layout_.active_stages), now);
  // The epoch is durable before any rank can see it.
  if (absl::Status s = PersistLocked(); !s.ok()) {
    protocol_.Retract();
    return s;
  }
  if (metrics_ != nullptr) metrics_->PlanIssued();
  rebalancer_.OnPlanIssued();
  const dynmo::v1::Plan& p = prepare.prepare();
  const auto [ranks, sessions] = SendToParticipants(prepare);
  LogEvent(options_.plan_event_level, "plan_issued",
           {{"job", name_},
            {"epoch", p.epoch()},
            {"reason", reason},
            {"boundaries_from", absl::StrJoin(layout_.boundaries, ",")},
            {"boundaries_to", absl::StrJoin(p.boundaries(), ",")},
            {"stages", absl::StrJoin(p.active_stages(), ",")},
            {"apply_iteration", p.apply_iteration()},
            {"migrations", p.migrations_size()},
            {"migration_bytes", p.migration_bytes()},
            {"prepare_ranks", ranks},
            {"prepare_sessions", sessions}});
  return prepare.prepare();
}

void JobState::CommitLocked() {
  const CoordinatorMessage commit = protocol_.Commit(absl::Now());
  if (absl::Status s = PersistLocked(); !s.ok()) {
    // Not durable: a restart would not know it committed. Abort instead.
    AbortLocked(absl::StrCat("cannot persist the commit: ", s.message()));
    return;
  }
  LogEvent(options_.plan_event_level, "plan_committed",
           {{"job", name_}, {"epoch", commit.commit().epoch()}});
  SendToParticipants(commit);
}

void JobState::AbortLocked(const std::string& why) {
  const CoordinatorMessage abort = protocol_.Abort(why, absl::Now());
  PersistSettledLocked();
  LogEvent(LogLevel::kWarning, "plan_aborted",
           {{"job", name_}, {"epoch", abort.abort().epoch()}, {"reason", why}});
  SendToParticipants(abort);
  if (metrics_ != nullptr) metrics_->PlanAborted();
}

void JobState::ReshapeLocked(const dynmo::v1::Reshape& reshape) {
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

void JobState::ApplyLocked(const std::string& why) {
  SwitchLayoutLocked(protocol_.Apply(why, absl::Now()), why);
}

void JobState::AdoptAppliedLocked(int rank, uint64_t epoch,
                                  const dynmo::v1::RegisterRequest* registered) {
  if (epoch <= protocol_.applied_epoch()) return;
  if (const dynmo::v1::PlanRecord* flying = protocol_.in_flight(); flying != nullptr) {
    if (flying->plan().epoch() == epoch) {
      // Committed: the rank's switch settles it. Preparing: no rank can
      // have switched (two-phase), so the claim is ignored.
      if (flying->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED) {
        ApplyLocked(absl::StrCat("rank ", rank, " runs under it"));
      }
      return;
    }
    // Planned from a layout the ranks have left.
    AbortLocked(absl::StrCat("rank ", rank, " runs under epoch ", epoch,
                             ", newer than the applied ", protocol_.applied_epoch()));
  }
  const uint64_t recorded = protocol_.applied_epoch();
  const std::string why =
      absl::StrCat("rank ", rank, " runs under it (the coordinator had applied ", recorded, ")");
  const std::optional<dynmo::v1::Plan> plan = protocol_.AdoptApplied(epoch, why, absl::Now());
  const char* layout = "unchanged (no record of the plan)";
  if (plan.has_value()) {
    layout = "the plan's";
    SwitchLayoutLocked(*plan, why);
  } else if (registered != nullptr && registered->boundaries_size() > 0) {
    layout = "the rank's";
    SetStages({registered->active_stages().begin(), registered->active_stages().end()},
              {registered->boundaries().begin(), registered->boundaries().end()},
              registered->pipeline_size(), registered->num_layers(), &layout_);
    PersistSettledLocked();
  } else {
    PersistSettledLocked();
  }
  LogEvent(LogLevel::kWarning, "epoch_adopted",
           {{"job", name_}, {"rank", rank}, {"epoch", epoch},
            {"recorded_epoch", recorded}, {"layout", layout}});
}

void JobState::SwitchLayoutLocked(const dynmo::v1::Plan& plan, const std::string& why) {
  const absl::Time now = absl::Now();
  std::vector<dynmo::v1::ReleasedGpu> released = roster_.ReleasedBy(plan, now);
  layout_.boundaries.assign(plan.boundaries().begin(), plan.boundaries().end());
  layout_.active_stages.assign(plan.active_stages().begin(),
                               plan.active_stages().end());
  if (plan.has_reshape()) ReshapeLocked(plan.reshape());
  PersistSettledLocked();
  LogEvent(options_.plan_event_level, "plan_applied",
           {{"job", name_},
            {"epoch", plan.epoch()},
            {"apply_iteration", plan.apply_iteration()},
            {"reason", why},
            {"boundaries", absl::StrJoin(plan.boundaries(), ",")},
            {"stages", absl::StrJoin(plan.active_stages(), ",")}});
  if (plan.has_reshape()) {
    LogEvent(options_.plan_event_level, "reshape",
             {{"job", name_},
              {"epoch", plan.epoch()},
              {"pipeline_size", plan.reshape().pipeline_size()},
              {"data_parallel_size", plan.reshape().data_parallel_size()},
              {"copy_bytes", plan.reshape().copy_bytes()}});
  }
  if (!released.empty()) {
    LogEvent(options_.plan_event_level, "repack",
             {{"job", name_},
              {"epoch", plan.epoch()},
              {"stages", absl::StrJoin(plan.active_stages(), ",")},
              {"gpus_released", released.size()}});
  }
  if (metrics_ != nullptr) {
    metrics_->PlanApplied();
    metrics_->Migrated(static_cast<double>(plan.migration_bytes()));
  }
  if (released.empty()) return;
  // The job record is committed; the pool commits its own record.
  if (absl::Status s = deps_.pool->Add(std::move(released)); !s.ok()) {
    rebalancer_.Note(absl::StrCat("released GPUs not persisted: ", s.message()));
  }
}

}  // namespace dynmo::service
