#include "coordinator/job/plan_lifecycle.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/job/plan_messages.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;
using Persist = PlanReady::Persist;

const char* OutcomeName(dynmo::v1::PlanOutcome o) {
  switch (o) {
    case dynmo::v1::PLAN_OUTCOME_PREPARING: return "preparing";
    case dynmo::v1::PLAN_OUTCOME_COMMITTED: return "committed";
    case dynmo::v1::PLAN_OUTCOME_APPLIED: return "applied";
    case dynmo::v1::PLAN_OUTCOME_ABORTED: return "aborted";
    default: return "idle";
  }
}

// What the cost model expects the plan to gain in step time.
double PredictedGain(const dynmo::v1::Plan& plan) {
  if (!(plan.previous_bottleneck_s() > 0) || !(plan.predicted_bottleneck_s() > 0)) {
    return 0;
  }
  return plan.previous_bottleneck_s() / plan.predicted_bottleneck_s() - 1;
}

}  // namespace

void PlanReady::Merge(PlanReady later) {
  persist = std::max(persist, later.persist);
  if (later.applied.has_value()) {
    applied = std::move(later.applied);
    rank_layout = nullptr;
  } else if (later.rank_layout != nullptr) {
    applied.reset();
    rank_layout = later.rank_layout;
  }
  epoch_adopted = epoch_adopted || later.epoch_adopted;
  resumed = resumed || later.resumed;
  effects.Append(std::move(later.effects));
}

PlanLifecycle::PlanLifecycle(const PlanLifecycleOptions& options,
                             const RankRoster* roster, const JobLayout* layout,
                             uint64_t epoch)
    : options_(options),
      roster_(roster),
      layout_(layout),
      epoch_(epoch),
      applied_epoch_(epoch) {}

bool PlanLifecycle::Restore(const dynmo::v1::JobRecord& record, absl::Time now) {
  epoch_ = record.epoch();
  applied_epoch_ = record.applied_epoch();
  history_.assign(record.history().begin(), record.history().end());
  TrimHistory();
  for (const dynmo::v1::PlanRecord& h : history_) {
    if (h.realized_samples() <= 0) continue;
    core::RealizedGain g;
    g.gain = h.realized_gain();
    g.spread = h.realized_spread();
    g.model_changed = h.realized_model_changed();
    gains_.Restore(h.predicted_gain(), g);
  }
  in_flight_.reset();
  if (!record.has_in_flight()) return false;
  if (record.in_flight().outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED) {
    in_flight_ = record.in_flight();
    in_flight_since_ = now;
    return false;
  }
  dynmo::v1::PlanRecord aborted = record.in_flight();
  aborted.set_outcome(dynmo::v1::PLAN_OUTCOME_ABORTED);
  aborted.set_detail("coordinator restarted before every rank prepared");
  aborted.set_outcome_unix_ms(absl::ToUnixMillis(now));
  history_.push_back(std::move(aborted));
  return true;
}

void PlanLifecycle::ToRecord(dynmo::v1::JobRecord* record) const {
  record->set_epoch(epoch_);
  record->set_applied_epoch(applied_epoch_);
  for (const auto& h : history_) *record->add_history() = h;
  if (in_flight_) *record->mutable_in_flight() = *in_flight_;
}

const dynmo::v1::PlanRecord* PlanLifecycle::in_flight() const {
  return in_flight_ ? &*in_flight_ : nullptr;
}

const char* PlanLifecycle::StateName() const {
  return in_flight_ ? OutcomeName(in_flight_->outcome()) : "idle";
}

absl::Status PlanLifecycle::CheckIdle() const {
  if (!in_flight_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("plan epoch ", in_flight_->plan().epoch(), " of job ",
                   options_.job, " is still ", StateName()));
}

absl::Status PlanLifecycle::CheckReportEpoch(uint64_t applied_epoch) const {
  if (applied_epoch <= epoch_) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("report ran under epoch ", applied_epoch, " but job ",
                   options_.job, " never issued an epoch beyond ", epoch_));
}

