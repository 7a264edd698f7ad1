#include "trainer/trainer.h"

#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "agent/operator_client.h"
#include "coordinator/core/migration.h"
#include "trainer/checkpoint.h"
#include "trainer/pipeline_stage.h"
#include "trainer/plan_step.h"
#include "trainer/repack.h"
#include "trainer/device.h"
#include "trainer/local_coordinator.h"
#include "trainer/open_token_corpus.h"
#include "trainer/stage_memory.h"
#include "trainer/token_corpus.h"
#include "trainer/transport.h"

namespace dynmo::trainer {
namespace {

// The coordinator side of one rank: the agent, and on rank 0 of an
// "embedded" job the local coordinator daemon (stopped after the agent).
struct AgentLink {
  std::unique_ptr<LocalCoordinator> embedded;
  std::unique_ptr<agent::Agent> agent;
  std::string address;
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
                          agent::Agent& agent) {
  if (config.balancer.empty() && config.trigger.empty() && !config.repack) {
    return absl::OkStatus();
  }
  if (!agent.WaitConnected(absl::Seconds(10))) {
    std::cerr << "dynmo-train: warning: coordinator " << address
              << " not reachable; policy not set" << std::endl;
    return absl::OkStatus();
  }
  absl::StatusOr<agent::OperatorClient> client =
      agent::OperatorClient::Connect(address, agent::ChannelOptions{});
  if (!client.ok()) return client.status();
  agent::JobPolicy policy;
  policy.balancer = config.balancer;
  policy.trigger = config.trigger;
  policy.repack = config.repack;
  policy.repack_tolerance = config.repack_tolerance;
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
    if (absl::Status s = transport.AllReduceSumWorld(port); !s.ok()) return s;
    address = absl::StrCat("127.0.0.1:", static_cast<int>(port.accessor<double, 1>()[0]));
  }
  link->address = address;
  const RankPosition pos = PositionOfRank(env.rank, config.dp);
  agent::AgentConfig ac;
  ac.coordinator = address;
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
      ",vocab=", config.model.vocab);
  ac.microbatches = config.microbatches;
  ac.schedule = "1f1b";
  absl::StatusOr<std::unique_ptr<agent::Agent>> a = agent::Agent::Start(ac);
  if (!a.ok()) return a.status();
  link->agent = *std::move(a);
  // Start-up is the one time a rank waits for the coordinator: a wrong
  // address must not pass silently. Once connected, the agent reconnects in
  // the background and training never waits on it again.
  if (!link->agent->WaitConnected(absl::Seconds(config.coordinator_connect_timeout_s))) {
    const std::string why = link->agent->stats().last_error;
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the DynMo coordinator at ", address, " within ",
        config.coordinator_connect_timeout_s, " s (--coordinator_connect_timeout_s)",
        why.empty() ? "" : absl::StrCat(": ", why),
        "; check --coordinator or run with --coordinator=none"));
  }
  if (env.rank == 0) return SetJobPolicy(config, address, *link->agent);
  return absl::OkStatus();
}

