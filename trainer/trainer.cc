#include "trainer/trainer.h"

#include <torch/torch.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "coordinator/core/migration.h"
#include "trainer/pipeline_stage.h"
#include "trainer/token_corpus.h"
#include "trainer/transport.h"

namespace dynmo::trainer {

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
