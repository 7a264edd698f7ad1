#include "trainer/run/trainer.h"

#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "agent/client_credentials.h"
#include "agent/operator_client.h"
#include "core/migration.h"
#include "core/probe_cadence.h"
#include <time.h>

#include "trainer/comm/device.h"
#include "trainer/stage/speed_probe.h"
#include "trainer/comm/transport.h"
#include "trainer/data/open_token_corpus.h"
#include "trainer/data/token_corpus.h"
#include "trainer/elastic/plan_source.h"
#include "trainer/elastic/repack.h"
#include "trainer/elastic/reshape.h"
#include "trainer/run/iteration_report.h"
#include "trainer/run/local_coordinator.h"
#include "trainer/stage/pipeline_stage.h"
#include "trainer/stage/stage_memory.h"
#include "trainer/state/checkpoint.h"

namespace dynmo::trainer {
namespace {

// The coordinator side of one rank: the agent, and on rank 0 of an
// "embedded" job the local coordinator daemon (stopped after the agent).
struct AgentLink {
  std::unique_ptr<LocalCoordinator> embedded;
  std::unique_ptr<agent::Agent> agent;
  std::string address;
  agent::ChannelOptions channel;  // how this rank reaches the coordinator
  std::string token;
  ~AgentLink() {
    if (agent != nullptr) agent->Stop();
    agent.reset();
    embedded.reset();
  }
};

// Sets the job's balancer/trigger through the agent's OperatorClient (rank
// 0, once its agent registered the job). A policy the coordinator rejects is
// an error; an unreachable coordinator only a warning (training goes on).
absl::Status SetJobPolicy(const TrainerConfig& config, const std::string& address,
                          const agent::AgentConfig& ac, agent::Agent& agent) {
  if (config.balancer.empty() && config.trigger.empty() && !config.repack &&
      config.elastic.empty()) {
    return absl::OkStatus();
  }
  if (!agent.WaitConnected(absl::Seconds(10))) {
    std::cerr << "dynmo-train: warning: coordinator " << address
              << " not reachable; policy not set" << std::endl;
    return absl::OkStatus();
  }
  absl::StatusOr<agent::OperatorClient> client =
      agent::OperatorClient::Connect(address, ac.channel, ac.token);
  if (!client.ok()) return client.status();
  agent::JobPolicy policy;
  policy.balancer = config.balancer;
  policy.trigger = config.trigger;
  policy.repack = config.repack;
  policy.repack_tolerance = config.repack_tolerance;
  policy.elastic = config.elastic;
  const absl::Status s = client->SetPolicy(config.job, policy);
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    return absl::InvalidArgumentError(absl::StrCat("--balancer/--trigger: ", s.message()));
  }
  if (!s.ok()) {
    std::cerr << "dynmo-train: warning: " << s.message() << " at " << address << std::endl;
  }
  return absl::OkStatus();
}

// Starts this rank's agent (nothing for --coordinator none). "embedded":
// rank 0 serves a coordinator on loopback and the world learns its port
// through one all-reduce.
absl::Status StartAgent(const TrainerConfig& config, const DistEnv& env,
                        Transport& transport, const core::Boundaries& boundaries,
                        AgentLink* link) {
  if (config.coordinator.empty() || config.coordinator == "none") {
    return absl::OkStatus();
  }
  std::string address = config.coordinator;
  if (config.coordinator == "embedded") {
    torch::Tensor port = torch::zeros({1}, torch::kDouble);
    if (env.rank == 0) {
      absl::StatusOr<std::unique_ptr<LocalCoordinator>> started =
          LocalCoordinator::Start({"--plan_lead_iterations=5"});
      if (!started.ok()) {
        return absl::Status(started.status().code(),
                            absl::StrCat("cannot start the embedded coordinator: ",
                                         started.status().message()));
      }
      link->embedded = *std::move(started);
      port.accessor<double, 1>()[0] = link->embedded->port();
    }
    // host-sync(event): once at start: rank 0's embedded coordinator port, to every rank
    if (absl::Status s = transport.AllReduceSumWorld(port); !s.ok()) return s;
    address = absl::StrCat("127.0.0.1:", static_cast<int>(port.accessor<double, 1>()[0]));
  }
  link->address = address;
  const RankPosition pos = PositionOfRank(env.rank, config.dp);
  agent::AgentConfig ac;
  ac.coordinator = address;
  absl::StatusOr<agent::ClientCredentials> credentials =
      agent::CredentialsFrom(config.coordinator_client);
  if (!credentials.ok()) return credentials.status();
  ac.channel = credentials->channel;
  ac.token = credentials->token;
  link->channel = ac.channel;
  link->token = ac.token;
  ac.job = config.job;
  ac.rank = env.rank;
  ac.pipeline_rank = pos.stage;
  ac.data_parallel_rank = pos.dp_rank;
  ac.pipeline_size = config.pp;
  ac.data_parallel_size = config.dp;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  ac.host = host;
  ac.device = env.local_rank;
  ac.num_layers = config.model.num_pipeline_layers();
  ac.boundaries = boundaries;
  ac.model_fingerprint = absl::StrCat(
      "gpt:blocks=", config.model.num_blocks, ",hidden=", config.model.hidden,
      ",heads=", config.model.heads, ",seq=", config.model.seq_len,
      ",vocab=", config.model.vocab, config.model.halves() ? ",units=halves" : "");
  ac.microbatches = config.microbatches;
  ac.schedule = "1f1b";
  ac.planned_iterations = config.steps;
  absl::StatusOr<std::unique_ptr<agent::Agent>> a = agent::Agent::Start(ac);
  if (!a.ok()) return a.status();
  link->agent = *std::move(a);
  // Start-up is the one time a rank waits for the coordinator: a wrong
  // address must not pass silently. Once connected, the agent reconnects in
  // the background and training never waits on it again.
  if (!link->agent->WaitConnected(absl::Seconds(config.coordinator_connect_timeout_s))) {
    const agent::AgentStats st = link->agent->stats();
    const std::string& why = st.last_error;
    if (st.gave_up) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the DynMo coordinator at ", address, " refused this rank: ", why));
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the DynMo coordinator at ", address, " within ",
        config.coordinator_connect_timeout_s, " s (--coordinator_connect_timeout_s)",
        why.empty() ? "" : absl::StrCat(": ", why),
        "; check --coordinator or run with --coordinator=none"));
  }
  if (env.rank == 0) return SetJobPolicy(config, address, ac, *link->agent);
  return absl::OkStatus();
}

