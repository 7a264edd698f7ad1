// Agent: the trainer rank's side of DynMo, without LibTorch.
//
//   auto agent = Agent::Start(config);           // returns at once
//   each iteration k:
//     if (auto plan = agent->PlanToApplyAt(k)) { // a committed plan is due
//       bool all = AllReduceMin(plan->epoch()) == plan->epoch();  // in-band
//       if (all) MigrateLayers(*plan);
//       agent->Acknowledge(plan->epoch(), all);
//     }
//     run iteration k; agent->ReportIteration(sample_of_k);
//
// A background thread owns the connection: Register, then one Session
// stream, whose reads and writes run on gRPC's callback threads (no thread
// per stream); it reconnects with exponential backoff (re-registering with
// the applied epoch, the layout and any plan it holds) whenever the stream
// breaks. ReportIteration never blocks on the network: samples wait in a
// bounded queue that drops the OLDEST when full, so a slow or absent
// coordinator costs training nothing, and the trainer keeps running on the
// last plan it applied.
//
// Plans follow the two-phase protocol of docs/protocol.md: the agent acks
// PREPARED for a plan newer than anything it settled whose apply iteration
// is still ahead, marks it committed on COMMIT, drops it on ABORT, and
// ignores any epoch it already settled (duplicates are re-acknowledged,
// never re-applied). A plan that is not committed when its apply iteration
// comes is failed, never applied late. The in-band agreement (the MIN
// all-reduce above) is what keeps ranks from diverging when a COMMIT reaches
// only some of them in time.
//
// Thread-safe: any thread may call any method.
#ifndef DYNMO_AGENT_AGENT_H_
#define DYNMO_AGENT_AGENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/channel.h"
#include "coordinator/core/cost_model.h"
#include "dynmo/v1/plan.pb.h"
#include "grpcpp/channel.h"

namespace dynmo::agent {

struct AgentConfig {
  std::string coordinator;  // "host:port"
  ChannelOptions channel;
  // Use this channel instead of dialling `coordinator` (many agents in one
  // process, tests).
  std::shared_ptr<grpc::Channel> shared_channel;

  std::string job;
  int rank = 0;
  int pipeline_rank = 0;
  int data_parallel_rank = 0;
  int pipeline_size = 1;
  int data_parallel_size = 1;
  std::string host;
  int device = 0;
  int64_t memory_capacity_bytes = 0;
  int num_layers = 1;
  std::vector<int> boundaries;     // initial layout; empty = uniform
  std::string model_fingerprint;
  int microbatches = 1;
  std::string schedule = "1f1b";

  size_t queue_capacity = 64;      // samples buffered while sending lags
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(5);
  absl::Duration rpc_timeout = absl::Seconds(5);
};

// One iteration's measurements of this rank's stage.
struct IterationSample {
  int64_t iteration = 0;
  std::vector<core::LayerCost> layers;  // id = global layer index
  int64_t memory_used_bytes = 0;
  int64_t memory_capacity_bytes = 0;
  double neighbour_wait_s = 0;
  bool model_changed = false;
};

struct AgentStats {
  bool connected = false;
  uint64_t applied_epoch = 0;
  std::vector<int> boundaries;     // the layout this rank runs
  std::vector<int> active_stages;
  bool released = false;           // this rank's stage was released
  int64_t reports_sent = 0;
  int64_t samples_dropped = 0;
  int64_t connects = 0;            // successful (re)connections
  int64_t plans_prepared = 0;
  int64_t plans_applied = 0;
  int64_t plans_failed = 0;
  // When the newest COMMIT arrived here (for plan-delivery latency).
  uint64_t last_commit_epoch = 0;
  int64_t last_commit_unix_nanos = 0;
  // When the newest PREPARE arrived here.
  uint64_t last_prepare_epoch = 0;
  int64_t last_prepare_unix_nanos = 0;
  std::string last_error;
};

class Agent {
 public:
  // Validates the config and starts the background thread. Does not wait for
  // the coordinator: an unreachable one is retried with backoff.
  static absl::StatusOr<std::unique_ptr<Agent>> Start(const AgentConfig& config);
  ~Agent();

  // Queues a sample (validated: finite, non-negative, layer ids in range).
  // Never blocks; drops the oldest queued sample when the queue is full.
  absl::Status ReportIteration(const IterationSample& sample);

  // The newest committed plan: the one waiting for its apply iteration, or
  // else the last applied one. nullopt before any.
  std::optional<dynmo::v1::Plan> LatestCommittedPlan() const;

  // The committed plan due at the start of `iteration`, if any. A prepared
  // plan that is due (or overdue) but not committed is failed here.
  std::optional<dynmo::v1::Plan> PlanToApplyAt(int64_t iteration);

  // Settles the plan of `epoch`: applied (switched at its apply iteration)
  // or not. FAILED_PRECONDITION when that epoch is not the pending plan.
  absl::Status Acknowledge(uint64_t epoch, bool applied,
                           const std::string& detail = "");

  AgentStats stats() const;

  // Blocks until the agent has an open session or `timeout` passes.
  bool WaitConnected(absl::Duration timeout) const;

  // Blocks until every queued acknowledgement has been written to the
  // session (or lost with a broken one) or `timeout` passes; true when none
  // is left. For a rank about to exit, e.g. one released by re-packing.
  bool Flush(absl::Duration timeout) const;

  // Stops the background thread (closing the session). Idempotent.
  void Stop();

 private:
  class Impl;
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_AGENT_H_
