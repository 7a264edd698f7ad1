// TrainerConfig: everything one dynmo-train rank needs to know about the job,
// as a plain struct (no LibTorch, no flags), plus its validation.
//
// The model is a GPT decoder cut into pipeline *layers* with stable global
// ids: layer 0 is the token+position embedding, layers 1..num_blocks are the
// pre-LN decoder blocks, layer num_blocks+1 is the final LayerNorm + LM head
// + cross-entropy. So a job with --layers=N has N+2 pipeline layers, and
// under --pipeline_units=halves, where block k is two layers (2k-1 its
// attention half, 2k its MLP half; decoder_half.h), 2N+2 layers; and
// `boundaries` (core::Boundaries convention: stage s holds [b[s], b[s+1]))
// partitions those N+2 layers over `pp` stages. The embedding always lives
// on stage 0 and the head on the last stage, and both count in the balance.
//
// Ranks: world = pp * dp. Rank r is pipeline stage r / dp and data-parallel
// replica r % dp (replicas of one stage are adjacent, as in Megatron's
// rank order with tensor parallelism 1). Thread-compatible value type.
#ifndef DYNMO_TRAINER_CONFIG_CONFIG_H_
#define DYNMO_TRAINER_CONFIG_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cli/coordinator_flags.h"
#include "core/boundaries.h"
#include "trainer/config/dynamism_config.h"
#include "trainer/layout/boundaries_text.h"  // ParseBoundaries, for the flags

