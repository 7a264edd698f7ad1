#include "coordinator/job/upstream_checks.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/job/validation.h"
#include "wire/report_codec.h"

namespace dynmo::service {
namespace {

// INVALID_ARGUMENT for a report, run under the layout in force, that times
// a layer the rank's stage does not hold.
absl::Status CheckReportedLayers(const RankRoster& roster, const JobLayout& layout,
                                 uint64_t applied_epoch, int rank,
                                 const dynmo::v1::IterationReport& report) {
  // Under another epoch (a plan being applied, a restart being reconciled)
  // the rank may hold another stage's layers: only the layout in force is
  // checked.
  if (report.applied_epoch() != applied_epoch || report.layers_size() == 0) {
    return absl::OkStatus();
  }
  const int stage = roster.at(rank).pipeline_rank;
  const std::vector<int>& active = layout.active_stages;
  const auto it = std::find(active.begin(), active.end(), stage);
  int first = 0, end = 0;  // a released stage holds no layer
  if (it != active.end()) {
    const size_t i = static_cast<size_t>(it - active.begin());
    if (i + 1 < layout.boundaries.size()) {
      first = layout.boundaries[i];
      end = layout.boundaries[i + 1];
    }
  }
  for (const auto& l : report.layers()) {
    if (l.layer() < first || l.layer() >= end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " (stage ", stage, ") reported layer ", l.layer(),
          ", which its stage does not hold under epoch ", applied_epoch,
          " (layers [", first, ", ", end, "))"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckUpstream(const JobParts& job, const UpstreamMessage& m,
                           int64_t iteration_window, std::vector<core::LayerCost>* layers) {
  const RankRoster& roster_ = job.roster;
  const PlanLifecycle& plans_ = job.plans;
  const std::string& name_ = roster_.shape().job;
  if (!roster_.Contains(m.rank)) {
    return absl::NotFoundError(absl::StrCat("job ", name_, " has no rank ", m.rank));
  }
  if (m.report != nullptr) {
    absl::StatusOr<std::vector<core::LayerCost>> read =
        wire::ReadReport(*m.report, roster_.shape().num_layers);
    if (!read.ok()) return read.status();
    *layers = *std::move(read);
    if (absl::Status s = CheckIteration(job, m.report->iteration(), iteration_window);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = plans_.CheckReportEpoch(m.report->applied_epoch()); !s.ok()) {
      return s;
    }
    return CheckReportedLayers(roster_, job.layout, plans_.applied_epoch(), m.rank,
                               *m.report);
  }
  if (m.ack != nullptr) {
    if (absl::Status s = ValidateAck(*m.ack); !s.ok()) return s;
    if (absl::Status s = CheckIteration(job, m.ack->iteration(), iteration_window);
        !s.ok()) {
      return s;
    }
    return plans_.CheckAck(m.rank, *m.ack);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("empty message for rank ", m.rank, " (neither report nor ack)"));
}

absl::Status CheckIteration(const JobParts& job, int64_t iteration,
                            int64_t iteration_window) {
  const int64_t newest = job.roster.reported_iteration();
  // Both are validated to [0, 2^53], so the sum cannot overflow.
  if (newest < 0 || iteration <= newest + iteration_window) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "iteration ", iteration, " is more than ", iteration_window, " beyond job ",
      job.roster.shape().job, "'s newest iteration ", newest, " (--iteration_window)"));
}

namespace {

// A rank may run only an epoch the job issued. One newer than every epoch
// issued is taken only by a job that never planned and has no other rank
// registered: a coordinator whose state dir was lost hearing its first
// rank back. Anything else is a forged or foreign claim: adopting it would
// rewrite the job's epoch and layout from one registration.
absl::Status CheckAdoptable(const JobParts& job, const dynmo::v1::RegisterRequest& r) {
  const uint64_t issued = job.plans.epoch();
  if (r.applied_epoch() <= issued) return absl::OkStatus();
  bool others = false;
  for (int k = 0; k < job.roster.size() && !others; ++k) {
    others = k != r.rank() && job.roster.at(k).registered;
  }
  if (issued == 0 && !others) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", r.rank(), " registered with epoch ", r.applied_epoch(), ", which job ",
      job.roster.shape().job, " never issued (its newest is ", issued,
      "): a rank may adopt only an epoch its job committed; restart the rank from this "
      "job's checkpoint, or delete the job to start it anew"));
}

}  // namespace

absl::Status CheckRegisterEpochs(const JobParts& job, const dynmo::v1::RegisterRequest& r,
                                 uint64_t epoch_window) {
  const uint64_t limit = job.plans.epoch() + epoch_window;
  if (r.applied_epoch() <= limit && r.pending_epoch() <= limit) {
    return CheckAdoptable(job, r);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "rank ", r.rank(), " registered with epoch ",
      std::max(r.applied_epoch(), r.pending_epoch()), ", more than ", epoch_window,
      " beyond job ", job.roster.shape().job, "'s epoch ", job.plans.epoch(),
      " (--epoch_window)"));
}

}  // namespace dynmo::service
