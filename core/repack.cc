#include "core/repack.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/measures.h"
#include "core/partition.h"
#include "core/partition_internal.h"

namespace dynmo::core {
namespace {

bool Homogeneous(const std::vector<StageSpec>& stages) {
  for (const StageSpec& s : stages) {
    if (s.speed != stages[0].speed ||
        s.capacity_bytes != stages[0].capacity_bytes ||
        s.inflight_microbatches != stages[0].inflight_microbatches) {
      return false;
    }
  }
  return true;
}

// Stages that stay, in pipeline order (original indices).
using Survivors = std::vector<int>;

Survivors WindowStages(int first, int count) {
  Survivors s(static_cast<size_t>(count));
  for (int t = 0; t < count; ++t) s[static_cast<size_t>(t)] = first + t;
  return s;
}

// `model` on `stages` only.
PipelineModel Subset(const PipelineModel& model, const Survivors& stages) {
  PipelineModel sub;
  sub.layers = model.layers;
  sub.link = model.link;
  for (int s : stages) sub.stages.push_back(model.stages[static_cast<size_t>(s)]);
  return sub;
}

PipelineModel Window(const PipelineModel& model, int first, int count) {
  return Subset(model, WindowStages(first, count));
}

// The `count` fastest stages in pipeline order: the slowest are released
// first (ties: the later stage goes first, so equal speeds trim the tail).
Survivors FastestStages(const std::vector<StageSpec>& stages, int count) {
  std::vector<int> order(stages.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return stages[static_cast<size_t>(a)].speed > stages[static_cast<size_t>(b)].speed;
  });
  Survivors keep(order.begin(), order.begin() + count);
  std::sort(keep.begin(), keep.end());
  return keep;
}

bool SameSpeed(const std::vector<StageSpec>& stages) {
  for (const StageSpec& s : stages) {
    if (s.speed != stages[0].speed) return false;
  }
  return true;
}

struct Candidate {
  Survivors stages;
  internal::ExactPartition part;
};

// The best partition over `stages`, with the tie-break keeping bytes on the
// stages that hold them in `current`.
absl::StatusOr<Candidate> SolveSubset(const PipelineModel& model,
                                      const std::optional<Boundaries>& current,
                                      Survivors stages) {
  internal::CurrentRanges ranges;
  for (int s : stages) {
    if (current) ranges.push_back({(*current)[s], (*current)[s + 1]});
  }
  absl::StatusOr<internal::ExactPartition> part =
      internal::SolveExact(Subset(model, stages), ranges);
  if (!part.ok()) return part.status();
  return Candidate{std::move(stages), *std::move(part)};
}

absl::Status ValidateStageIds(const std::vector<int>& ids, int stages) {
  if (static_cast<int>(ids.size()) != stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "re-pack: ", ids.size(), " stage ids for ", stages, " stages"));
  }
  std::vector<int> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() < 0 || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError(
        "re-pack: stage ids must be distinct and >= 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RepackResult> RepackOptimal(const PipelineModel& model,
                                           const RepackOptions& options) {
  if (absl::Status st = ValidateModel(model); !st.ok()) return st;
  if (!(options.tolerance >= 0) ||
      options.tolerance == std::numeric_limits<double>::infinity()) {
    return absl::InvalidArgumentError("re-pack tolerance must be finite and >= 0");
  }
  const int n = static_cast<int>(model.layers.size());
  const int k = static_cast<int>(model.stages.size());
  // With more stages than layers there is no valid current layout to default
  // to: the layers are not placed yet, so nothing moves and nothing ties.
  std::optional<Boundaries> current = options.current;
  if (!current && k <= n) current = PartitionUniform(n, k);
  if (current) {
    if (absl::Status st = ValidateBoundaries(*current, n, k); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("current partition: ", st.message()));
    }
  }
  std::vector<int> ids = options.stage_ids;
  if (ids.empty()) {
    for (int s = 0; s < k; ++s) ids.push_back(s);
  } else if (absl::Status st = ValidateStageIds(ids, k); !st.ok()) {
    return st;
  }
  const bool homogeneous = Homogeneous(model.stages);
  const bool same_speed = SameSpeed(model.stages);
  // Reference: the best the pipeline can do with as many stages as it can use.
  const int widest = std::min(k, n);
  std::optional<double> reference;
  absl::Status reference_error;
  for (int first = 0; first + widest <= k; ++first) {
    absl::StatusOr<double> b = OptimalBottleneck(Window(model, first, widest));
    if (!b.ok()) {
      reference_error = b.status();
    } else if (!reference || *b < *reference) {
      reference = *b;
    }
    if (homogeneous) break;
  }
  if (!reference) return reference_error;
  const double own_optimum = *reference;
  if (options.reference_bottleneck) {
    if (!(*options.reference_bottleneck > 0) ||
        !std::isfinite(*options.reference_bottleneck)) {
      return absl::InvalidArgumentError(
          "re-pack reference bottleneck must be finite and > 0");
    }
    reference = *options.reference_bottleneck;
  }
  // The current stages' own optimum always qualifies (nothing released).
  const double limit = std::max(*reference * (1 + options.tolerance), own_optimum);

  std::optional<Candidate> chosen;
  for (int count = 1; count <= k && !chosen; ++count) {
    if (count > n) break;
    // Identical stages make every window equally fast: test one first.
    if (homogeneous) {
      absl::StatusOr<double> b = OptimalBottleneck(Window(model, 0, count));
      if (!b.ok() || *b > limit) continue;
    }
    // Identical stages and nothing placed yet: every window is the same.
    const int last_first = (homogeneous && !current) ? 0 : k - count;
    std::vector<Survivors> subsets;
    for (int first = 0; first <= last_first; ++first) {
      subsets.push_back(WindowStages(first, count));
    }
    // Ranks of different speeds: the survivors may also be the fastest
    // stages wherever they sit (a slow stage in the middle is released and
    // its neighbours join across the gap).
    if (!same_speed && count < k) subsets.push_back(FastestStages(model.stages, count));
    for (Survivors& stages : subsets) {
      absl::StatusOr<Candidate> cand = SolveSubset(model, current, std::move(stages));
      if (!cand.ok() || cand->part.bottleneck > limit) continue;
      if (!chosen || cand->part.bottleneck < chosen->part.bottleneck ||
          (cand->part.bottleneck == chosen->part.bottleneck &&
           cand->part.kept_bytes > chosen->part.kept_bytes)) {
        chosen = *std::move(cand);
      }
    }
  }
  if (!chosen) {
    return absl::InternalError("re-packing found no window, not even all stages");
  }
  RepackResult out;
  out.reference_bottleneck = *reference;
  out.bottleneck = chosen->part.bottleneck;
  out.boundaries = chosen->part.boundaries;
  std::vector<int> new_index(static_cast<size_t>(k), -1);
  for (size_t t = 0; t < chosen->stages.size(); ++t) {
    new_index[static_cast<size_t>(chosen->stages[t])] = static_cast<int>(t);
  }
  for (int s = 0; s < k; ++s) {
    const int key = new_index[static_cast<size_t>(s)];
    const int id = ids[static_cast<size_t>(s)];
    (key >= 0 ? out.active_stages : out.released_stages).push_back(id);
    out.split.push_back(CommSplit{id, key >= 0 ? 0 : kReleasedColor, key});
  }
  if (current) {
    absl::StatusOr<MigrationPlan> plan =
        PlanMigration(model.layers, LayerOwners(*current, ids),
                      LayerOwners(out.boundaries, out.active_stages));
    if (!plan.ok()) return plan.status();
    out.migration = *std::move(plan);
  }
  return out;
}