namespace dynmo::trainer {

struct ModelConfig {
  int num_blocks = 4;  // --layers: decoder blocks
  int hidden = 64;
  int heads = 4;
  int seq_len = 32;
  int vocab = 256;
  // The dynamic-model schemes (--dynamism) and their parameters: they shape
  // what the layers compute, so they are part of the model.
  DynamismConfig dynamism;
  // What a pipeline layer between the embedding and the head is: a whole
  // decoder block ("blocks") or half of one ("halves": attention / MLP).
  std::string pipeline_units = "blocks";
  bool halves() const { return pipeline_units == "halves"; }
  // Pipeline layers: embedding + blocks (or their halves) + head.
  int num_pipeline_layers() const { return (halves() ? 2 * num_blocks : num_blocks) + 2; }
};

struct TrainerConfig {
  ModelConfig model;
  int micro_batch = 4;
  int microbatches = 4;
  int steps = 20;
  double lr = 1e-3;
  double weight_decay = 0.01;
  uint64_t seed = 1234;
  int pp = 1;
  int dp = 1;
  std::string data;  // a .txt file (byte tokens) or a Megatron .bin/.idx prefix
  core::Boundaries initial_boundaries;  // empty: uniform
  std::string log_json;                 // empty: no JSON log
  // Every rank's real schedule as a chrome trace (stage/op_timeline.h):
  // DIR/rank<R>_trace.json over [perfetto_first, + perfetto_iterations).
  std::string perfetto_out;             // empty: none
  int64_t perfetto_first = 2;
  int64_t perfetto_iterations = 4;
  int log_interval = 1;                 // iterations per progress line
  int intra_op_threads = 1;
  int timeout_s = 300;  // collective / point-to-point timeout
  // The c10d backend behind the transport seam: "gloo" (CPU) or "nccl"
  // (builds against a CUDA LibTorch with NCCL; elsewhere a clear error).
  std::string backend = "gloo";
  // Where layers, activations, gradients and AdamW state live: "cpu",
  // "cuda" (this rank's GPU, cuda:LOCAL_RANK), "cuda:N", or "auto" (cuda
  // when a device is visible, else cpu). RunTraining resolves "auto" and
  // "cuda" to the concrete device before anything is built.
  std::string device = "cpu";
  // A test policy standing in for the coordinator: every
  // `test_migrate_every` iterations the job migrates to the next entry of
  // `test_migration_targets` (cycling). 0 disables it. Entry i may also name
  // the stages that stay active (`test_migration_stages[i]`, original stage
  // ids; empty = keep the running ones): fewer stages re-pack the job and
  // release the others' ranks. A list that releases stages is walked once,
  // not cycled.
  int test_migrate_every = 0;
  std::vector<core::Boundaries> test_migration_targets;
  std::vector<std::vector<int>> test_migration_stages;  // empty or one per target
  // A test policy re-shaping the grid once (--test_reshape_at=ITER:PPxDP[:b]):
  // before iteration `test_reshape_at` (0: never) the job's ranks regroup
  // into test_reshape_pp x test_reshape_dp with those boundaries (empty:
  // uniform). Not combinable with test_migrate_every.
  int64_t test_reshape_at = 0;
  int test_reshape_pp = 0;
  int test_reshape_dp = 0;
  core::Boundaries test_reshape_boundaries;
  // The DynMo coordinator (agent/agent.h): "none" or empty (no agent),
  // "embedded" (rank 0 serves one on loopback; every rank must be on this
  // host) or HOST:PORT. Plans it commits are applied at their apply
  // iteration after the in-band agreement of every rank.
  std::string coordinator;
  // How to reach a secured coordinator: the bearer token file agents
  // present (its --agent_token_file, else its --token_file) and TLS (a CA
  // enables it; a client certificate and key for mutual TLS).
  // (the --coordinator_* flags, cli/coordinator_flags.h).
  cli::CoordinatorClientFlags coordinator_client;
  std::string job = "dynmo";
  // The job's policy, set by rank 0 once registered; empty keeps the
  // coordinator's default. balancer: uniform|parameters|time|optimal|
  // diffusion; trigger: every:N|on-event|auto|manual.
  std::string balancer;
  std::string trigger;
  // Re-packing (the policy's `repack` / `repack_tolerance`): the coordinator
  // may release stages when the work fits fewer at a bottleneck within
  // (1 + tolerance) of the best on all stages.
  bool repack = false;
  double repack_tolerance = 0;
  // What re-packing does with freed ranks (the policy's `elastic`):
  // "release" or "reshape" (more replicas of a shorter pipeline, executed
  // live, reshape.h); empty: the coordinator's default.
  std::string elastic;
  // A HOST:PORT coordinator that no rank reached within this many seconds
  // of start-up is an error; once connected, training never waits on it.
  int coordinator_connect_timeout_s = 10;
  // Per-layer checkpoints (checkpoint.h): every `save_every` iterations
  // (0: only after the last one) each stage writes its layers under
  // save_dir/iter_<k>/; `load_dir` resumes from its newest complete one at
  // any pp/dp. Empty: off.
  std::string save_dir;
  int save_every = 0;
  std::string load_dir;
  // Memory reported per rank (stage_memory.h); 0: the machine's physical
  // memory divided by its local ranks.
  int64_t memory_capacity_bytes = 0;
  // Rank 0 appends every iteration's per-layer profile to this JSON Lines
  // trace (the format dynmo-sim --trace replays). Empty: off.
  std::string trace;
  // Per-layer clocks around every layer's forward and backward. false: one
  // clock per stage pass, spread evenly over the stage's layers.
  bool profile_layers = true;
  // What a cpu layer clock reads: "wall" (the steady clock) or "cpu" (the
  // CPU time this process spent: with --intra_op_threads=1 the computing
  // thread's own, else the whole process's). "cpu" measures a layer's work
  // without the time the OS gave other processes, so ranks that share
  // cores (4 ranks on 2 cores) still see what each layer costs. cuda
  // always times with events.
  std::string layer_clock = "wall";
  // Iterations between speed probes (stage/speed_probe.h), whose times tell
  // the coordinator each rank's speed, while the rank is watched (its first
  // probes, a move in its layers' time: core::ProbeCadence), and otherwise;
  // 0 = never.
  int speed_probe_every = 5;
  int speed_probe_steady_every = 25;
};

// True for "cuda:N" (N a device index).
bool IsCudaDeviceName(absl::string_view name);

// Returns OK when the model, schedule and parallel shape are consistent and
// `world_size` processes match pp * dp. Errors name the offending flag.
absl::Status ValidateConfig(const TrainerConfig& config, int world_size);

// The boundaries the job starts from: `initial_boundaries` when given
// (validated), else the uniform partition of the pipeline layers.
absl::StatusOr<core::Boundaries> StartingBoundaries(const TrainerConfig& config);

// Parameters of pipeline layer `id` (embedding, block or head).
int64_t LayerParameterCount(const ModelConfig& model, int id);


// Where rank `rank` sits in the pp x dp grid.
struct RankPosition {
  int stage = 0;
  int dp_rank = 0;
};
RankPosition PositionOfRank(int rank, int dp);
int RankAt(int stage, int dp_rank, int dp);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_CONFIG_CONFIG_H_