absl::Status PlanLifecycle::CheckAck(int rank, const PlanAck& ack) const {
  if (ack.epoch() > epoch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ack for epoch ", ack.epoch(), " but job ", options_.job,
        " never issued an epoch beyond ", epoch_));
  }
  if (in_flight_ && ack.epoch() == in_flight_->plan().epoch() &&
      ack.state() == PlanAck::APPLIED &&
      in_flight_->outcome() != dynmo::v1::PLAN_OUTCOME_COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " applied epoch ", ack.epoch(),
                     " which was never committed"));
  }
  return absl::OkStatus();
}

PlanReady PlanLifecycle::Issue(dynmo::v1::Plan plan, absl::Time now) {
  retracted_epoch_ = epoch_;
  plan.set_epoch(epoch_ + 1);
  epoch_ = plan.epoch();
  in_flight_.emplace();
  if (plan.commit_with_prepare()) {
    // One phase: the ranks' in-band agreement at the apply iteration is the
    // commit, so the plan is committed as it leaves.
    in_flight_->set_outcome(dynmo::v1::PLAN_OUTCOME_COMMITTED);
    in_flight_->set_committed_unix_nanos(absl::ToUnixNanos(now));
  } else {
    in_flight_->set_outcome(dynmo::v1::PLAN_OUTCOME_PREPARING);
  }
  in_flight_since_ = now;
  prepared_.assign(static_cast<size_t>(roster_->size()), false);
  prepared_count_ = 0;
  participants_ = roster_->CountParticipants(layout_->active_stages);
  in_flight_->set_predicted_gain(PredictedGain(plan));
  *in_flight_->mutable_plan() = std::move(plan);

  // The epoch is durable before any rank can see it.
  PlanReady ready;
  ready.persist = Persist::kFirst;
  pending_ = Pending::kIssue;
  const dynmo::v1::Plan& p = in_flight_->plan();
  CoordinatorMessage prepare;
  *prepare.mutable_prepare() = p;
  const auto [ranks, sessions] =
      SendToParticipants(*roster_, *layout_, prepare, &ready.effects);
  ++ready.effects.plans_issued;
  Log(options_.event_level, "plan_issued",
      {{"job", options_.job},
       {"epoch", p.epoch()},
       {"reason", p.reason()},
       {"boundaries_from", absl::StrJoin(layout_->boundaries, ",")},
       {"boundaries_to", absl::StrJoin(p.boundaries(), ",")},
       {"stages", absl::StrJoin(p.active_stages(), ",")},
       {"apply_iteration", p.apply_iteration()},
       {"migrations", p.migrations_size()},
       {"migration_bytes", p.migration_bytes()},
       {"prepare_ranks", ranks},
       {"prepare_sessions", sessions},
       {"predicted_gain", in_flight_->predicted_gain()}},
      &ready.effects);
  return ready;
}

PlanReady PlanLifecycle::Undurable(const absl::Status& why, absl::Time now) {
  const Pending pending = std::exchange(pending_, Pending::kNone);
  if (pending == Pending::kIssue && in_flight_) {
    // Its PREPARE never left: as if it had never been issued.
    in_flight_.reset();
    epoch_ = retracted_epoch_;
    return {};
  }
  if (pending == Pending::kCommit && in_flight_) {
    // A restart would not know it committed: abort instead.
    return Abort(absl::StrCat("cannot persist the commit: ", why.message()), now);
  }
  return {};
}

PlanReady PlanLifecycle::OnTick(absl::Time now, int64_t newest_iteration) {
  if (!in_flight_ ||
      in_flight_->outcome() != dynmo::v1::PLAN_OUTCOME_PREPARING) {
    return {};
  }
  const int64_t apply = in_flight_->plan().apply_iteration();
  if (now - in_flight_since_ > options_.prepare_timeout) {
    return Abort("not every rank prepared within the prepare timeout", now);
  }
  if (newest_iteration >= apply - 1) {
    return Abort(absl::StrCat("not every rank prepared before iteration ", apply - 1),
                 now);
  }
  return {};
}

PlanReady PlanLifecycle::OnRegistered(const dynmo::v1::RegisterRequest& request,
                                      absl::Time now) {
  // A committed plan survives a coordinator restart; a re-registering rank
  // of an active stage that already switched to it settles the outcome.
  if (!in_flight_ ||
      in_flight_->outcome() != dynmo::v1::PLAN_OUTCOME_COMMITTED ||
      !RankRoster::IsActiveStage(layout_->active_stages, request.pipeline_rank())) {
    return {};
  }
  const uint64_t e = in_flight_->plan().epoch();
  if (request.applied_epoch() >= e) {
    return Apply(absl::StrCat("rank ", request.rank(), " re-registered with the plan applied"),
                 now);
  }
  if (request.pending_epoch() != e) {
    // The rank neither applied nor holds the plan (it restarted): it can
    // never switch, so by the in-band agreement no rank will.
    return Abort(absl::StrCat("rank ", request.rank(), " re-registered without the plan"),
                 now);
  }
  return {};
}

