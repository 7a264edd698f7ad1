// What configures one rank's agent (AgentConfig), what a rank reports each
// iteration (IterationSample), and what an agent says about itself
// (AgentStats): plain structs shared by Agent (agent.h), HostAgent
// (host_agent.h) and the protocol state they both run (rank_state.h).
// Thread-compatible.
#ifndef DYNMO_AGENT_AGENT_CONFIG_H_
#define DYNMO_AGENT_AGENT_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "agent/channel.h"
#include "core/cost_model.h"
#include "grpcpp/channel.h"

namespace dynmo::agent {

struct AgentConfig {
  std::string coordinator;  // "host:port"
  ChannelOptions channel;
  // Bearer token sent on every AgentService call (the coordinator's
  // --agent_token_file, else its --token_file); empty: none.
  std::string token;
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
  // Iterations the run trains in all (its last + 1); 0 = unknown. The
  // coordinator pays for no move the run ends before repaying.
  int64_t planned_iterations = 0;

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
  // Seconds of the rank's speed probe this iteration (a fixed kernel timed
  // like the layers); 0 = not probed.
  double probe_s = 0;
  // Seconds this iteration in point-to-point exchanges (waiting included),
  // all micro-batches; 0 = not measured.
  double exchange_s = 0;
  // Wall seconds of the whole iteration (host clock); 0 = not measured.
  double iteration_s = 0;
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
  // The coordinator refused the registration for good (a malformed
  // request, a bad credential: IsPermanentRefusal); the agent stopped
  // retrying and last_error says why.
  bool gave_up = false;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_AGENT_CONFIG_H_