// At the boundary before `iter`: the plan due now, if any, after the in-band
// agreement. Every rank calls this at every iteration (it is a collective).
// The MIN all-reduce of the held epoch is done with the world sum: with
// [holds, epoch, epoch^2] summed, every rank holds epoch e exactly when the
// count is the world size, the sum W*e and the sum of squares W*e^2 (zero
// variance), i.e. when MIN == MAX == e. Returns the plan to apply with its
// layout step from `layout` (which may release stages), or nullopt (after
// acknowledging a held plan as failed).
struct AgreedPlan {
  dynmo::v1::Plan plan;
  PlanExecution execution;  // the step and the plan's own moves
};
absl::StatusOr<std::optional<AgreedPlan>> AgreeOnPlan(
    agent::Agent& agent, Transport& transport, int64_t iter,
    const StageLayout& layout, int num_layers, int dp,
    absl::Span<const core::LayerCost> layer_costs) {
  std::optional<dynmo::v1::Plan> due = agent.PlanToApplyAt(iter);
  torch::Tensor t = torch::zeros({3}, torch::kDouble);
  const double e = due ? static_cast<double>(due->epoch()) : 0;
  {
    auto v = t.accessor<double, 1>();
    v[0] = due ? 1 : 0;
    v[1] = e;
    v[2] = e * e;
  }
  if (absl::Status s = transport.AllReduceSumWorld(t); !s.ok()) return s;
  if (!due) return std::nullopt;
  auto v = t.accessor<double, 1>();
  const double w = transport.world_size();
  auto fail = [&](const std::string& why) -> std::optional<AgreedPlan> {
    std::cerr << "dynmo-train: rank " << transport.rank() << ": plan epoch "
              << due->epoch() << " not applied at iteration " << iter << ": "
              << why << std::endl;
    (void)agent.Acknowledge(due->epoch(), false, why);
    return std::nullopt;
  };
  if (v[0] != w || v[1] != w * e || v[2] != w * e * e) {
    return fail(absl::StrCat("in-band agreement failed: ", static_cast<int>(v[0]),
                             " of ", static_cast<int>(w), " ranks hold epoch ",
                             due->epoch()));
  }
  // Deterministic checks on a plan every rank holds: all decide alike.
  absl::StatusOr<PlanExecution> execution =
      ExecutionForPlan(*due, layout, num_layers, dp, layer_costs);
  if (!execution.ok()) return fail(std::string(execution.status().message()));
  return AgreedPlan{*std::move(due), *std::move(execution)};
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
        agent::OperatorClient::Connect(link.address, agent::ChannelOptions{});
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
  absl::StatusOr<std::unique_ptr<Transport>> transport =
      config.backend == "nccl" ? ConnectNcclTransport(env, transport_options)
                               : ConnectGlooTransport(env, transport_options);
  if (!transport.ok()) return transport.status();

  const RankPosition pos = PositionOfRank(env.rank, config.dp);
  PipelineStage stage(config, *boundaries, pos.stage, pos.dp_rank,
                      transport->get(), corpus->get());
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
      : device->is_cuda()              ? ReadDeviceMemory(*device).total_bytes
                                       : DefaultMemoryCapacityBytes();

  const int num_layers = config.model.num_pipeline_layers();
  const double tokens_per_iteration = static_cast<double>(config.dp) *
                                      config.microbatches * config.micro_batch *
                                      config.model.seq_len;
  // The running layout: re-packing may leave fewer stages (active_stages
  // are original stage ids) and renumbers the ranks over them.
  StageLayout layout = InitialLayout(config.pp, *boundaries);
  bool test_list_releases = false;
  for (const std::vector<int>& stages : config.test_migration_stages) {
    test_list_releases = test_list_releases ||
                         (!stages.empty() && static_cast<int>(stages.size()) < config.pp);
  }
  // What a migration plan counts as each layer's bytes (payload and memory
  // caps before the first measurement): fp32 weights, gradients, exp_avg
  // and exp_avg_sq. Every report carries the measured values instead.
  std::vector<core::LayerCost> layer_costs(num_layers);
  for (int l = 0; l < num_layers; ++l) {
    layer_costs[l].id = l;
    layer_costs[l].params = LayerParameterCount(config.model, l);
    layer_costs[l].resident_bytes = 16 * layer_costs[l].params;
  }
  // Parameters each local layer still has, recounted when the model or the
  // stage's layers changed (a mask count is a device sync on cuda).
  std::vector<int64_t> nonzero_params;
  std::vector<int> nonzero_ids;
  AgentLink link;
  if (absl::Status s = StartAgent(config, env, **transport, *boundaries, &link);
      !s.ok()) {
    return s;
  }
  int64_t epoch = 0;
  for (int64_t iter = first_iter; iter < config.steps; ++iter) {
    const auto start = std::chrono::steady_clock::now();
    const int64_t test_index = config.test_migrate_every > 0 && iter > 0 &&
                                       iter % config.test_migrate_every == 0
                                   ? iter / config.test_migrate_every - 1
                                   : -1;
    const auto& targets = config.test_migration_targets;
    if (test_index >= 0 &&
        (!test_list_releases || test_index < static_cast<int64_t>(targets.size()))) {
      // A list that releases stages is walked once; others cycle.
      const size_t k = static_cast<size_t>(test_index) % targets.size();
      LayoutTarget target;
      target.boundaries = targets[k];
      if (!config.test_migration_stages.empty()) {
        target.active_stages = config.test_migration_stages[k];
      }
      absl::StatusOr<RepackStep> step = PlanRepackStep(
          layout, ResolveTarget(layout, target), num_layers, config.dp);
      if (!step.ok()) return step.status();
      absl::StatusOr<core::MigrationPlan> moves =
          core::PlanMigration(layer_costs, step->owner_before, step->owner_after);
      if (!moves.ok()) return moves.status();
      if (absl::Status s = ApplyLayoutStep(*step, *moves, stage, &*transport); !s.ok()) {
        return s;
      }
      layout = step->to;
      *boundaries = layout.boundaries;
      ++epoch;
      if (*transport == nullptr) {
        return LeaveReleased(config, env, pos.stage, iter, "the test policy", link);
      }
    }
    if (link.agent != nullptr) {
      absl::StatusOr<std::optional<AgreedPlan>> agreed = AgreeOnPlan(
          *link.agent, **transport, iter, layout, num_layers, config.dp, layer_costs);
      if (!agreed.ok()) return agreed.status();
      if (agreed->has_value()) {
        const dynmo::v1::Plan& p = (*agreed)->plan;
        const RepackStep& step = (*agreed)->execution.step;
        const bool was_rank0 = (*transport)->rank() == 0;
        if (absl::Status s = ApplyLayoutStep(step, (*agreed)->execution.moves, stage,
                                             &*transport);
            !s.ok()) {
          (void)link.agent->Acknowledge(p.epoch(), false, std::string(s.message()));
          return s;
        }
        const bool is_rank0 = *transport != nullptr && (*transport)->rank() == 0;
        if (was_rank0 || (step.releases() && is_rank0)) {
          std::cout << "dynmo-train: iteration " << iter << ": applied plan epoch "
                    << p.epoch() << " (" << p.reason() << "), boundaries "
                    << absl::StrJoin(*boundaries, ",") << " -> "
                    << absl::StrJoin(step.to.boundaries, ",");
          if (step.releases()) {
            std::cout << ", stages " << absl::StrJoin(step.from.active_stages, ",")
                      << " -> " << absl::StrJoin(step.to.active_stages, ",")
                      << " (re-packed: released "
                      << absl::StrJoin(p.released_stages(), ",") << ")";
          }
          std::cout << std::endl;
        }
        layout = step.to;
        *boundaries = layout.boundaries;
        epoch = static_cast<int64_t>(p.epoch());
        (void)link.agent->Acknowledge(p.epoch(), true);
        if (*transport == nullptr) {
          return LeaveReleased(config, env, pos.stage, iter,
                               absl::StrCat("plan epoch ", p.epoch()), link);
        }
      }
    }
    // Where this rank runs now (re-packing renumbers the survivors).
    const int active_pp = static_cast<int>(layout.active_stages.size());
    const int my_stage = (*transport)->rank() / config.dp;
    const bool last_stage = my_stage == active_pp - 1;
    const bool rank0 = (*transport)->rank() == 0;
    StageIterationStats stats;
    if (absl::Status s = stage.RunIteration(iter, &stats); !s.ok()) return s;
    const bool model_changed = stage.TakeModelChanged();

    std::vector<int> local_ids;
    for (int i = 0; i < stage.num_local_layers(); ++i) {
      local_ids.push_back(stage.first_layer() + i);
    }
    if (model_changed || local_ids != nonzero_ids) {
      nonzero_ids = local_ids;
      nonzero_params.clear();
      for (const OwnedLayer& owned : stage.layers()) {
        nonzero_params.push_back(LayerNonZeroParameters(owned));
      }
    }

    // [mean loss of this replica, then per layer: forward time, backward
    // time, resident bytes, weight-gradient time, activation bytes,
    // parameters; then memory used per stage], summed over the world: each
    // layer has dp owners, each replica one last stage, so dividing by dp
    // gives replica means.
    const int wgrad_at = 1 + 3 * num_layers;
    const int activation_at = 1 + 4 * num_layers;
    const int params_at = 1 + 5 * num_layers;
    const int memory_at = 1 + 6 * num_layers;  // per-stage memory
    // The last slot counts the ranks whose model changed this iteration.
    const int changed_at = memory_at + active_pp;
    torch::Tensor summary = torch::zeros({changed_at + 1}, torch::kDouble);
    auto values = summary.accessor<double, 1>();
    if (last_stage) values[0] = stats.loss_sum / config.microbatches;
    int64_t memory_used = stats.peak_stash_bytes;  // stage_memory.h
    for (int i = 0; i < stage.num_local_layers(); ++i) {
      values[1 + stage.first_layer() + i] = stats.forward_s[i];
      values[1 + num_layers + stage.first_layer() + i] = stats.backward_s[i];
      const int64_t resident = LayerResidentBytes(stage.layers()[i]);
      values[1 + 2 * num_layers + stage.first_layer() + i] = static_cast<double>(resident);
      values[wgrad_at + stage.first_layer() + i] = stats.weight_grad_s[i];
      values[activation_at + stage.first_layer() + i] =
          static_cast<double>(stats.activation_bytes[i]);
      values[params_at + stage.first_layer() + i] =
          static_cast<double>(nonzero_params[i]);
      memory_used += resident;
    }
    // On a GPU the caching allocator knows the truth: the iteration's peak
    // of live tensors (every activation autograd saved included).
    if (device->is_cuda()) {
      memory_used = ReadDeviceMemory(*device).peak_allocated_bytes;
      ResetPeakDeviceMemory(*device);
    }
    values[memory_at + my_stage] = static_cast<double>(memory_used);
    values[changed_at] = model_changed ? 1.0 : 0.0;
    if (link.agent != nullptr) {
      // Per micro-batch, as the coordinator's cost model expects.
      agent::IterationSample sample;
      sample.iteration = iter;
      for (int i = 0; i < stage.num_local_layers(); ++i) {
        const int l = stage.first_layer() + i;
        core::LayerCost c;
        c.id = l;
        c.fwd_s = stats.forward_s[i] / config.microbatches;
        c.bwd_s = (stats.backward_s[i] - stats.weight_grad_s[i]) / config.microbatches;
        c.wgrad_s = stats.weight_grad_s[i] / config.microbatches;
        c.params = nonzero_params[i];
        c.resident_bytes = static_cast<int64_t>(values[1 + 2 * num_layers + l]);
        c.activation_bytes = stats.activation_bytes[i];
        sample.layers.push_back(c);
      }
      sample.model_changed = model_changed;
      sample.memory_used_bytes = memory_used;
      sample.memory_capacity_bytes = memory_capacity;
      // Never blocks; a rejected sample only costs the coordinator data.
      (void)link.agent->ReportIteration(sample);
    }
    if (absl::Status s = (*transport)->AllReduceSumWorld(summary); !s.ok()) return s;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!config.save_dir.empty() &&
        (config.save_every > 0 ? (iter + 1) % config.save_every == 0
                               : iter + 1 == config.steps)) {
      // Outside the iteration's time; the checkpoint's k = iterations done.
      const std::string dir = CheckpointDir(config.save_dir, iter + 1);
      CheckpointManifest manifest = ManifestFor(config, iter + 1, *boundaries);
      manifest.saved_pp = active_pp;  // after any re-packing
      if (absl::Status s = SaveCheckpoint(**transport, dir, stage.layers(),
                                          pos.dp_rank == 0,
                                          rank0 ? &manifest : nullptr);
          !s.ok()) {
        return s;
      }
      if (rank0) std::cout << "dynmo-train: saved checkpoint " << dir << std::endl;
    }
    if (!rank0) continue;

    summary.div_(config.dp);
    IterationRecord record;
    record.iter = iter;
    record.loss = values[0];
    record.iteration_s = seconds;
    record.tokens_per_s = tokens_per_iteration / seconds;
    for (int l = 0; l < num_layers; ++l) {
      record.layer_forward_s.push_back(values[1 + l]);
      record.layer_backward_s.push_back(values[1 + num_layers + l]);
    }
    record.boundaries = *boundaries;
    record.stage_times_s =
        StageTimes(record.boundaries, record.layer_forward_s, record.layer_backward_s);
    record.epoch = epoch;
    record.active_ranks = (*transport)->world_size();
    for (int l = 0; l < num_layers; ++l) {
      record.layer_memory_bytes.push_back(static_cast<int64_t>(values[1 + 2 * num_layers + l]));
      record.layer_weight_grad_s.push_back(values[wgrad_at + l]);
      record.layer_activation_bytes.push_back(std::llround(values[activation_at + l]));
      record.layer_params.push_back(std::llround(values[params_at + l]));
    }
    for (int st = 0; st < active_pp; ++st) {
      record.stage_memory_bytes.push_back(static_cast<int64_t>(values[memory_at + st]));
    }
    record.memory_capacity_bytes = memory_capacity;
    record.model_changed = values[changed_at] > 0;
    if (absl::Status s = on_iteration(record); !s.ok()) return s;
  }
  return (*transport)->Barrier();
}

}  // namespace dynmo::trainer
