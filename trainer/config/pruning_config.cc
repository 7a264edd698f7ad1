#include "trainer/config/pruning_config.h"

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {

absl::Status ValidatePruningConfig(const PruningConfig& c) {
  if (c.start < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prune_start must be >= 0, got ", c.start));
  }
  if (c.end < c.start) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prune_end=", c.end, " is before --prune_start=", c.start));
  }
  if (c.every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prune_every must be >= 1, got ", c.every));
  }
  if ((c.end - c.start) % c.every != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prune_end - --prune_start = ", c.end - c.start,
        " is not a multiple of --prune_every=", c.every));
  }
  if (!(c.initial_sparsity >= 0 && c.initial_sparsity < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prune_initial_sparsity must be in [0, 1), got ", c.initial_sparsity));
  }
  if (!(c.final_sparsity >= c.initial_sparsity && c.final_sparsity < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prune_final_sparsity must be in [--prune_initial_sparsity, 1), got ",
        c.final_sparsity));
  }
  if (c.form != "timed" && c.form != "threshold") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prune_form must be timed or threshold, not '", c.form, "'"));
  }
  if (!(c.csr_min_sparsity >= 0 && c.csr_min_sparsity <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prune_csr_min_sparsity must be in [0, 1], got ", c.csr_min_sparsity));
  }
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
