// JobEffects: what one event of a job's machine asks of its owner, as
// data — sessions to close, messages to send, events to log, counters to
// add, GPUs released to the pool — and UpstreamMessage, one rank's report
// or ack as the machine takes it. Plain structs; PlanLifecycle
// (plan_lifecycle.h) fills the plan part, JobMachine the rest.
//
// Thread-compatible.
#ifndef DYNMO_COORDINATOR_JOB_JOB_EFFECTS_H_
#define DYNMO_COORDINATOR_JOB_JOB_EFFECTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/job/log_field.h"
#include "coordinator/job/session_sink.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

// One event for the event log (event_log.h), as data.
struct JobEvent {
  LogLevel level = LogLevel::kInfo;
  std::string name;
  std::vector<LogField> fields;
};

// What one event asks of the caller, in order within each list.
struct JobEffects {
  struct Send {
    std::shared_ptr<SessionSink> sink;
    std::vector<int> ranks;  // the ranks of `sink` it is for
    std::shared_ptr<const dynmo::v1::CoordinatorMessage> message;
  };
  struct Close {
    std::shared_ptr<SessionSink> sink;
    absl::Status why;
  };
  std::vector<Close> closes;  // before the sends
  std::vector<Send> sends;
  std::vector<JobEvent> events;
  // GPUs a plan released; the job's record naming them is durable.
  std::vector<dynmo::v1::ReleasedGpu> released;
  // Counters since the event began.
  int reports = 0;
  int plans_issued = 0;
  int plans_aborted = 0;
  int plans_applied = 0;
  double migrated_bytes = 0;
  std::vector<double> decision_latency_s;  // one per balancer run
  // Plans whose realized gain was measured (plan_lifecycle.h).
  struct PlanGain {
    uint64_t epoch = 0;
    double predicted = 0;  // previous / predicted step time - 1
    double realized = 0;   // before / after step time - 1
    // The model changed inside the measurement: not the model's error.
    bool model_changed = false;
  };
  std::vector<PlanGain> gains;
  bool measures_changed = false;           // the measures were refreshed
  bool speeds_changed = false;             // a rank's published speed moved

  // Adds `later`'s effects after these (lists appended, counters summed).
  void Append(JobEffects later);
};

// One rank's upstream message, by reference: a Session's report or ack, or
// one RankMessage of a HostBatch. Exactly one of report / ack is set.
struct UpstreamMessage {
  int rank;
  const dynmo::v1::IterationReport* report;
  const dynmo::v1::PlanAck* ack;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_JOB_EFFECTS_H_
