#include "trainer/config/config.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/partition.h"
#include "trainer/layout/repack_layout.h"
#include "trainer/layout/reshape_layout.h"

namespace dynmo::trainer {

bool IsCudaDeviceName(absl::string_view name) {
  int index = -1;
  return absl::ConsumePrefix(&name, "cuda:") && absl::SimpleAtoi(name, &index) &&
         index >= 0 && index < 1024;
}

absl::Status ValidateConfig(const TrainerConfig& c, int world_size) {
  const ModelConfig& m = c.model;
  auto positive = [](absl::string_view flag, int64_t v) -> absl::Status {
    if (v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " must be >= 1, got ", v));
    }
    return absl::OkStatus();
  };
  for (auto [flag, v] : std::vector<std::pair<absl::string_view, int64_t>>{
           {"layers", m.num_blocks}, {"hidden", m.hidden}, {"heads", m.heads},
           {"seq_len", m.seq_len}, {"vocab", m.vocab},
           {"micro_batch", c.micro_batch}, {"microbatches", c.microbatches},
           {"steps", c.steps}, {"pp", c.pp}, {"dp", c.dp},
           {"log_interval", c.log_interval},
           {"intra_op_threads", c.intra_op_threads},
           {"timeout_s", c.timeout_s}}) {
    if (absl::Status s = positive(flag, v); !s.ok()) return s;
  }
  if (m.hidden % m.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hidden=", m.hidden, " is not divisible by --heads=", m.heads));
  }
  if (m.pipeline_units != "blocks" && m.pipeline_units != "halves") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline_units must be blocks or halves, got '", m.pipeline_units, "'"));
  }
  // The dynamic schemes select, route and prune whole blocks (block ids are
  // layer ids, a block's parts are one module): not supported on halves.
  if (m.halves() && !m.dynamism.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline_units=halves supports --dynamism=none only, got --dynamism=",
        absl::StrJoin(m.dynamism.cases, ",")));
  }
  if (!(c.lr > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--lr must be > 0, got ", c.lr));
  }
  if (absl::Status s = ValidateDynamismParameters(m.dynamism, m.seq_len); !s.ok()) {
    return s;
  }
  if (m.dynamism.Has("freezing")) {
    if (absl::Status s = ValidateFreezingConfig(m.dynamism.freezing,
                                                m.num_pipeline_layers());
        !s.ok()) {
      return s;
    }
  }
  if (m.dynamism.Has("early-exit")) {
    if (absl::Status s = ValidateEarlyExitConfig(m.dynamism.early_exit, m.num_blocks);
        !s.ok()) {
      return s;
    }
    if (m.dynamism.Has("mod")) {
      return absl::InvalidArgumentError(
          "--dynamism: early-exit and mod both pick the tokens a block runs; "
          "combine at most one of them");
    }
  }
  if (c.pp > m.num_pipeline_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pp=", c.pp, " stages but the model has only ",
        m.num_pipeline_layers(), " pipeline layers (--layers=", m.num_blocks,
        " blocks + embedding + head)"));
  }
  if (c.backend != "gloo" && c.backend != "nccl" && c.backend != "nccl-double") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--backend must be gloo, nccl or nccl-double, not '", c.backend, "'"));
  }
  if (c.device != "auto" && c.device != "cpu" && c.device != "cuda" &&
      !IsCudaDeviceName(c.device)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device must be auto, cpu, cuda or cuda:N, not '", c.device, "'"));
  }
  if (c.layer_clock != "wall" && c.layer_clock != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--layer_clock must be wall or cpu, not '", c.layer_clock, "'"));
  }
  if (c.pp * c.dp != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pp=", c.pp, " x --dp=", c.dp, " = ", c.pp * c.dp,
        " ranks but WORLD_SIZE=", world_size));
  }
  if (!c.initial_boundaries.empty()) {
    absl::Status s = core::ValidateBoundaries(
        c.initial_boundaries, m.num_pipeline_layers(), c.pp);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--initial_boundaries=", absl::StrJoin(c.initial_boundaries, ","),
          ": ", s.message()));
    }
  }
  if (c.test_migrate_every < 0) {
    return absl::InvalidArgumentError("--test_migrate_every must be >= 0");
  }
  if (c.test_migrate_every > 0 && c.test_migration_targets.empty()) {
    return absl::InvalidArgumentError(
        "--test_migrate_every needs --test_migration_boundaries");
  }
  if (!c.test_migration_stages.empty() &&
      c.test_migration_stages.size() != c.test_migration_targets.size()) {
    return absl::InternalError("test_migration_stages must match the targets");
  }
  // Walk the targets once from the starting layout, as the job will.
  StageLayout layout = InitialLayout(c.pp, {});
  for (size_t i = 0; i < c.test_migration_targets.size(); ++i) {
    LayoutTarget t;
    t.boundaries = c.test_migration_targets[i];
    if (!c.test_migration_stages.empty()) t.active_stages = c.test_migration_stages[i];
    StageLayout next = ResolveTarget(layout, t);
    if (absl::Status s = core::ValidateBoundaries(
            next.boundaries, m.num_pipeline_layers(),
            static_cast<int>(next.active_stages.size()));
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--test_migration_boundaries entry ", absl::StrJoin(next.boundaries, ","),
          ": ", s.message()));
    }
    layout.boundaries = core::PartitionUniform(m.num_pipeline_layers(),
                                               static_cast<int>(layout.active_stages.size()));
    absl::StatusOr<RepackStep> step =
        PlanRepackStep(layout, next, m.num_pipeline_layers(), c.dp);
    if (!step.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--test_migration_boundaries entry ", i + 1, ": ", step.status().message()));
    }
    layout = next;
  }
  if (c.test_reshape_at != 0) {
    if (c.test_migrate_every > 0) {
      return absl::InvalidArgumentError(
          "--test_reshape_at and --test_migrate_every cannot be combined");
    }
    if (c.test_reshape_at < 1) {
      return absl::InvalidArgumentError("--test_reshape_at: ITER must be >= 1");
    }
    absl::StatusOr<ReshapeStep> step = PlanReshapeStep(
        InitialLayout(c.pp, core::PartitionUniform(m.num_pipeline_layers(), c.pp)), c.dp,
        c.microbatches,
        ReshapeTarget{c.test_reshape_pp, c.test_reshape_dp, c.test_reshape_boundaries},
        m.num_pipeline_layers());
    if (!step.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--test_reshape_at: ", step.status().message()));
    }
  }
  if (c.save_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--save_every must be >= 0, got ", c.save_every));
  }
  if (c.save_every > 0 && c.save_dir.empty()) {
    return absl::InvalidArgumentError("--save_every needs --save_dir");
  }
  if (c.memory_capacity_bytes < 0) {
    return absl::InvalidArgumentError("--memory_capacity_gb must be >= 0");
  }
  if (c.coordinator_connect_timeout_s < 1) {
    return absl::InvalidArgumentError("--coordinator_connect_timeout_s must be >= 1");
  }
  if (!c.elastic.empty() && c.elastic != "release" && c.elastic != "reshape") {
    return absl::InvalidArgumentError(
        absl::StrCat("--elastic must be release or reshape, got '", c.elastic, "'"));
  }
  if (!(c.repack_tolerance >= 0 && c.repack_tolerance <= 10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--repack_tolerance must be in [0, 10], got ", c.repack_tolerance));
  }
  return absl::OkStatus();
}

