// JobMachine's checks of what ranks send, made before anything is applied
// (a refused message changes nothing): a report's or ack's rank, values and
// epoch, and the windows iterations and epochs must fall in
// (JobOptions::iteration_window, epoch_window).
//
// Part of JobMachine (job_machine.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/job/job_machine.h"
#include "coordinator/job/validation.h"

namespace dynmo::service {

absl::Status JobMachine::Check(const UpstreamMessage& m) const {
  if (!roster_.Contains(m.rank)) {
    return absl::NotFoundError(absl::StrCat("job ", name_, " has no rank ", m.rank));
  }
  if (m.report != nullptr) {
    if (absl::Status s = ValidateReport(*m.report, roster_.shape().num_layers);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckIteration(m.report->iteration()); !s.ok()) return s;
    return protocol_.CheckReportEpoch(m.report->applied_epoch());
  }
  if (m.ack != nullptr) {
    if (absl::Status s = ValidateAck(*m.ack); !s.ok()) return s;
    if (absl::Status s = CheckIteration(m.ack->iteration()); !s.ok()) return s;
    return protocol_.CheckAck(m.rank, *m.ack);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("empty message for rank ", m.rank, " (neither report nor ack)"));
}

absl::Status JobMachine::CheckIteration(int64_t iteration) const {
  const int64_t newest = rebalancer_.reported_iteration();
  // Both are validated to [0, 2^53], so the sum cannot overflow.
  if (newest < 0 || iteration <= newest + options_.iteration_window) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "iteration ", iteration, " is more than ", options_.iteration_window,
      " beyond job ", name_, "'s newest iteration ", newest, " (--iteration_window)"));
}

absl::Status JobMachine::CheckRegisterEpochs(
    const dynmo::v1::RegisterRequest& r) const {
  const uint64_t limit = protocol_.epoch() + options_.epoch_window;
  if (r.applied_epoch() <= limit && r.pending_epoch() <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "rank ", r.rank(), " registered with epoch ",
      std::max(r.applied_epoch(), r.pending_epoch()), ", more than ",
      options_.epoch_window, " beyond job ", name_, "'s epoch ", protocol_.epoch(),
      " (--epoch_window)"));
}

}  // namespace dynmo::service
