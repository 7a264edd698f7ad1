// The plan protocol's downstream messages (PREPARE, COMMIT, ABORT) and who
// they go to: every participating rank's session, or what a (re)attached
// session's ranks may have missed. Pure functions of the plan lifecycle's
// state and the job's roster and layout (plan_lifecycle.h decides when).
//
// Thread-compatible: the caller holds the job's lock.
#ifndef DYNMO_COORDINATOR_JOB_PLAN_MESSAGES_H_
#define DYNMO_COORDINATOR_JOB_PLAN_MESSAGES_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "coordinator/job/job_effects.h"
#include "coordinator/job/job_layout.h"
#include "coordinator/job/rank_roster.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/plan.pb.h"

namespace dynmo::service {

dynmo::v1::CoordinatorMessage CommitMessage(const dynmo::v1::Plan& plan);
dynmo::v1::CoordinatorMessage AbortMessage(uint64_t epoch, const std::string& reason);

// `m` for every participating rank's session, one send per session; returns
// how many ranks and sessions it goes to.
std::pair<int, int> SendToParticipants(const RankRoster& roster, const JobLayout& layout,
                                       const dynmo::v1::CoordinatorMessage& m,
                                       JobEffects* out);

// What (re)attached `ranks` of `sink` may have missed: the PREPARE (and the
// COMMIT) of the plan in flight, for the ranks of active stages only; or,
// with none in flight, the ABORT of the newest epoch `epoch` when that is
// the newest settled plan, for every rank (a rank holding it prepared drops
// it now; harmless when it never saw it).
void SendMissed(const RankRoster& roster, const JobLayout& layout,
                const dynmo::v1::PlanRecord* in_flight,
                const std::deque<dynmo::v1::PlanRecord>& history, uint64_t epoch,
                const std::shared_ptr<SessionSink>& sink, absl::Span<const int> ranks,
                JobEffects* out);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_PLAN_MESSAGES_H_
