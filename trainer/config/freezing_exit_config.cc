#include "trainer/config/freezing_exit_config.h"

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {

absl::Status ValidateFreezingConfig(const FreezingConfig& c, int num_pipeline_layers) {
  if (c.every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--freeze_every must be >= 1, got ", c.every));
  }
  if (c.window < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--freeze_window must be >= 1, got ", c.window));
  }
  if (!(c.threshold > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--freeze_threshold must be > 0, got ", c.threshold));
  }
  if (c.max_layers < 0 || c.max_layers > num_pipeline_layers - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--freeze_max_layers must be in [0, ", num_pipeline_layers - 1,
        "] (the head never freezes), got ", c.max_layers));
  }
  return absl::OkStatus();
}

absl::Status ValidateEarlyExitConfig(const EarlyExitConfig& c, int num_blocks) {
  if (c.after < 1 || c.after > num_blocks - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--exit_after must be a decoder block in [1, --layers-1=", num_blocks - 1,
        "] (the last block has no exit point), got ", c.after));
  }
  if (!(c.threshold >= 0 && c.threshold <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--exit_threshold must be in [0, 1], got ", c.threshold));
  }
  if (!(c.loss_weight >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--exit_loss_weight must be >= 0, got ", c.loss_weight));
  }
  if (c.warmup_iters < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--exit_warmup_iters must be >= 0, got ", c.warmup_iters));
  }
  if (!(c.event_delta > 0 && c.event_delta <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--exit_event_delta must be in (0, 1], got ", c.event_delta));
  }
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
