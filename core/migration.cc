#include "core/migration.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace dynmo::core {

std::vector<int> LayerOwners(absl::Span<const int> b,
                             absl::Span<const int> stage_ids) {
  std::vector<int> owners;
  if (b.empty()) return owners;
  owners.reserve(b.back());
  for (size_t s = 0; s + 1 < b.size(); ++s) {
    const int id = stage_ids.empty() ? static_cast<int>(s) : stage_ids[s];
    for (int l = b[s]; l < b[s + 1]; ++l) owners.push_back(id);
  }
  return owners;
}

absl::StatusOr<MigrationPlan> PlanMigration(absl::Span<const LayerCost> layers,
                                            absl::Span<const int> from,
                                            absl::Span<const int> to) {
  if (from.size() != layers.size() || to.size() != layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "owner maps cover ", from.size(), " and ", to.size(), " layers; the "
        "model has ", layers.size()));
  }
  MigrationPlan plan;
  // A stage takes part in at most one move per round: each move, in layer
  // order, takes the first round in which both its endpoints are free.
  std::map<int, std::vector<bool>> busy;  // stage -> round -> taken
  std::map<int, int> first_free;          // every earlier round is taken
  auto is_free = [&](int stage, int round) {
    const std::vector<bool>& b = busy[stage];
    return round >= static_cast<int>(b.size()) || !b[round];
  };
  auto take = [&](int stage, int round) {
    std::vector<bool>& b = busy[stage];
    if (round >= static_cast<int>(b.size())) b.resize(round + 1, false);
    b[round] = true;
    int& f = first_free[stage];
    while (f < static_cast<int>(b.size()) && b[f]) ++f;
  };
  for (size_t l = 0; l < layers.size(); ++l) {
    if (from[l] < 0 || to[l] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, " has a negative stage id"));
    }
    if (from[l] == to[l]) continue;
    LayerMigration m;
    m.layer = static_cast<int>(l);
    m.from_stage = from[l];
    m.to_stage = to[l];
    m.bytes = layers[l].resident_bytes;
    m.round = std::max(first_free[m.from_stage], first_free[m.to_stage]);
    while (!is_free(m.from_stage, m.round) || !is_free(m.to_stage, m.round)) {
      ++m.round;
    }
    take(m.from_stage, m.round);
    take(m.to_stage, m.round);
    plan.total_bytes += m.bytes;
    plan.rounds = std::max(plan.rounds, m.round + 1);
    plan.migrations.push_back(m);
  }
  std::stable_sort(plan.migrations.begin(), plan.migrations.end(),
                   [](const LayerMigration& a, const LayerMigration& b) {
                     return a.round != b.round ? a.round < b.round
                                               : a.layer < b.layer;
                   });
  return plan;
}

absl::StatusOr<MigrationPlan> PlanMigrationBetween(
    absl::Span<const LayerCost> layers, absl::Span<const int> from_b,
    absl::Span<const int> to_b) {
  if (from_b.size() != to_b.size()) {
    return absl::InvalidArgumentError(
        "both partitions must have the same number of stages");
  }
  const int n = static_cast<int>(layers.size());
  const int k = static_cast<int>(from_b.size()) - 1;
  if (absl::Status st = ValidateBoundaries(from_b, n, k); !st.ok()) return st;
  if (absl::Status st = ValidateBoundaries(to_b, n, k); !st.ok()) return st;
  return PlanMigration(layers, LayerOwners(from_b), LayerOwners(to_b));
}

}  // namespace dynmo::core
