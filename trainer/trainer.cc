#include "trainer/trainer.h"

#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <iostream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "agent/embedded_coordinator.h"
#include "coordinator/core/migration.h"
#include "dynmo/v1/operator.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "trainer/pipeline_stage.h"
#include "trainer/token_corpus.h"
#include "trainer/transport.h"

namespace dynmo::trainer {
namespace {

// The coordinator side of one rank: the agent, and on rank 0 of an
// "embedded" job the coordinator itself (destroyed after the agent).
struct AgentLink {
  std::unique_ptr<agent::EmbeddedCoordinator> embedded;
  std::unique_ptr<agent::Agent> agent;
  ~AgentLink() {
    if (agent != nullptr) agent->Stop();
    agent.reset();
    if (embedded != nullptr) embedded->Shutdown();
  }
};

// Sets the job's balancer/trigger through the OperatorService (rank 0, once
// its agent registered the job). A policy the coordinator rejects is an
// error; an unreachable coordinator only a warning (training goes on).
absl::Status SetJobPolicy(const TrainerConfig& config, const std::string& address,
                          agent::Agent& agent) {
  if (config.balancer.empty() && config.trigger.empty()) return absl::OkStatus();
  if (!agent.WaitConnected(absl::Seconds(10))) {
    std::cerr << "dynmo-train: warning: coordinator " << address
              << " not reachable; policy not set" << std::endl;
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      agent::MakeChannel(address, agent::ChannelOptions{});
  if (!channel.ok()) return channel.status();
  auto stub = dynmo::v1::OperatorService::NewStub(*channel);
  dynmo::v1::SetPolicyRequest req;
  req.set_job(config.job);
  req.mutable_policy()->set_balancer(config.balancer);
  req.mutable_policy()->set_trigger(config.trigger);
  grpc::Status s;
  for (int attempt = 0; attempt < 20; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    dynmo::v1::SetPolicyResponse resp;
    s = stub->SetPolicy(&ctx, req, &resp);
    if (s.ok()) return absl::OkStatus();
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      return absl::InvalidArgumentError(
          absl::StrCat("--balancer/--trigger: ", s.error_message()));
    }
    if (s.error_code() != grpc::StatusCode::NOT_FOUND &&
        s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      break;
    }
    usleep(100 * 1000);  // the job appears once a rank registered
  }
  std::cerr << "dynmo-train: warning: SetPolicy at " << address << ": "
            << s.error_message() << std::endl;
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
      service::ServerOptions options;
      options.coordinator.job.plan_lead_iterations = 5;
      absl::StatusOr<std::unique_ptr<agent::EmbeddedCoordinator>> started =
          agent::EmbeddedCoordinator::Start(options);
      if (!started.ok()) {
        return absl::Status(started.status().code(),
                            absl::StrCat("cannot start the embedded coordinator: ",
                                         started.status().message()));
      }
      link->embedded = *std::move(started);
      port.accessor<double, 1>()[0] = link->embedded->server().port();
    }
    if (absl::Status s = transport.AllReduceSumWorld(port); !s.ok()) return s;
    address = absl::StrCat("127.0.0.1:", static_cast<int>(port.accessor<double, 1>()[0]));
  }
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
  if (env.rank == 0) return SetJobPolicy(config, address, *link->agent);
  return absl::OkStatus();
}

// At the boundary before `iter`: the plan due now, if any, after the in-band
// agreement. Every rank calls this at every iteration (it is a collective).
// The MIN all-reduce of the held epoch is done with the world sum: with
// [holds, epoch, epoch^2] summed, every rank holds epoch e exactly when the
// count is the world size, the sum W*e and the sum of squares W*e^2 (zero
// variance), i.e. when MIN == MAX == e. Returns the plan to apply, or nullopt
// (after acknowledging a held plan as failed).
absl::StatusOr<std::optional<dynmo::v1::Plan>> AgreeOnPlan(
    agent::Agent& agent, Transport& transport, int64_t iter, int pp,
    int num_layers) {
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
  auto fail = [&](const std::string& why) -> std::optional<dynmo::v1::Plan> {
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
  bool identity_stages = due->active_stages_size() == 0 ||
                         due->active_stages_size() == pp;
  for (int i = 0; identity_stages && i < due->active_stages_size(); ++i) {
    identity_stages = due->active_stages(i) == i;
  }
  if (due->released_stages_size() > 0 || !identity_stages) {
    return fail("plan releases ranks (re-packing), which dynmo-train does not support");
  }
  if (due->boundaries_size() != pp + 1 || due->boundaries(0) != 0 ||
      due->boundaries(pp) != num_layers) {
    return fail(absl::StrCat("plan boundaries ", absl::StrJoin(due->boundaries(), ","),
                             " do not partition ", num_layers, " layers over ",
                             pp, " stages"));
  }
  for (int s = 0; s < pp; ++s) {
    if (due->boundaries(s + 1) <= due->boundaries(s)) {
      return fail(absl::StrCat("plan boundaries ", absl::StrJoin(due->boundaries(), ","),
                               " leave a stage empty"));
    }
  }
  return due;
}

}  // namespace

