// What the JobMachine tests share: a journal the test controls, a sink that
// keeps what it was sent, a two-stage job's registrations and skewed
// reports. Test-only; thread-compatible.
#ifndef DYNMO_TESTS_SERVICE_JOB_MACHINE_HELPERS_H_
#define DYNMO_TESTS_SERVICE_JOB_MACHINE_HELPERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "coordinator/job/job_machine.h"

namespace dynmo::service {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

constexpr int kStages = 2;
constexpr int kLayers = 8;

class Journal : public JobJournal {
 public:
  absl::Status Commit(const dynmo::v1::JobRecord& record) override {
    if (fail) return absl::UnavailableError("state not persisted (disk full)");
    records.push_back(record);
    return absl::OkStatus();
  }
  bool fail = false;
  std::vector<dynmo::v1::JobRecord> records;
};

class Sink : public SessionSink {
 public:
  void Send(std::shared_ptr<const CoordinatorMessage> m) override { got.push_back(*m); }
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
