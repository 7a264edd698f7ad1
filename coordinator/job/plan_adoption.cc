// PlanLifecycle's adoptions (plan_lifecycle.h): the ranks run something
// the coordinator did not settle — an epoch newer than any it applied (a
// state dir lost or older than the ranks, a plan it aborted while the ranks
// had agreed to switch) or, back from a checkpoint, a layout older than the
// applied plan. The ranks are right: their epoch or layout becomes the
// job's, never silently.
//
// Part of PlanLifecycle.
#include <string>
#include <utility>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/job/plan_lifecycle.h"

namespace dynmo::service {

using Persist = PlanReady::Persist;

PlanReady PlanLifecycle::OnRegistering(const dynmo::v1::RegisterRequest& request,
                                       absl::Time now) {
  if (request.applied_epoch() <= epoch_) {
    if (request.applied_epoch() < applied_epoch_ &&
        request.pending_epoch() < applied_epoch_ && request.boundaries_size() > 0) {
      return AdoptResumed(request, now);
    }
    return Adopt(request.rank(), request.applied_epoch(), &request, now);
  }
  // Newer than any issued here: the state dir was lost or is older than
  // the ranks. Adopt the rank's epoch and layout so that the next plan is
  // newer than anything applied.
  PlanReady ready;
  ready.epoch_adopted = true;
  const uint64_t recorded = epoch_;
  epoch_ = request.applied_epoch();
  applied_epoch_ = request.applied_epoch();
  if (request.boundaries_size() > 0) ready.rank_layout = &request;
  LogEpochAdopted(request.rank(), request.applied_epoch(), recorded,
                  request.boundaries_size() > 0 ? "the rank's" : "unchanged", &ready);
  return ready;
}

PlanReady PlanLifecycle::Adopt(int rank, uint64_t epoch,
                               const dynmo::v1::RegisterRequest* registered,
                               absl::Time now) {
  if (epoch <= applied_epoch_) return {};
  PlanReady ready;
  if (in_flight_) {
    if (in_flight_->plan().epoch() == epoch) {
      // Committed: the rank's switch settles it. Preparing: no rank can
      // have switched (two-phase), so the claim is ignored.
      if (in_flight_->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED) {
        return Apply(absl::StrCat("rank ", rank, " runs under it"), now);
      }
      return {};
    }
    // Planned from a layout the ranks have left.
    ready = Abort(absl::StrCat("rank ", rank, " runs under epoch ", epoch,
                               ", newer than the applied ", applied_epoch_),
                  now);
  }
  // The ranks run under an epoch the coordinator settled otherwise
  // (aborted it while they had agreed to switch) or lost that it was
  // applied: the ranks are right.
  const uint64_t recorded = applied_epoch_;
  const std::string why = absl::StrCat("rank ", rank, " runs under it (the coordinator had applied ",
                                       recorded, ")");
  applied_epoch_ = epoch;
  PlanReady adopted;
  adopted.persist = Persist::kSettled;
  const char* layout = "unchanged (no record of the plan)";
  for (dynmo::v1::PlanRecord& h : history_) {
    if (h.plan().epoch() != epoch) continue;
    h.set_outcome(dynmo::v1::PLAN_OUTCOME_APPLIED);
    h.set_detail(why);
    h.set_outcome_unix_ms(absl::ToUnixMillis(now));
    layout = "the plan's";
    Switch(h.plan(), why, &adopted);
    break;
  }
  if (!adopted.applied && registered != nullptr && registered->boundaries_size() > 0) {
    layout = "the rank's";
    adopted.rank_layout = registered;
  }
  LogEpochAdopted(rank, epoch, recorded, layout, &adopted);
  ready.Merge(std::move(adopted));
  return ready;
}

PlanReady PlanLifecycle::AdoptResumed(const dynmo::v1::RegisterRequest& request,
                                      absl::Time now) {
  JobLayout named = *layout_;
  SetStagesOf(request, &named);
  if (named.active_stages == layout_->active_stages &&
      named.boundaries == layout_->boundaries) {
    return {};
  }
  PlanReady ready;
  if (in_flight_) {
    // Planned from a layout the ranks have left.
    ready = Abort(absl::StrCat("rank ", request.rank(),
                               " restarted from older state at another layout"),
                  now);
  }
  PlanReady adopted;
  adopted.persist = Persist::kSettled;
  adopted.rank_layout = &request;
  adopted.resumed = true;
  // Step times from before the restart say nothing about the layout now.
  gains_.Forget();
  Log(LogLevel::kWarning, "layout_adopted",
      {{"job", options_.job},
       {"rank", request.rank()},
       {"epoch", request.applied_epoch()},
       {"recorded_epoch", applied_epoch_},
       {"boundaries_from", absl::StrJoin(layout_->boundaries, ",")},
       {"boundaries_to", absl::StrJoin(named.boundaries, ",")},
       {"stages", absl::StrJoin(named.active_stages, ",")},
       {"reason", "the rank restarted from older state (a checkpoint) and runs this layout"}},
      &adopted.effects);
  ready.Merge(std::move(adopted));
  return ready;
}

void PlanLifecycle::LogEpochAdopted(int rank, uint64_t epoch, uint64_t recorded,
                                    const char* layout, PlanReady* ready) const {
  Log(LogLevel::kWarning, "epoch_adopted",
      {{"job", options_.job}, {"rank", rank}, {"epoch", epoch},
       {"recorded_epoch", recorded}, {"layout", layout}},
      &ready->effects);
}

}  // namespace dynmo::service