// A rank whose stage a re-pack released, after the survivors connected:
// says so, lets its agent deliver the APPLIED acknowledgement (the
// coordinator then puts its GPU in the released pool), and, when this
// process serves the embedded coordinator, keeps serving it until every
// rank of the job has disconnected (the survivors finished). Then the
// process exits 0.
absl::Status LeaveReleased(const TrainerConfig& config, const DistEnv& env,
                           int stage_id, int64_t iter, const std::string& by,
                           AgentLink& link) {
  std::cout << "dynmo-train: rank " << env.rank << " (stage " << stage_id
            << ") released by " << by << " at iteration " << iter
            << "; its layers moved to the surviving stages; exiting" << std::endl;
  if (link.agent != nullptr) {
    if (!link.agent->Flush(absl::Seconds(5))) {
      std::cerr << "dynmo-train: warning: rank " << env.rank
                << ": release not acknowledged to the coordinator" << std::endl;
    }
    link.agent->Stop();
  }
  if (link.embedded != nullptr) {
    std::cout << "dynmo-train: rank " << env.rank
              << " keeps serving the embedded coordinator until the job ends"
              << std::endl;
    absl::StatusOr<agent::OperatorClient> client =
        agent::OperatorClient::Connect(link.address, link.channel, link.token);
    int idle_polls = 0;
    while (client.ok() && idle_polls < 10) {  // 2 s without a connected rank
      absl::StatusOr<int> connected = client->ConnectedRanks(config.job);
      if (!connected.ok()) break;
      idle_polls = *connected == 0 ? idle_polls + 1 : 0;
      usleep(200 * 1000);
    }
  }
  return absl::OkStatus();
}

