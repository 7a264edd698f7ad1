#include "coordinator/job/plan_messages.h"

namespace dynmo::service {

using dynmo::v1::CoordinatorMessage;

CoordinatorMessage CommitMessage(const dynmo::v1::Plan& plan) {
  CoordinatorMessage m;
  m.mutable_commit()->set_epoch(plan.epoch());
  m.mutable_commit()->set_apply_iteration(plan.apply_iteration());
  return m;
}

CoordinatorMessage AbortMessage(uint64_t epoch, const std::string& reason) {
  CoordinatorMessage m;
  m.mutable_abort()->set_epoch(epoch);
  m.mutable_abort()->set_reason(reason);
  return m;
}

std::pair<int, int> SendToParticipants(const RankRoster& roster, const JobLayout& layout,
                                       const CoordinatorMessage& m, JobEffects* out) {
  auto shared = std::make_shared<const CoordinatorMessage>(m);
  int ranks = 0, sessions = 0;
  for (SessionRanks& s : roster.ParticipantSessions(layout.active_stages)) {
    ranks += static_cast<int>(s.ranks.size());
    ++sessions;
    out->sends.push_back({std::move(s.sink), std::move(s.ranks), shared});
  }
  return {ranks, sessions};
}

void SendMissed(const RankRoster& roster, const JobLayout& layout,
                const dynmo::v1::PlanRecord* in_flight,
                const std::deque<dynmo::v1::PlanRecord>& history, uint64_t epoch,
                const std::shared_ptr<SessionSink>& sink, absl::Span<const int> ranks,
                JobEffects* out) {
  if (sink == nullptr || ranks.empty()) return;
  std::vector<CoordinatorMessage> missed;
  if (in_flight == nullptr) {
    if (!history.empty() && history.back().plan().epoch() == epoch &&
        history.back().outcome() == dynmo::v1::PLAN_OUTCOME_ABORTED) {
      missed.push_back(AbortMessage(epoch, history.back().detail()));
    }
  } else {
    CoordinatorMessage m;
    *m.mutable_prepare() = in_flight->plan();
    missed.push_back(std::move(m));
    if (in_flight->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED &&
        !in_flight->plan().commit_with_prepare()) {
      missed.push_back(CommitMessage(in_flight->plan()));
    }
  }
  std::vector<int> to;
  for (int rank : ranks) {
    if (in_flight == nullptr ||
        RankRoster::IsActiveStage(layout.active_stages, roster.at(rank).pipeline_rank)) {
      to.push_back(rank);
    }
  }
  if (to.empty()) return;
  for (CoordinatorMessage& m : missed) {
    out->sends.push_back({sink, to, std::make_shared<const CoordinatorMessage>(std::move(m))});
  }
}

}  // namespace dynmo::service