void PlanLifecycle::OnModelChange(int rank, int64_t iteration) {
  if (roster_->Participates(rank, layout_->active_stages)) gains_.NoteModelChange(iteration);
}

PlanReady PlanLifecycle::OnReport(int rank, int64_t iteration,
                                  uint64_t applied_epoch, double iteration_s,
                                  absl::Time now) {
  const bool participates = roster_->Participates(rank, layout_->active_stages);
  if (participates) gains_.AddStep(iteration, iteration_s);
  PlanReady ready = Adopt(rank, applied_epoch, nullptr, now);
  ready.Merge(Realized(gains_.Due()));
  // A committed plan is settled by the first report of its apply iteration
  // from a participant: the ranks agreed in-band, so one rank's epoch
  // speaks for all.
  if (!in_flight_ ||
      in_flight_->outcome() != dynmo::v1::PLAN_OUTCOME_COMMITTED ||
      iteration < in_flight_->plan().apply_iteration() || !participates) {
    return ready;
  }
  if (applied_epoch >= in_flight_->plan().epoch()) {
    ready.Merge(Apply(absl::StrCat("rank ", rank, " ran iteration ", iteration,
                                   " under the plan"),
                      now));
  } else {
    ready.Merge(Abort(absl::StrCat("rank ", rank, " ran iteration ", iteration,
                                   " under epoch ", applied_epoch),
                      now));
  }
  return ready;
}

PlanReady PlanLifecycle::OnAck(int rank, const PlanAck& ack, absl::Time now) {
  // Acks of settled epochs are duplicates or late: idempotent no-ops.
  if (!in_flight_ || ack.epoch() != in_flight_->plan().epoch()) return {};
  const bool committed =
      in_flight_->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED;
  switch (ack.state()) {
    case PlanAck::PREPARED: {
      if (committed) {
        // The rank may have missed the COMMIT: that one again, to it only.
        PlanReady ready;
        const RosterRank& r = roster_->at(rank);
        if (!in_flight_->plan().commit_with_prepare() && r.sink != nullptr) {
          ready.effects.sends.push_back(
              {r.sink, {rank},
               std::make_shared<const CoordinatorMessage>(CommitMessage(in_flight_->plan()))});
        }
        return ready;
      }
      const bool known = rank >= 0 && rank < static_cast<int>(prepared_.size());
      if (known && roster_->Participates(rank, layout_->active_stages) &&
          !prepared_[static_cast<size_t>(rank)]) {
        prepared_[static_cast<size_t>(rank)] = true;
        ++prepared_count_;
      }
      if (prepared_count_ >= participants_) return Commit(now);
      return {};
    }
    case PlanAck::FAILED:
      return Abort(absl::StrCat("rank ", rank, " failed: ", ack.detail()), now);
    case PlanAck::APPLIED:
      if (!committed) return {};  // CheckAck refused it
      return Apply(absl::StrCat("rank ", rank, " applied"), now);
    default:
      return {};  // ValidateAck refused it
  }
}

PlanReady PlanLifecycle::Commit(absl::Time now) {
  in_flight_->set_outcome(dynmo::v1::PLAN_OUTCOME_COMMITTED);
  in_flight_->set_committed_unix_nanos(absl::ToUnixNanos(now));
  PlanReady ready;
  ready.persist = Persist::kFirst;
  pending_ = Pending::kCommit;
  Log(options_.event_level, "plan_committed",
      {{"job", options_.job}, {"epoch", in_flight_->plan().epoch()}}, &ready.effects);
  SendToParticipants(*roster_, *layout_, CommitMessage(in_flight_->plan()), &ready.effects);
  return ready;
}

