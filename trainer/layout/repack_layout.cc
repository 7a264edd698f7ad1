#include "trainer/layout/repack_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "trainer/layout/boundaries_text.h"

namespace dynmo::trainer {

StageLayout InitialLayout(int pp, const core::Boundaries& boundaries) {
  StageLayout l;
  for (int s = 0; s < pp; ++s) l.active_stages.push_back(s);
  l.boundaries = boundaries;
  return l;
}

absl::StatusOr<RepackStep> PlanRepackStep(const StageLayout& from,
                                          const StageLayout& to, int num_layers,
                                          int dp) {
  const int old_n = static_cast<int>(from.active_stages.size());
  const int new_n = static_cast<int>(to.active_stages.size());
  if (new_n == 0) return absl::InvalidArgumentError("no active stage left");
  if (absl::Status s = core::ValidateBoundaries(to.boundaries, num_layers, new_n);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("boundaries ", absl::StrJoin(to.boundaries, ","), " over ",
                     new_n, " active stages: ", s.message()));
  }
  RepackStep step;
  step.from = from;
  step.to = to;
  step.new_index.assign(old_n, -1);
  // `to`'s stages must be a subsequence of `from`'s: survivors keep their
  // pipeline order (neighbours stay neighbours, ids stay ids).
  std::vector<int> old_index_of_new(new_n);
  int i = 0;
  for (int k = 0; k < new_n; ++k) {
    while (i < old_n && from.active_stages[i] != to.active_stages[k]) ++i;
    if (i == old_n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "active stages ", absl::StrJoin(to.active_stages, ","),
          " are not a subsequence of the running stages ",
          absl::StrJoin(from.active_stages, ",")));
    }
    step.new_index[i] = k;
    old_index_of_new[k] = i;
    ++i;
  }
  // Boundaries over the current indices: released stages get empty ranges
  // at the position where they sat.
  step.expanded_to.assign(old_n + 1, 0);
  for (int o = 0; o < old_n; ++o) {
    const int k = step.new_index[o];
    step.expanded_to[o] = k >= 0 ? to.boundaries[k] : -1;
  }
  step.expanded_to[old_n] = num_layers;
  for (int o = old_n - 1; o >= 0; --o) {
    if (step.expanded_to[o] < 0) step.expanded_to[o] = step.expanded_to[o + 1];
  }
  // A released prefix starts (and stays) empty at layer 0.
  for (int o = 0; o < old_n && step.new_index[o] < 0; ++o) step.expanded_to[o] = 0;
  step.expanded_to[0] = 0;
  step.new_rank.assign(static_cast<size_t>(old_n) * dp, -1);
  for (int o = 0; o < old_n; ++o) {
    if (step.new_index[o] < 0) continue;
    for (int d = 0; d < dp; ++d) step.new_rank[o * dp + d] = step.new_index[o] * dp + d;
  }
  for (int o = 0; o < old_n; ++o) {
    for (int l = from.boundaries[o]; l < from.boundaries[o + 1]; ++l) {
      step.owner_before.push_back(o);
    }
  }
  step.owner_after.assign(num_layers, -1);
  for (int o = 0; o < old_n; ++o) {
    for (int l = step.expanded_to[o]; l < step.expanded_to[o + 1]; ++l) {
      step.owner_after[l] = o;
    }
  }
  if (static_cast<int>(step.owner_before.size()) != num_layers) {
    return absl::InternalError(absl::StrCat(
        "running boundaries ", absl::StrJoin(from.boundaries, ","), " do not cover ",
        num_layers, " layers"));
  }
  return step;
}

absl::StatusOr<LayoutTarget> ParseLayoutTarget(absl::string_view text) {
  LayoutTarget t;
  absl::string_view b = text;
  if (size_t at = text.find('@'); at != absl::string_view::npos) {
    absl::StatusOr<core::Boundaries> stages = ParseBoundaries(text.substr(0, at));
    if (!stages.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage list before '@' must be comma-separated integers, got '", text, "'"));
    }
    if (stages->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("no stages before '@' in '", text, "'"));
    }
    t.active_stages = *stages;
    b = text.substr(at + 1);
  }
  absl::StatusOr<core::Boundaries> parsed = ParseBoundaries(b);
  if (!parsed.ok()) return parsed.status();
  t.boundaries = *parsed;
  return t;
}

StageLayout ResolveTarget(const StageLayout& current, const LayoutTarget& target) {
  StageLayout l;
  l.active_stages =
      target.active_stages.empty() ? current.active_stages : target.active_stages;
  l.boundaries = target.boundaries;
  return l;
}

}  // namespace dynmo::trainer
