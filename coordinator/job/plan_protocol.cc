#include "coordinator/job/plan_protocol.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

const char* OutcomeName(dynmo::v1::PlanOutcome o) {
  switch (o) {
    case dynmo::v1::PLAN_OUTCOME_PREPARING: return "preparing";
    case dynmo::v1::PLAN_OUTCOME_COMMITTED: return "committed";
    case dynmo::v1::PLAN_OUTCOME_APPLIED: return "applied";
    case dynmo::v1::PLAN_OUTCOME_ABORTED: return "aborted";
    default: return "idle";
  }
}

PlanStep Step(PlanStep::Kind kind, std::string why = "") {
  return PlanStep{kind, std::move(why)};
}

}  // namespace

PlanProtocol::PlanProtocol(const PlanProtocolOptions& options, int num_ranks,
                           uint64_t epoch)
    : options_(options),
      epoch_(epoch),
      applied_epoch_(epoch),
      prepared_(static_cast<size_t>(num_ranks > 0 ? num_ranks : 0), false) {}

bool PlanProtocol::Restore(const dynmo::v1::JobRecord& record, absl::Time now) {
  epoch_ = record.epoch();
  applied_epoch_ = record.applied_epoch();
  history_.assign(record.history().begin(), record.history().end());
  TrimHistory();
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

void PlanProtocol::ToRecord(dynmo::v1::JobRecord* record) const {
  record->set_epoch(epoch_);
  record->set_applied_epoch(applied_epoch_);
  for (const auto& h : history_) *record->add_history() = h;
  if (in_flight_) *record->mutable_in_flight() = *in_flight_;
}

void PlanProtocol::AdoptEpoch(uint64_t epoch) {
  epoch_ = epoch;
  applied_epoch_ = epoch;
}

std::optional<dynmo::v1::Plan> PlanProtocol::AdoptApplied(uint64_t epoch,
                                                          const std::string& why,
                                                          absl::Time now) {
  applied_epoch_ = std::max(applied_epoch_, epoch);
  for (dynmo::v1::PlanRecord& h : history_) {
    if (h.plan().epoch() != epoch) continue;
    h.set_outcome(dynmo::v1::PLAN_OUTCOME_APPLIED);
    h.set_detail(why);
    h.set_outcome_unix_ms(absl::ToUnixMillis(now));
    return h.plan();
  }
  return std::nullopt;
}

const dynmo::v1::PlanRecord* PlanProtocol::in_flight() const {
  return in_flight_ ? &*in_flight_ : nullptr;
}

const char* PlanProtocol::StateName() const {
  return in_flight_ ? OutcomeName(in_flight_->outcome()) : "idle";
}

absl::Status PlanProtocol::CheckIdle() const {
  if (!in_flight_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("plan epoch ", in_flight_->plan().epoch(), " of job ",
                   options_.job, " is still ", StateName()));
}

absl::Status PlanProtocol::CheckReportEpoch(uint64_t applied_epoch) const {
  if (applied_epoch <= epoch_) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("report ran under epoch ", applied_epoch, " but job ",
                   options_.job, " never issued an epoch beyond ", epoch_));
}

