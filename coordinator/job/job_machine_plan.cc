// JobMachine's plan effects: what the job does when its plan protocol
// (plan_protocol.h) asks for a step — issue a PREPARE, commit, abort, apply
// a plan to the layout and release GPUs — and the fan-out of plan messages
// to the sessions of the participating ranks. The protocol decides; these
// carry it out: persist first (an epoch is durable before any rank sees
// it), then add the messages to the effects (sent by the caller after).
//
// Part of JobMachine (job_machine.h).
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/job/job_machine.h"

namespace dynmo::service {

using dynmo::v1::CoordinatorMessage;

std::pair<int, int> JobMachine::SendToParticipants(const CoordinatorMessage& m,
                                                   JobEffects* out) {
  auto shared = std::make_shared<const CoordinatorMessage>(m);
  int ranks = 0, sessions = 0;
  for (SessionRanks& s : roster_.ParticipantSessions(layout_.active_stages)) {
    ranks += static_cast<int>(s.ranks.size());
    ++sessions;
    out->sends.push_back({std::move(s.sink), std::move(s.ranks), shared});
  }
  return {ranks, sessions};
}

void JobMachine::ResendInFlight(const std::shared_ptr<SessionSink>& sink,
                                absl::Span<const int> ranks, JobEffects* out) {
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
    out->sends.push_back({sink, to, std::make_shared<const CoordinatorMessage>(m)});
  }
}

void JobMachine::RunStep(const PlanStep& step, absl::Time now, JobEffects* out) {
  switch (step.kind) {
    case PlanStep::Kind::kCommit: return Commit(now, out);
    case PlanStep::Kind::kAbort: return Abort(step.why, now, out);
    case PlanStep::Kind::kApply: return Apply(step.why, now, out);
    default: return;  // kNone; kResendCommit is the ack's (ApplyAck)
  }
}

absl::StatusOr<dynmo::v1::Plan> JobMachine::Issue(const Decision& d,
                                                  const std::string& reason,
                                                  absl::Time now, JobEffects* out) {
  wire::Plan issued = d;  // the decision is the plan's layout part
  issued.job = name_;
  issued.apply_iteration = std::max<int64_t>(rebalancer_.newest_iteration(), 0) +
                           options_.plan_lead_iterations;
  issued.reason = reason;
  issued.decided_unix_nanos = absl::ToUnixNanos(now);
  issued.commit_with_prepare = options_.in_band_commit;
  dynmo::v1::Plan plan;
  wire::PlanToProto(issued, &plan);
  const CoordinatorMessage prepare = protocol_.Issue(
      std::move(plan), roster_.CountParticipants(layout_.active_stages), now);
  // The epoch is durable before any rank can see it.
  if (absl::Status s = Persist(); !s.ok()) {
    protocol_.Retract();
    return s;
  }
  ++out->plans_issued;
  rebalancer_.OnPlanIssued();
  const dynmo::v1::Plan& p = prepare.prepare();
  const auto [ranks, sessions] = SendToParticipants(prepare, out);
  Log(options_.plan_event_level, "plan_issued",
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
            {"prepare_sessions", sessions}},
      out);
  return prepare.prepare();
}

void JobMachine::Commit(absl::Time now, JobEffects* out) {
  const CoordinatorMessage commit = protocol_.Commit(now);
  if (absl::Status s = Persist(); !s.ok()) {
    // Not durable: a restart would not know it committed. Abort instead.
    Abort(absl::StrCat("cannot persist the commit: ", s.message()), now, out);
    return;
  }
  Log(options_.plan_event_level, "plan_committed",
      {{"job", name_}, {"epoch", commit.commit().epoch()}}, out);
  SendToParticipants(commit, out);
}

void JobMachine::Abort(const std::string& why, absl::Time now, JobEffects* out) {
  const CoordinatorMessage abort = protocol_.Abort(why, now);
  PersistSettled();
  Log(LogLevel::kWarning, "plan_aborted",
      {{"job", name_}, {"epoch", abort.abort().epoch()}, {"reason", why}}, out);
  SendToParticipants(abort, out);
  ++out->plans_aborted;
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

void JobMachine::Apply(const std::string& why, absl::Time now, JobEffects* out) {
  SwitchLayout(protocol_.Apply(why, now), why, now, out);
}

void JobMachine::AdoptApplied(int rank, uint64_t epoch,
                              const dynmo::v1::RegisterRequest* registered,
                              absl::Time now, JobEffects* out) {
  if (epoch <= protocol_.applied_epoch()) return;
  if (const dynmo::v1::PlanRecord* flying = protocol_.in_flight(); flying != nullptr) {
    if (flying->plan().epoch() == epoch) {
      // Committed: the rank's switch settles it. Preparing: no rank can
      // have switched (two-phase), so the claim is ignored.
      if (flying->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED) {
        Apply(absl::StrCat("rank ", rank, " runs under it"), now, out);
      }
      return;
    }
    // Planned from a layout the ranks have left.
    Abort(absl::StrCat("rank ", rank, " runs under epoch ", epoch,
                       ", newer than the applied ", protocol_.applied_epoch()),
          now, out);
  }
  const uint64_t recorded = protocol_.applied_epoch();
  const std::string why =
      absl::StrCat("rank ", rank, " runs under it (the coordinator had applied ", recorded, ")");
  const std::optional<dynmo::v1::Plan> plan = protocol_.AdoptApplied(epoch, why, now);
  const char* layout = "unchanged (no record of the plan)";
  if (plan.has_value()) {
    layout = "the plan's";
    SwitchLayout(*plan, why, now, out);
  } else if (registered != nullptr && registered->boundaries_size() > 0) {
    layout = "the rank's";
    SetStages({registered->active_stages().begin(), registered->active_stages().end()},
              {registered->boundaries().begin(), registered->boundaries().end()},
              registered->pipeline_size(), registered->num_layers(), &layout_);
    PersistSettled();
  } else {
    PersistSettled();
  }
  Log(LogLevel::kWarning, "epoch_adopted",
      {{"job", name_}, {"rank", rank}, {"epoch", epoch},
       {"recorded_epoch", recorded}, {"layout", layout}},
      out);
}

void JobMachine::SwitchLayout(const dynmo::v1::Plan& plan, const std::string& why,
                              absl::Time now, JobEffects* out) {
  std::vector<dynmo::v1::ReleasedGpu> released = roster_.ReleasedBy(plan, now);
  layout_.boundaries.assign(plan.boundaries().begin(), plan.boundaries().end());
  layout_.active_stages.assign(plan.active_stages().begin(),
                               plan.active_stages().end());
  if (plan.has_reshape()) Reshape(plan.reshape());
  PersistSettled();
  Log(options_.plan_event_level, "plan_applied",
           {{"job", name_},
            {"epoch", plan.epoch()},
            {"apply_iteration", plan.apply_iteration()},
            {"reason", why},
            {"boundaries", absl::StrJoin(plan.boundaries(), ",")},
            {"stages", absl::StrJoin(plan.active_stages(), ",")}},
      out);
  if (plan.has_reshape()) {
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
  ++out->plans_applied;
  out->migrated_bytes += static_cast<double>(plan.migration_bytes());
  // The job record naming them is committed; the pool commits its own.
  for (auto& gpu : released) out->released.push_back(std::move(gpu));
}

}  // namespace dynmo::service
