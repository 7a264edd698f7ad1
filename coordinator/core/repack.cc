#include "coordinator/core/repack.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "coordinator/core/measures.h"
#include "coordinator/core/partition.h"
#include "coordinator/core/partition_internal.h"

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

PipelineModel Window(const PipelineModel& model, int first, int count) {
  PipelineModel sub;
  sub.layers = model.layers;
  sub.link = model.link;
  sub.stages.assign(model.stages.begin() + first,
                    model.stages.begin() + first + count);
  return sub;
}

struct Candidate {
  int first = 0;
  internal::ExactPartition part;
};

// The best partition over stages [first, first + count), with the tie-break
// keeping bytes on the stages that hold them in `current`.
absl::StatusOr<Candidate> SolveWindow(const PipelineModel& model,
                                      const std::optional<Boundaries>& current,
                                      int first, int count) {
  internal::CurrentRanges ranges;
  for (int t = 0; current && t < count; ++t) {
    ranges.push_back({(*current)[first + t], (*current)[first + t + 1]});
  }
  absl::StatusOr<internal::ExactPartition> part =
      internal::SolveExact(Window(model, first, count), ranges);
  if (!part.ok()) return part.status();
  return Candidate{first, *std::move(part)};
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
  const bool homogeneous = Homogeneous(model.stages);
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
    for (int first = 0; first <= last_first; ++first) {
      absl::StatusOr<Candidate> cand = SolveWindow(model, current, first, count);
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
  const int count = static_cast<int>(out.boundaries.size()) - 1;
  for (int s = 0; s < k; ++s) {
    CommSplit split{s, kReleasedColor, -1};
    if (s >= chosen->first && s < chosen->first + count) {
      out.active_stages.push_back(s);
      split.color = 0;
      split.key = s - chosen->first;
    } else {
      out.released_stages.push_back(s);
    }
    out.split.push_back(split);
  }
  if (current) {
    absl::StatusOr<MigrationPlan> plan =
        PlanMigration(model.layers, LayerOwners(*current),
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
