#include "trainer/config.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "coordinator/core/partition.h"

namespace dynmo::trainer {

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
  if (!(c.lr > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--lr must be > 0, got ", c.lr));
  }
  if (c.pp > m.num_pipeline_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pp=", c.pp, " stages but the model has only ",
        m.num_pipeline_layers(), " pipeline layers (--layers=", m.num_blocks,
        " blocks + embedding + head)"));
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
  for (const core::Boundaries& b : c.test_migration_targets) {
    if (absl::Status s = core::ValidateBoundaries(b, m.num_pipeline_layers(), c.pp);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--test_migration_boundaries entry ", absl::StrJoin(b, ","), ": ",
          s.message()));
    }
  }
  return absl::OkStatus();
}

int64_t LayerParameterCount(const ModelConfig& m, int id) {
  const int64_t h = m.hidden, v = m.vocab, t = m.seq_len;
  if (id == 0) return v * h + t * h;
  if (id == m.num_pipeline_layers() - 1) return 2 * h + h * v;
  // Two LayerNorms, qkv, attention output, MLP in and out (all with biases).
  return 2 * (2 * h) + (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) +
         (4 * h * h + h);
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

absl::StatusOr<core::Boundaries> ParseBoundaries(absl::string_view text) {
  core::Boundaries b;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("boundaries must be comma-separated integers, got '",
                       text, "'"));
    }
    b.push_back(v);
  }
  return b;
}

RankPosition PositionOfRank(int rank, int dp) {
  return RankPosition{rank / dp, rank % dp};
}

int RankAt(int stage, int dp_rank, int dp) { return stage * dp + dp_rank; }

}  // namespace dynmo::trainer
