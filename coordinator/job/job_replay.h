// JobReplay: what the coordinator would do with a job whose per-layer costs
// are a trace (core/trace.h), decided by the coordinator's own code. The
// replay registers pp x dp simulated ranks with a JobMachine (job_machine.h)
// — the machine the daemon runs, with its smoothed costs, noise tracker,
// trigger (every:N, on-event, auto with its noise gate, payback and
// cool-down), re-packing and re-shaping — reports each record's layer costs
// from every rank of an active stage, ticks the machine, and answers its
// plan messages the way a rank's agent does: PREPARED at once, switch at the
// plan's apply iteration, APPLIED. A plan therefore takes effect at the
// iteration it would in a live job (the plan lead included).
//
// Each record counts as one iteration. Its time is core::CostOfGrid's
// iteration time for the grid in force (the pipeline simulator plus the
// data-parallel all-reduce), each stage at its slowest replica's true speed
// when stragglers are set (their layer times and speed probes are reported
// slowed, so the coordinator must find them as it would live); static keeps
// the uniform split on pp x dp all along. An applied plan costs its migration bytes over the migration
// bandwidth (a re-shape: its copies). GPU-seconds count the active ranks.
//
// The machine is driven through a ReplayTarget, so a test can drive a live
// JobState (the daemon's shell) with the same messages and compare plans.
//
// Pure apart from the target it drives; thread-compatible.
#ifndef DYNMO_COORDINATOR_JOB_JOB_REPLAY_H_
#define DYNMO_COORDINATOR_JOB_JOB_REPLAY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/boundaries.h"
#include "core/pipeline_sim.h"
#include "core/trace.h"
#include "coordinator/job/job_machine.h"
#include "coordinator/job/replay_bounds.h"
#include "coordinator/job/session_sink.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::service {

// A rank running at `speed` (relative, (0, 1]) over iterations
// [from_iteration, to_iteration); to_iteration < 0: to the end. A straggler:
// a throttled GPU, a noisy neighbour.
struct SpeedChange {
  int rank = 0;  // global rank, stage * dp + replica at the start
  double speed = 1;
  int64_t from_iteration = 0;
  int64_t to_iteration = -1;
};

struct JobReplayConfig {
  int pp = 4;
  int dp = 1;
  int microbatches = 16;  // per replica per iteration
  std::string schedule = "1f1b";  // "1f1b", "gpipe", "zb-h1"
  int64_t stage_capacity_bytes = -1;  // every rank's memory; < 0 unbounded
  // Bytes per second an applied plan's moves (or a re-shape's copies) run
  // at; 0 = free.
  double migration_bandwidth_bytes_per_s = 0;
  // Traces carry a layer's resident bytes, not its parameters: a layer has
  // mem_bytes / bytes_per_param parameters for the gradient all-reduce
  // (16: fp16 weights and grads, fp32 master weights, Adam's two moments,
  // as the scenarios assume); 0 = no parameters (no all-reduce).
  int64_t bytes_per_param = 16;
  // Ranks slower than the rest, and when (none: every rank at speed 1). A
  // slow rank measures its layers and its speed probe 1/speed times as long.
  std::vector<SpeedChange> stragglers;
  // When the simulated ranks probe their speed, as dynmo-train's ranks do
  // (core::ProbeCadence): every probe_every iterations while watched (their
  // first probes, a move in their layers' time), every probe_steady_every
  // otherwise (0: never). A probe takes probe_s at speed 1.
  int probe_every = 5;
  int probe_steady_every = 25;
  double probe_s = 0.001;
  // Also price every record on its own optimum over the starting pp x dp
  // grid at the ranks' true speeds, moved for free: re-partitioning's
  // ceiling (JobReplayResult::oracle_total_s); the same delayed by the plan
  // lead; and with re-packing on, the release or reshape bound of
  // replay_bounds.h.
  bool oracle = false;
  // A rank flags "the model changed" (what on-event waits for) when its
  // layers' times moved by more than this since the previous record.
  double change_threshold = 0.05;
  // The coordinator's options: its default policy (trigger, balancer,
  // re-pack, elastic mode), the auto trigger's knobs, the plan lead.
  JobOptions options;
};

// Returns OK for pp, dp, microbatches >= 1, a known schedule, bandwidth and
// threshold finite and >= 0, and a trigger the coordinator runs.
absl::Status ValidateJobReplayConfig(const JobReplayConfig& config);