int64_t LayerParameterCount(const ModelConfig& m, int id) {
  const int64_t h = m.hidden, v = m.vocab, t = m.seq_len;
  if (id == 0) return v * h + t * h;
  if (id == m.num_pipeline_layers() - 1) return 2 * h + h * v;
  // Two LayerNorms, qkv, attention output, MLP in and out (all with biases).
  const int64_t mlp = (h * 4 * h + 4 * h) + (4 * h * h + h);
  if (m.halves()) {  // a LayerNorm and the attention (odd ids) or the MLP
    return 2 * h + (id % 2 == 1 ? (h * 3 * h + 3 * h) + (h * h + h) : mlp);
  }
  int64_t count = 2 * (2 * h) + (h * 3 * h + 3 * h) + (h * h + h) + mlp;
  const DynamismConfig& d = m.dynamism;
  if (d.IsMoeBlock(id)) {
    // A bias-free router and E expert MLPs in place of the MLP.
    count += h * d.moe_experts + (d.moe_experts - 1) * mlp;
  }
  // The bias-free MoD router and its causal predictor (h -> h -> 1, biased).
  if (d.IsModBlock(id)) count += h + (h * h + h) + (h + 1);
  // An early-exit point: LayerNorm and a bias-free H -> vocab exit head.
  if (d.Has("early-exit") && d.early_exit.HasExitPoint(id, m.num_blocks)) {
    count += 2 * h + h * v;
  }
  return count;
}

absl::StatusOr<core::Boundaries> StartingBoundaries(const TrainerConfig& c) {
  const int n = c.model.num_pipeline_layers();
  if (c.initial_boundaries.empty()) {
    if (c.pp < 1 || c.pp > n) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot split ", n, " layers into ", c.pp, " stages"));
    }
    return core::PartitionUniform(n, c.pp);
  }
  if (absl::Status s = core::ValidateBoundaries(c.initial_boundaries, n, c.pp);
      !s.ok()) {
    return s;
  }
  return c.initial_boundaries;
}

RankPosition PositionOfRank(int rank, int dp) {
  return RankPosition{rank / dp, rank % dp};
}

int RankAt(int stage, int dp_rank, int dp) { return stage * dp + dp_rank; }

}  // namespace dynmo::trainer