// Saves a checkpoint after iteration `iter` when --save_dir/--save_every
// ask for one (the checkpoint's k = iterations done; a collective).
absl::Status MaybeSaveCheckpoint(const TrainerConfig& config, int64_t iter,
                                 const core::Boundaries& boundaries, int active_pp,
                                 int dp_rank, Transport& transport, PipelineStage& stage) {
  const bool due = config.save_every > 0 ? (iter + 1) % config.save_every == 0
                                         : iter + 1 == config.steps;
  if (config.save_dir.empty() || !due) return absl::OkStatus();
  const bool rank0 = transport.rank() == 0;
  const std::string dir = CheckpointDir(config.save_dir, iter + 1);
  CheckpointManifest manifest = ManifestFor(config, iter + 1, boundaries);
  manifest.saved_pp = active_pp;  // after any re-packing
  if (absl::Status s = SaveCheckpoint(transport, dir, stage.layers(), dp_rank == 0,
                                      rank0 ? &manifest : nullptr);
      !s.ok()) {
    return s;
  }
  if (rank0) std::cout << "dynmo-train: saved checkpoint " << dir << std::endl;
  return absl::OkStatus();
}

// Re-shapes the job before iteration `iter` (reshape.h) and keeps the
// running configuration in step: the grid (pp, dp), micro-batches per
// replica and this rank's position, which the plan sources, the reporter
// and checkpoints read. Rank 0 says what happened.
absl::Status Reshape(const ReshapeStep& step, int64_t iter, const std::string& by,
                     PipelineStage& stage, std::unique_ptr<Transport>* transport,
                     TrainerConfig* config, RankPosition* pos) {
  absl::StatusOr<ReshapeResult> done = ApplyReshapeStep(step, *config, stage, transport);
  if (!done.ok()) return done.status();
  config->pp = step.to_pp();
  config->dp = step.to_dp;
  config->microbatches = step.to_microbatches;
  const size_t me = static_cast<size_t>((*transport)->rank());
  *pos = RankPosition{step.stage_after[me], step.replica_after[me]};
  if ((*transport)->rank() == 0) {
    std::vector<std::string> crc;
    for (uint32_t c : done->stage_checksums) crc.push_back(absl::StrFormat("%08x", c));
    std::cout << "dynmo-train: iteration " << iter << ": re-shaped pp "
              << step.from.active_stages.size() << " x dp " << step.from_dp << " -> pp "
              << step.to_pp() << " x dp " << step.to_dp << " by " << by << " (boundaries "
              << absl::StrJoin(step.from.boundaries, ",") << " -> "
              << absl::StrJoin(step.to.boundaries, ",") << ", " << step.copies.size()
              << " layer copies in " << step.rounds << " rounds, "
              << step.to_microbatches << " micro-batches per replica); replicas "
              << "identical, state CRC-32 per stage: " << absl::StrJoin(crc, " ")
              << std::endl;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTraining(const TrainerConfig& requested, const DistEnv& env,
                         const IterationCallback& on_iteration) {
  // Deterministic CPU kernels need a fixed thread count.
  at::set_num_threads(requested.intra_op_threads);
  TrainerConfig config = requested;
  absl::StatusOr<torch::Device> device = ResolveDevice(config.device, env.local_rank);
  if (!device.ok()) return device.status();
  config.device = device->str();
  if (config.backend == "nccl" && !device->is_cuda()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend=nccl needs a CUDA device (NCCL moves GPU tensors) but this rank "
        "computes on ", config.device, "; use --backend=gloo or --device=cuda"));
  }
  UseDevice(*device);

  absl::StatusOr<std::unique_ptr<TokenCorpus>> corpus = OpenTokenCorpus(config.data);
  if (!corpus.ok()) return corpus.status();
  if ((*corpus)->max_token() >= config.model.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        (*corpus)->description(), " holds token id ", (*corpus)->max_token(),
        " but --vocab=", config.model.vocab));
  }
  if ((*corpus)->size() <= config.model.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        (*corpus)->description(), " has ", (*corpus)->size(),
        " tokens, fewer than --seq_len+1=", config.model.seq_len + 1));
  }
  absl::StatusOr<core::Boundaries> boundaries = StartingBoundaries(config);
  if (!boundaries.ok()) return boundaries.status();
  // --load_dir: every rank checks the checkpoint before it connects, so a
  // missing or foreign one stops every rank with the same error.
  std::optional<FoundCheckpoint> resume;
  if (!config.load_dir.empty()) {
    absl::StatusOr<FoundCheckpoint> found = FindLatestCheckpoint(config.load_dir);
    if (!found.ok()) return found.status();
    if (absl::Status s = CheckResumable(found->manifest, config); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--load_dir: ", found->dir, ": ", s.message()));
    }
    resume = *std::move(found);
  }

  if (env.rank == 0) {
    std::cout << "dynmo-train: device " << config.device
              << (device->is_cuda() ? " (each rank: cuda:LOCAL_RANK)" : "") << std::endl;
  }
  TransportOptions transport_options{config.dp, config.timeout_s};
  if (device->is_cuda()) transport_options.device_index = device->index();
  transport_options.nccl_double = config.backend == "nccl-double";
  absl::StatusOr<std::unique_ptr<Transport>> transport =
      config.backend == "nccl" ? ConnectNcclTransport(env, transport_options)
                               : ConnectGlooTransport(env, transport_options);
  if (!transport.ok()) return transport.status();
  // Which ranks compute on this rank's GPU, by device UUID (device_share.h):
  // one all-gather at start, on every rank whatever its device.
  absl::StatusOr<int> device_sharing = RanksSharingThisDevice(*device, **transport);
  if (!device_sharing.ok()) return device_sharing.status();

  // This rank's place in the grid; a re-shape moves it.
  RankPosition pos = PositionOfRank(env.rank, config.dp);
  PipelineStage stage(config, *boundaries, pos.stage, pos.dp_rank,
                      transport->get(), corpus->get());
  SpeedProbe probe(*device, config.layer_clock == "wall"  ? -1
                            : config.intra_op_threads == 1 ? CLOCK_THREAD_CPUTIME_ID
                                                           : CLOCK_PROCESS_CPUTIME_ID);
  core::ProbeCadenceOptions cadence;
  cadence.every = config.speed_probe_every;
  cadence.steady_every = config.speed_probe_steady_every;
  core::ProbeCadence probe_cadence(cadence);
  if (resume) {
    absl::StatusOr<std::vector<OwnedLayer>> loaded = LoadStageLayers(
        resume->dir, config, stage.first_layer(),
        stage.first_layer() + stage.num_local_layers());
    if (!loaded.ok()) return loaded.status();
    stage.layers() = *std::move(loaded);
    if (env.rank == 0) {
      std::cout << "dynmo-train: resumed from " << resume->dir << " (saved at pp "
                << resume->manifest.saved_pp << " x dp " << resume->manifest.saved_dp
                << "), iteration " << resume->manifest.iteration << std::endl;
    }
  }
  const int64_t first_iter = resume ? resume->manifest.iteration : 0;
  const int64_t memory_capacity =
      config.memory_capacity_bytes > 0 ? config.memory_capacity_bytes
      : device->is_cuda()              ? ReadRankMemory(*device, *device_sharing).capacity_bytes
                                       : DefaultMemoryCapacityBytes();

  const int num_layers = config.model.num_pipeline_layers();
  // The running layout: re-packing may leave fewer stages (active_stages
  // are original stage ids) and renumbers the ranks over them.
  StageLayout layout = InitialLayout(config.pp, *boundaries);
  // What a migration plan counts as each layer's bytes (payload and memory
  // caps before the first measurement): fp32 weights, gradients, exp_avg
  // and exp_avg_sq. Every report carries the measured values instead.
  std::vector<core::LayerCost> layer_costs(num_layers);
  for (int l = 0; l < num_layers; ++l) {
    layer_costs[l].id = l;
    layer_costs[l].params = LayerParameterCount(config.model, l);
    layer_costs[l].resident_bytes = 16 * layer_costs[l].params;
  }
  AgentLink link;
  if (absl::Status s = StartAgent(config, env, **transport, *boundaries, &link);
      !s.ok()) {
    return s;
  }
  // Where layout changes come from: the test policy, then the coordinator.
  std::vector<std::unique_ptr<PlanSource>> sources;
  sources.push_back(MakeTestPolicySource(config, num_layers, &layer_costs));
  if (link.agent != nullptr) {
    sources.push_back(
        MakeAgentPlanSource(link.agent.get(), num_layers, config, &layer_costs));
  }
  IterationReporter reporter(config, *device, memory_capacity, *device_sharing);
  int64_t epoch = 0;
  // --perfetto_out: this rank's real schedule over a window of iterations.
  std::optional<OpTimeline> timeline;
  bool timeline_written = false;
  if (!config.perfetto_out.empty()) {
    timeline.emplace(config.perfetto_first, config.perfetto_iterations);
    stage.set_timeline(&*timeline);
  }
  auto write_timeline = [&]() -> absl::Status {
    if (!timeline || timeline_written) return absl::OkStatus();
    timeline_written = true;
    return timeline->Write(
        absl::StrCat(config.perfetto_out, "/rank", env.rank, "_trace.json"), env.rank,
        pos.stage);
  };
  // Algorithm 1: at each iteration boundary apply the layout change due
  // (migrating layers, re-packing), then train one iteration and report it.
  for (int64_t iter = first_iter; iter < config.steps; ++iter) {
    const auto start = std::chrono::steady_clock::now();
    bool layout_changed = false;  // restarts the probe cadence's pace
    for (const std::unique_ptr<PlanSource>& source : sources) {
      absl::StatusOr<std::optional<LayoutChange>> due =
          source->Due(iter, layout, **transport);
      if (!due.ok()) return due.status();
      if (!due->has_value()) continue;
      const LayoutChange& change = **due;
      const bool was_rank0 = (*transport)->rank() == 0;
      if (change.reshape) {
        if (absl::Status s = Reshape(*change.reshape, iter, change.by, stage, &*transport,
                                     &config, &pos);
            !s.ok()) {
          source->Failed(change, s);
          return s;
        }
        source->Applied(iter, change, was_rank0);
        layout = change.reshape->to;
        *boundaries = layout.boundaries;
        epoch = change.epoch ? static_cast<int64_t>(*change.epoch) : epoch + 1;
        layout_changed = true;
        continue;
      }
      // The moves are in current active indices: every destination is a
      // running stage. A re-pack then shrinks the transport (repack.h).
      absl::Status moved = stage.ApplyMigration(change.moves, change.step.expanded_to);
      if (moved.ok() && change.step.releases()) {
        moved = ShrinkToSurvivors(change.step, stage, &*transport);
      }
      if (!moved.ok()) {
        source->Failed(change, moved);
        return moved;
      }
      const bool is_rank0 = *transport != nullptr && (*transport)->rank() == 0;
      source->Applied(iter, change, was_rank0 || (change.step.releases() && is_rank0));
      if (timeline && timeline->Covers(iter)) {
        timeline->Instant("plan applied", iter,
                          absl::StrCat("boundaries ", absl::StrJoin(change.step.to.boundaries, ",")));
      }
      layout = change.step.to;
      layout_changed = true;
      *boundaries = layout.boundaries;
      epoch = change.epoch ? static_cast<int64_t>(*change.epoch) : epoch + 1;
      if (*transport == nullptr) {
        // Its layers left with the plan: give their cached blocks back
        // before serving the coordinator or exiting.
        EmptyDeviceCache(*device);
        return LeaveReleased(config, env, pos.stage, iter, change.by, link);
      }
    }
    const int active_pp = static_cast<int>(layout.active_stages.size());
    StageIterationStats stats;
    if (absl::Status s = stage.RunIteration(iter, &stats); !s.ok()) return s;
    // The step's wall time on this rank, as its report's iteration_s (the
    // probe and the summary's all-reduce left out).
    const double run_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeline && iter + 1 >= config.perfetto_first + config.perfetto_iterations) {
      if (absl::Status s = write_timeline(); !s.ok()) return s;
    }
    // The speed probe, timed like the layers: every few iterations while the
    // rank is watched (its start, a move in its layers' time), seldom
    // otherwise.
    double layer_s = 0;
    for (double t : stats.forward_s) layer_s += t;
    for (double t : stats.backward_s) layer_s += t;
    const double probe_s =
        probe_cadence.ShouldProbe(iter, layer_s, layout_changed) ? probe.Run() : 0;
    if (absl::Status s = reporter.Gather(iter, stage, stats, stage.TakeModelChanged(),
                                         active_pp, **transport, link.agent.get(), probe_s,
                                         run_s, sources);
        !s.ok()) {
      return s;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Outside the iteration's time.
    if (absl::Status s = MaybeSaveCheckpoint(config, iter, *boundaries, active_pp,
                                             pos.dp_rank, **transport, stage);
        !s.ok()) {
      return s;
    }
    if ((*transport)->rank() != 0) continue;
    if (absl::Status s = on_iteration(reporter.Record(iter, seconds, *boundaries, epoch,
                                                      (*transport)->world_size()));
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = write_timeline(); !s.ok()) return s;
  return (*transport)->Barrier();
}

}  // namespace dynmo::trainer
