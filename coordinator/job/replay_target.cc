// The replay's default target: a JobMachine driven directly, its sends
// delivered to the simulated ranks' sinks (job_replay.h's MachineTarget).
#include "coordinator/job/job_replay.h"

#include <memory>
#include <string>
#include <vector>


namespace dynmo::service {
namespace {

class NullJournal : public JobJournal {
 public:
  absl::Status CommitJob(const dynmo::v1::JobRecord&) override { return absl::OkStatus(); }
};

class Machine : public ReplayTarget {
 public:
  Machine(const dynmo::v1::RegisterRequest& first, const JobOptions& options)
      : machine_(first, options, &journal_) {}

  absl::Status Register(absl::Span<const dynmo::v1::RegisterRequest> ranks,
                        std::vector<dynmo::v1::RegisterResponse>* out) override {
    std::vector<const dynmo::v1::RegisterRequest*> all;
    for (const auto& r : ranks) all.push_back(&r);
    JobEffects fx;
    absl::Status s = machine_.Register(all, now_, out, &fx);
    Deliver(fx);
    return s;
  }
  absl::Status Attach(int rank, const std::string& key,
                      std::shared_ptr<SessionSink> sink) override {
    const int ranks[] = {rank};
    const std::string keys[] = {key};
    JobEffects fx;
    absl::Status s = machine_.Attach(ranks, keys, false, std::move(sink), &fx);
    Deliver(fx);
    return s;
  }
  absl::Status Upstream(absl::Span<const UpstreamMessage> messages,
                        absl::Time now) override {
    now_ = now;
    JobEffects fx;
    absl::Status s = machine_.OnUpstream(messages, now, &fx);
    Deliver(fx);
    return s;
  }
  void Tick(absl::Time now) override {
    now_ = now;
    JobEffects fx;
    machine_.Tick(now, &fx);
    Deliver(fx);
  }
  std::vector<dynmo::v1::PlanRecord> History() const override {
    const auto& h = machine_.plans().history();
    return {h.begin(), h.end()};
  }

 private:
  static void Deliver(const JobEffects& fx) {
    for (const JobEffects::Send& s : fx.sends) s.sink->SendTo(s.ranks, s.message);
  }

  NullJournal journal_;
  JobMachine machine_;
  absl::Time now_ = absl::UnixEpoch();
};


}  // namespace

std::unique_ptr<ReplayTarget> MachineTarget(const dynmo::v1::RegisterRequest& first,
                                            const JobOptions& options) {
  return std::make_unique<Machine>(first, options);
}


}  // namespace dynmo::service