// One plan the coordinator issued during the replay.
struct ReplayedPlan {
  uint64_t epoch = 0;
  int64_t decided_iteration = 0;  // the newest record reported when issued
  int64_t apply_iteration = 0;
  std::string reason;
  std::string outcome;  // "applied", "aborted", or "in flight" at the end
  core::Boundaries boundaries;
  std::vector<int> active_stages;
  int pp = 0;  // the grid after it
  int dp = 0;
  int64_t migration_bytes = 0;
  // What the plan predicted to gain and, from the replayed step times after
  // it applied, what it delivered (plan_gains.h, as live); realized_samples
  // 0: not measured (aborted, or too few iterations after it).
  double predicted_gain = 0;
  double realized_gain = 0;
  double realized_spread = 0;
  int realized_samples = 0;
  bool realized_model_changed = false;  // PlanRecord's: not the model's error
};

struct JobReplayResult {
  int iterations = 0;
  double static_total_s = 0;
  double dynamic_total_s = 0;  // includes migration_s
  double speedup = 1;          // static_total_s / dynamic_total_s
  double static_gpu_s = 0;     // iteration time x ranks, summed
  double dynamic_gpu_s = 0;
  double migration_s = 0;
  double oracle_total_s = 0;   // with `oracle`; 0 otherwise
  double oracle_speedup = 0;   // static_total_s / oracle_total_s
  // Record t on the oracle's partition of record t - plan lead (static
  // before), moved for free; with `oracle`.
  double delayed_oracle_total_s = 0;
  double delayed_oracle_speedup = 0;
  // With `oracle` and re-packing on: the bound of the elastic mode in force.
  std::optional<ReleaseBound> release_bound;
  std::optional<ReshapeBound> reshape_bound;
  // Means over records of Imbalance(StageLoads) and the pipeline
  // simulator's bubble ratio, for static's grid and the grid in force.
  double mean_imbalance_static = 0;
  double mean_imbalance_dynamic = 0;
  double mean_bubble_static = 0;
  double mean_bubble_dynamic = 0;
  std::vector<ReplayedPlan> plans;
  // Per record: its iteration and what it took static and under DynMo (a
  // plan's migration pause counted in the iteration it applied at).
  std::vector<int64_t> record_iterations;
  std::vector<double> static_iteration_s;
  std::vector<double> dynamic_iteration_s;
  std::vector<double> oracle_iteration_s;  // with `oracle`; empty otherwise
  core::Boundaries final_boundaries;
  std::vector<int> final_active_stages;
  int final_pp = 0;
  int final_dp = 0;
};

// What the replay drives: a JobMachine (the default), or in a test the
// daemon's JobState. Messages to ranks go to the sinks attached.
class ReplayTarget {
 public:
  virtual ~ReplayTarget() = default;
  virtual absl::Status Register(absl::Span<const dynmo::v1::RegisterRequest> ranks,
                                std::vector<dynmo::v1::RegisterResponse>* out) = 0;
  virtual absl::Status Attach(int rank, const std::string& session_key,
                              std::shared_ptr<SessionSink> sink) = 0;
  virtual absl::Status Upstream(absl::Span<const UpstreamMessage> messages,
                                absl::Time now) = 0;
  virtual void Tick(absl::Time now) = 0;
  // The job's plan records now (their predicted and realized gains); a
  // target that keeps none answers none.
  virtual std::vector<dynmo::v1::PlanRecord> History() const { return {}; }
};

// A JobMachine as a ReplayTarget, with a journal that keeps nothing; the
// machine's sends go straight to the sinks.
std::unique_ptr<ReplayTarget> MachineTarget(const dynmo::v1::RegisterRequest& first,
                                            const JobOptions& options);

// Replays `trace` through `target` (null: a MachineTarget). Errors: an
// invalid trace or config, more stages than layers, or a refusal by the
// coordinator's code, named with the iteration it happened at.
absl::StatusOr<JobReplayResult> ReplayJob(const core::Trace& trace,
                                          const JobReplayConfig& config,
                                          ReplayTarget* target = nullptr);

// The registration of rank `rank` of the replayed job (what ReplayJob
// registers; a test builds its own target from rank 0's).
dynmo::v1::RegisterRequest ReplayRegistration(const core::Trace& trace,
                                              const JobReplayConfig& config, int rank);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_JOB_REPLAY_H_