absl::StatusOr<FirstFitResult> RepackFirstFit(const PipelineModel& model,
                                              const Boundaries& current,
                                              int target_stages) {
  if (absl::Status st = ValidateModel(model); !st.ok()) return st;
  const int n = static_cast<int>(model.layers.size());
  const int k = static_cast<int>(model.stages.size());
  if (absl::Status st = ValidateBoundaries(current, n, k); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("current partition: ", st.message()));
  }
  if (target_stages < 1 || target_stages > k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target stage count ", target_stages, " must be in [1, ", k, "]"));
  }
  FirstFitResult out;
  out.layer_owner = LayerOwners(current);
  std::vector<int64_t> mem = StageMemoryUse(model, current);
  std::vector<bool> active(k, true);
  int num_active = k;
  for (int src = 0; src < k; ++src) {
    for (int dst = src + 1; dst < k; ++dst) {
      if (!active[src] || !active[dst] || num_active <= target_stages) continue;
      const int64_t cap = model.stages[dst].capacity_bytes;
      if (cap >= 0 && mem[src] + mem[dst] >= cap) continue;
      for (int& owner : out.layer_owner) {
        if (owner == src) owner = dst;
      }
      mem[dst] += mem[src];
      mem[src] = 0;
      active[src] = false;
      --num_active;
    }
  }
  for (int s = 0; s < k; ++s) {
    (active[s] ? out.active_stages : out.released_stages).push_back(s);
  }
  out.contiguous = std::is_sorted(out.layer_owner.begin(), out.layer_owner.end());
  absl::StatusOr<MigrationPlan> plan =
      PlanMigration(model.layers, LayerOwners(current), out.layer_owner);
  if (!plan.ok()) return plan.status();
  out.migration = *std::move(plan);
  return out;
}

}  // namespace dynmo::core
