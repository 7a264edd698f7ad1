#include "trainer/layout/reshape_layout.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/partition.h"
#include "trainer/layout/boundaries_text.h"

namespace dynmo::trainer {

int HolderBefore(const StageLayout& from, int dp, int layer, int replica) {
  const auto it =
      std::upper_bound(from.boundaries.begin(), from.boundaries.end(), layer);
  const int index = static_cast<int>(it - from.boundaries.begin()) - 1;
  return index * dp + replica % dp;
}

absl::StatusOr<ReshapeStep> PlanReshapeStep(const StageLayout& from, int dp,
                                            int microbatches,
                                            const ReshapeTarget& target,
                                            int num_layers) {
  const int old_n = static_cast<int>(from.active_stages.size());
  const int ranks = old_n * dp;
  const std::string shape = absl::StrCat("pp ", target.pp, " x dp ", target.dp);
  if (target.pp < 1 || target.dp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("re-shape to ", shape, ": pp and dp must be >= 1"));
  }
  if (target.pp * target.dp != ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "re-shape to ", shape, " needs ", target.pp * target.dp,
        " ranks but the job runs on ", ranks, " (", old_n, " stages x dp ", dp, ")"));
  }
  if (target.pp > num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("re-shape to ", shape, ": ", target.pp,
                                                   " stages for ", num_layers, " layers"));
  }
  if (absl::Status s = core::ValidateBoundaries(from.boundaries, num_layers, old_n);
      !s.ok()) {
    return absl::InternalError(absl::StrCat("running boundaries ",
                                            absl::StrJoin(from.boundaries, ","), ": ",
                                            s.message()));
  }
  const int global = dp * microbatches;
  if (global % target.dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "re-shape to ", shape, ": the global batch of ", global,
        " micro-batches (dp ", dp, " x ", microbatches,
        ") does not split evenly over ", target.dp, " replicas"));
  }
  ReshapeStep step;
  step.from = from;
  step.from_dp = dp;
  step.from_microbatches = microbatches;
  step.to_dp = target.dp;
  step.to_microbatches = global / target.dp;
  step.to.boundaries = target.boundaries.empty()
                           ? core::PartitionUniform(num_layers, target.pp)
                           : target.boundaries;
  for (int s = 0; s < target.pp; ++s) step.to.active_stages.push_back(s);
  if (absl::Status s = core::ValidateBoundaries(step.to.boundaries, num_layers, target.pp);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "re-shape to ", shape, ": boundaries ", absl::StrJoin(step.to.boundaries, ","),
        ": ", s.message()));
  }
  // The copies, in a fixed order (layer, receiving rank), then greedily put
  // into the first round where neither rank is busy yet.
  std::vector<LayerCopy> wanted;
  for (int p = 0; p < ranks; ++p) {
    const int stage = p / target.dp, replica = p % target.dp;
    step.stage_after.push_back(stage);
    step.replica_after.push_back(replica);
    const int first = step.to.boundaries[stage];
    const int last = step.to.boundaries[stage + 1];
    step.first_layer_after.push_back(first);
    step.last_layer_after.push_back(last);
    const int old_index = p / dp;
    for (int l = first; l < last; ++l) {
      const bool held = l >= from.boundaries[old_index] && l < from.boundaries[old_index + 1];
      if (held) continue;
      wanted.push_back({l, HolderBefore(from, dp, l, replica), p, 0});
    }
  }
  std::sort(wanted.begin(), wanted.end(), [](const LayerCopy& a, const LayerCopy& b) {
    return std::tie(a.layer, a.to_rank) < std::tie(b.layer, b.to_rank);
  });
  std::vector<std::vector<bool>> busy;  // [round][rank]
  for (LayerCopy& c : wanted) {
    int r = 0;
    while (r < static_cast<int>(busy.size()) && (busy[r][c.from_rank] || busy[r][c.to_rank])) {
      ++r;
    }
    if (r == static_cast<int>(busy.size())) busy.emplace_back(ranks, false);
    busy[r][c.from_rank] = busy[r][c.to_rank] = true;
    c.round = r;
  }
  std::stable_sort(wanted.begin(), wanted.end(), [](const LayerCopy& a, const LayerCopy& b) {
    return a.round < b.round;
  });
  step.copies = std::move(wanted);
  step.rounds = static_cast<int>(busy.size());
  return step;
}

absl::StatusOr<ReshapeAt> ParseReshapeAt(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--test_reshape_at='", text, "': ", why, " (expected ITER:PPxDP[:b0,b1,...])"));
  };
  if (parts.size() < 2 || parts.size() > 3) return bad("wrong number of ':' parts");
  ReshapeAt at;
  if (!absl::SimpleAtoi(parts[0], &at.iteration) || at.iteration < 1) {
    return bad("ITER must be an iteration >= 1");
  }
  const std::vector<absl::string_view> grid = absl::StrSplit(parts[1], 'x');
  if (grid.size() != 2 || !absl::SimpleAtoi(grid[0], &at.target.pp) ||
      !absl::SimpleAtoi(grid[1], &at.target.dp) || at.target.pp < 1 ||
      at.target.dp < 1) {
    return bad("PPxDP must be two positive integers, e.g. 2x2");
  }
  if (parts.size() == 3) {
    absl::StatusOr<core::Boundaries> b = ParseBoundaries(parts[2]);
    if (!b.ok()) return bad(b.status().message());
    at.target.boundaries = *b;
  }
  return at;
}

}  // namespace dynmo::trainer