absl::Status RunTraining(const TrainerConfig& config, const DistEnv& env,
                         const IterationCallback& on_iteration) {
  // Deterministic CPU kernels need a fixed thread count.
  at::set_num_threads(config.intra_op_threads);

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

  absl::StatusOr<std::unique_ptr<Transport>> transport = ConnectGlooTransport(
      env, TransportOptions{config.dp, config.timeout_s});
  if (!transport.ok()) return transport.status();

  const RankPosition pos = PositionOfRank(env.rank, config.dp);
  PipelineStage stage(config, *boundaries, pos.stage, pos.dp_rank,
                      transport->get(), corpus->get());

  const int num_layers = config.model.num_pipeline_layers();
  const double tokens_per_iteration = static_cast<double>(config.dp) *
                                      config.microbatches * config.micro_batch *
                                      config.model.seq_len;
  const bool last_stage = pos.stage == config.pp - 1;
  std::vector<core::LayerCost> layer_costs(num_layers);
  for (int l = 0; l < num_layers; ++l) {
    layer_costs[l].id = l;
    layer_costs[l].params = LayerParameterCount(config.model, l);
    // fp32 weights, gradients, exp_avg and exp_avg_sq.
    layer_costs[l].resident_bytes = 16 * layer_costs[l].params;
  }
  AgentLink link;
  if (absl::Status s = StartAgent(config, env, **transport, *boundaries, &link);
      !s.ok()) {
    return s;
  }
  int64_t epoch = 0;
  for (int64_t iter = 0; iter < config.steps; ++iter) {
    const auto start = std::chrono::steady_clock::now();
    if (config.test_migrate_every > 0 && iter > 0 &&
        iter % config.test_migrate_every == 0) {
      const auto& targets = config.test_migration_targets;
      const core::Boundaries& next =
          targets[(iter / config.test_migrate_every - 1) % targets.size()];
      absl::StatusOr<core::MigrationPlan> plan =
          core::PlanMigrationBetween(layer_costs, *boundaries, next);
      if (!plan.ok()) return plan.status();
      if (absl::Status s = stage.ApplyMigration(*plan, next); !s.ok()) return s;
      *boundaries = next;
      ++epoch;
    }
    if (link.agent != nullptr) {
      absl::StatusOr<std::optional<dynmo::v1::Plan>> plan = AgreeOnPlan(
          *link.agent, **transport, iter, config.pp, num_layers);
      if (!plan.ok()) return plan.status();
      if (plan->has_value()) {
        const dynmo::v1::Plan& p = **plan;
        core::Boundaries next(p.boundaries().begin(), p.boundaries().end());
        absl::StatusOr<core::MigrationPlan> moves =
            core::PlanMigrationBetween(layer_costs, *boundaries, next);
        if (!moves.ok()) {
          (void)link.agent->Acknowledge(p.epoch(), false,
                                        std::string(moves.status().message()));
        } else {
          if (absl::Status s = stage.ApplyMigration(*moves, next); !s.ok()) {
            (void)link.agent->Acknowledge(p.epoch(), false, std::string(s.message()));
            return s;
          }
          if (env.rank == 0) {
            std::cout << "dynmo-train: iteration " << iter << ": applied plan epoch "
                      << p.epoch() << " (" << p.reason() << "), boundaries "
                      << absl::StrJoin(*boundaries, ",") << " -> "
                      << absl::StrJoin(next, ",") << std::endl;
          }
          *boundaries = next;
          epoch = static_cast<int64_t>(p.epoch());
          (void)link.agent->Acknowledge(p.epoch(), true);
        }
      }
    }
    StageIterationStats stats;
    if (absl::Status s = stage.RunIteration(iter, &stats); !s.ok()) return s;

    // [mean loss of this replica, forward time per layer, backward time per
    // layer], summed over the world: each layer has dp owners, each replica
    // one last stage, so dividing by dp gives replica means.
    torch::Tensor summary = torch::zeros({1 + 2 * num_layers}, torch::kDouble);
    auto values = summary.accessor<double, 1>();
    if (last_stage) values[0] = stats.loss_sum / config.microbatches;
    for (int i = 0; i < stage.num_local_layers(); ++i) {
      values[1 + stage.first_layer() + i] = stats.forward_s[i];
      values[1 + num_layers + stage.first_layer() + i] = stats.backward_s[i];
    }
    if (link.agent != nullptr) {
      // Per micro-batch, as the coordinator's cost model expects.
      agent::IterationSample sample;
      sample.iteration = iter;
      for (int i = 0; i < stage.num_local_layers(); ++i) {
        core::LayerCost c = layer_costs[stage.first_layer() + i];
        c.fwd_s = stats.forward_s[i] / config.microbatches;
        c.bwd_s = stats.backward_s[i] / config.microbatches;
        c.activation_bytes = static_cast<int64_t>(4) * config.micro_batch *
                             config.model.seq_len * config.model.hidden;
        sample.layers.push_back(c);
      }
      // Never blocks; a rejected sample only costs the coordinator data.
      (void)link.agent->ReportIteration(sample);
    }
    if (absl::Status s = (*transport)->AllReduceSumWorld(summary); !s.ok()) return s;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (env.rank != 0) continue;

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
    if (absl::Status s = on_iteration(record); !s.ok()) return s;
  }
  return (*transport)->Barrier();
}

}  // namespace dynmo::trainer
