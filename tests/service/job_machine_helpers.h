// What the JobMachine tests share: a journal the test controls, a sink that
// keeps what it was sent, a two-stage job's registrations and skewed
// reports. Test-only; thread-compatible.
#ifndef DYNMO_TESTS_SERVICE_JOB_MACHINE_HELPERS_H_
#define DYNMO_TESTS_SERVICE_JOB_MACHINE_HELPERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/job/job_machine.h"

namespace dynmo::service {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

constexpr int kStages = 2;
constexpr int kLayers = 8;

class Journal : public JobJournal {
 public:
  absl::Status CommitJob(const dynmo::v1::JobRecord& record) override {
    if (fail) return absl::UnavailableError("state not persisted (disk full)");
    records.push_back(record);
    return absl::OkStatus();
  }
  bool fail = false;
  std::vector<dynmo::v1::JobRecord> records;
};

class Sink : public SessionSink {
 public:
  void SendTo(absl::Span<const int> /*ranks*/, std::shared_ptr<const CoordinatorMessage> m) override { got.push_back(*m); }
  void Close(const absl::Status&) override {}
  std::vector<CoordinatorMessage> got;
};

inline dynmo::v1::RegisterRequest Reg(int rank) {
  dynmo::v1::RegisterRequest r;
  r.set_job("m");
  r.set_rank(rank);
  r.set_pipeline_rank(rank);
  r.set_pipeline_size(kStages);
  r.set_data_parallel_size(1);
  r.set_num_layers(kLayers);
  r.set_host("h");
  r.set_microbatches(4);
  return r;
}

// Each rank's report of `iteration`: stage 0's layers cost three times
// stage 1's.
// Registers `regs` with `m` at `now` and attaches every rank's session to a
// sink of its own; returns the sinks, one per rank, or none when the machine
// refused the registration or an attach.
inline std::vector<std::shared_ptr<Sink>> RegisterAndAttach(
    JobMachine& m, const std::vector<dynmo::v1::RegisterRequest>& regs, absl::Time now) {
  std::vector<const dynmo::v1::RegisterRequest*> all;
  for (const auto& r : regs) all.push_back(&r);
  std::vector<dynmo::v1::RegisterResponse> responses;
  JobEffects fx;
  if (!m.Register(all, now, &responses, &fx).ok()) return {};
  std::vector<std::shared_ptr<Sink>> sinks;
  for (size_t i = 0; i < regs.size(); ++i) {
    sinks.push_back(std::make_shared<Sink>());
    const int ranks[] = {regs[i].rank()};
    const std::string keys[] = {responses[i].session_key()};
    if (!m.Attach(ranks, keys, false, sinks.back(), &fx).ok()) return {};
  }
  return sinks;
}

inline std::vector<dynmo::v1::IterationReport> SkewedReports(int64_t iteration) {
  std::vector<dynmo::v1::IterationReport> reports(kStages);
  for (int r = 0; r < kStages; ++r) {
    reports[r].set_iteration(iteration);
    for (int l = r * kLayers / 2; l < (r + 1) * kLayers / 2; ++l) {
      auto* s = reports[r].add_layers();
      s->set_layer(l);
      s->set_fwd_s(r == 0 ? 0.03 : 0.01);
      s->set_bwd_s(r == 0 ? 0.06 : 0.02);
      s->set_resident_bytes(1 << 20);
    }
  }
  return reports;
}

}  // namespace dynmo::service

#endif  // DYNMO_TESTS_SERVICE_JOB_MACHINE_HELPERS_H_