absl::Status PlanProtocol::CheckAck(int rank, const PlanAck& ack) const {
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

CoordinatorMessage PlanProtocol::Issue(dynmo::v1::Plan plan, int participants,
                                       absl::Time now) {
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
  prepared_.assign(prepared_.size(), false);
  prepared_count_ = 0;
  participants_ = participants;
  CoordinatorMessage m;
  *m.mutable_prepare() = plan;
  *in_flight_->mutable_plan() = std::move(plan);
  return m;
}

void PlanProtocol::Retract() {
  in_flight_.reset();
  epoch_ = retracted_epoch_;
}

PlanStep PlanProtocol::OnTick(absl::Time now, int64_t newest_iteration) const {
  if (!in_flight_ ||
      in_flight_->outcome() != dynmo::v1::PLAN_OUTCOME_PREPARING) {
    return {};
  }
  const int64_t apply = in_flight_->plan().apply_iteration();
  if (now - in_flight_since_ > options_.prepare_timeout) {
    return Step(PlanStep::Kind::kAbort,
                "not every rank prepared within the prepare timeout");
  }
  if (newest_iteration >= apply - 1) {
    return Step(PlanStep::Kind::kAbort,
                absl::StrCat("not every rank prepared before iteration ",
                             apply - 1));
  }
  return {};
}

PlanStep PlanProtocol::OnRegister(int rank, uint64_t applied_epoch,
                                  uint64_t pending_epoch) const {
  // A committed plan survives a coordinator restart; a re-registering rank
  // that already switched to it settles the outcome.
  if (!in_flight_ ||
      in_flight_->outcome() != dynmo::v1::PLAN_OUTCOME_COMMITTED) {
    return {};
  }
  const uint64_t e = in_flight_->plan().epoch();
  if (applied_epoch >= e) {
    return Step(PlanStep::Kind::kApply,
                absl::StrCat("rank ", rank, " re-registered with the plan applied"));
  }
  if (pending_epoch != e) {
    // The rank neither applied nor holds the plan (it restarted): it can
    // never switch, so by the in-band agreement no rank will.
    return Step(PlanStep::Kind::kAbort,
                absl::StrCat("rank ", rank, " re-registered without the plan"));
  }
  return {};
}

PlanStep PlanProtocol::OnReport(int rank, int64_t iteration,
                                uint64_t applied_epoch) const {
  // A committed plan is settled by the first report of its apply iteration:
  // the ranks agreed in-band, so one rank's epoch speaks for all.
  if (!in_flight_ ||
      in_flight_->outcome() != dynmo::v1::PLAN_OUTCOME_COMMITTED ||
      iteration < in_flight_->plan().apply_iteration()) {
    return {};
  }
  if (applied_epoch >= in_flight_->plan().epoch()) {
    return Step(PlanStep::Kind::kApply,
                absl::StrCat("rank ", rank, " ran iteration ", iteration,
                             " under the plan"));
  }
  return Step(PlanStep::Kind::kAbort,
              absl::StrCat("rank ", rank, " ran iteration ", iteration,
                           " under epoch ", applied_epoch));
}

PlanStep PlanProtocol::OnAck(int rank, bool participates, const PlanAck& ack) {
  // Acks of settled epochs are duplicates or late: idempotent no-ops.
  if (!in_flight_ || ack.epoch() != in_flight_->plan().epoch()) return {};
  const bool committed =
      in_flight_->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED;
  switch (ack.state()) {
    case PlanAck::PREPARED: {
      if (committed) {
        // The rank may have missed the COMMIT.
        if (in_flight_->plan().commit_with_prepare()) return {};
        return Step(PlanStep::Kind::kResendCommit);
      }
      const bool known = rank >= 0 && rank < static_cast<int>(prepared_.size());
      if (known && participates && !prepared_[static_cast<size_t>(rank)]) {
        prepared_[static_cast<size_t>(rank)] = true;
        ++prepared_count_;
      }
      if (prepared_count_ >= participants_) return Step(PlanStep::Kind::kCommit);
      return {};
    }
    case PlanAck::FAILED:
      return Step(PlanStep::Kind::kAbort,
                  absl::StrCat("rank ", rank, " failed: ", ack.detail()));
    case PlanAck::APPLIED:
      if (!committed) return {};  // CheckAck refused it
      return Step(PlanStep::Kind::kApply, absl::StrCat("rank ", rank, " applied"));
    default:
      return {};  // ValidateAck refused it
  }
}

CoordinatorMessage PlanProtocol::Commit(absl::Time now) {
  in_flight_->set_outcome(dynmo::v1::PLAN_OUTCOME_COMMITTED);
  in_flight_->set_committed_unix_nanos(absl::ToUnixNanos(now));
  return CommitMessage();
}

CoordinatorMessage PlanProtocol::CommitMessage() const {
  CoordinatorMessage m;
  m.mutable_commit()->set_epoch(in_flight_->plan().epoch());
  m.mutable_commit()->set_apply_iteration(in_flight_->plan().apply_iteration());
  return m;
}

CoordinatorMessage PlanProtocol::Abort(const std::string& why, absl::Time now) {
  CoordinatorMessage m;
  m.mutable_abort()->set_epoch(in_flight_->plan().epoch());
  m.mutable_abort()->set_reason(why);
  Finish(dynmo::v1::PLAN_OUTCOME_ABORTED, why, now);
  return m;
}

dynmo::v1::Plan PlanProtocol::Apply(const std::string& why, absl::Time now) {
  dynmo::v1::Plan plan = in_flight_->plan();
  applied_epoch_ = plan.epoch();
  Finish(dynmo::v1::PLAN_OUTCOME_APPLIED, why, now);
  return plan;
}

void PlanProtocol::Finish(dynmo::v1::PlanOutcome outcome,
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

void PlanProtocol::TrimHistory() {
  while (static_cast<int>(history_.size()) > options_.history_limit) {
    history_.pop_front();
  }
}

PlanProtocol::Missed PlanProtocol::MissedMessages() const {
  Missed missed;
  if (!in_flight_) {
    if (!history_.empty() && history_.back().plan().epoch() == epoch_ &&
        history_.back().outcome() == dynmo::v1::PLAN_OUTCOME_ABORTED) {
      CoordinatorMessage m;
      m.mutable_abort()->set_epoch(epoch_);
      m.mutable_abort()->set_reason(history_.back().detail());
      missed.messages.push_back(std::move(m));
    }
    return missed;
  }
  missed.active_ranks_only = true;
  CoordinatorMessage m;
  *m.mutable_prepare() = in_flight_->plan();
  missed.messages.push_back(std::move(m));
  if (in_flight_->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED &&
      !in_flight_->plan().commit_with_prepare()) {
    missed.messages.push_back(CommitMessage());
  }
  return missed;
}

}  // namespace dynmo::service