PlanReady PlanLifecycle::Realized(const std::optional<PlanGains::Measured>& measured) {
  PlanReady ready;
  if (!measured) return ready;
  const PlanGains::Measured& r = *measured;
  const core::RealizedGain* g = &r.realized;
  for (dynmo::v1::PlanRecord& h : history_) {
    if (h.plan().epoch() != r.epoch) continue;
    h.set_realized_before_s(g->before_s);
    h.set_realized_after_s(g->after_s);
    h.set_realized_gain(g->gain);
    h.set_realized_spread(g->spread);
    h.set_realized_samples(g->samples_after);
    h.set_realized_model_changed(g->model_changed);
  }
  ready.persist = Persist::kSettled;
  ready.effects.gains.push_back({r.epoch, r.predicted, g->gain, g->model_changed});
  Log(options_.event_level, "plan_realized",
      {{"job", options_.job},
       {"epoch", r.epoch},
       {"apply_iteration", r.apply_iteration},
       {"predicted_gain", r.predicted},
       {"realized_gain", g->gain},
       {"error", g->gain - r.predicted},
       {"before_s", g->before_s},
       {"after_s", g->after_s},
       {"spread", g->spread},
       {"iterations_before", g->samples_before},
       {"iterations_after", g->samples_after},
       {"model_changed", g->model_changed}},
      &ready.effects);
  return ready;
}

PlanReady PlanLifecycle::Abort(const std::string& why, absl::Time now) {
  const CoordinatorMessage abort = AbortMessage(in_flight_->plan().epoch(), why);
  Finish(dynmo::v1::PLAN_OUTCOME_ABORTED, why, now);
  PlanReady ready;
  ready.persist = Persist::kSettled;
  Log(LogLevel::kWarning, "plan_aborted",
      {{"job", options_.job}, {"epoch", abort.abort().epoch()}, {"reason", why}},
      &ready.effects);
  SendToParticipants(*roster_, *layout_, abort, &ready.effects);
  ++ready.effects.plans_aborted;
  return ready;
}

PlanReady PlanLifecycle::Apply(const std::string& why, absl::Time now) {
  dynmo::v1::Plan plan = in_flight_->plan();
  applied_epoch_ = plan.epoch();
  // The plan applied before is measured with what this one leaves it.
  PlanReady ready = Realized(
      gains_.Follow(plan.epoch(), plan.apply_iteration(), in_flight_->predicted_gain()));
  Finish(dynmo::v1::PLAN_OUTCOME_APPLIED, why, now);
  ready.persist = Persist::kSettled;
  Switch(std::move(plan), why, &ready);
  return ready;
}

PlanReady PlanLifecycle::OnAttach(const std::shared_ptr<SessionSink>& sink,
                                  absl::Span<const int> ranks) const {
  PlanReady ready;
  SendMissed(*roster_, *layout_, in_flight(), history_, epoch_, sink, ranks, &ready.effects);
  return ready;
}

void PlanLifecycle::Switch(dynmo::v1::Plan plan, const std::string& why,
                           PlanReady* ready) const {
  Log(options_.event_level, "plan_applied",
      {{"job", options_.job},
       {"epoch", plan.epoch()},
       {"apply_iteration", plan.apply_iteration()},
       {"reason", why},
       {"boundaries", absl::StrJoin(plan.boundaries(), ",")},
       {"stages", absl::StrJoin(plan.active_stages(), ",")}},
      &ready->effects);
  ++ready->effects.plans_applied;
  ready->effects.migrated_bytes += static_cast<double>(plan.migration_bytes());
  ready->applied = std::move(plan);
}

void PlanLifecycle::Log(LogLevel level, std::string name, std::vector<LogField> fields,
                        JobEffects* out) const {
  out->events.push_back(JobEvent{level, std::move(name), std::move(fields)});
}

void PlanLifecycle::Finish(dynmo::v1::PlanOutcome outcome,
                           const std::string& detail, absl::Time now) {
  dynmo::v1::PlanRecord rec = *std::move(in_flight_);
  in_flight_.reset();
  rec.set_outcome(outcome);
  rec.set_detail(detail);
  rec.set_outcome_unix_ms(absl::ToUnixMillis(now));
  history_.push_back(std::move(rec));
  TrimHistory();
  prepared_.assign(prepared_.size(), false);
  prepared_count_ = 0;
}

void PlanLifecycle::TrimHistory() {
  while (static_cast<int>(history_.size()) > options_.history_limit) {
    history_.pop_front();
  }
}

}  // namespace dynmo::service
