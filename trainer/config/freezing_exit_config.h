// The parameters of two §2.2 cases that change how deep the work goes, as
// plain structs held by DynamismConfig, with their validation (no LibTorch):
//
//   freezing    Egeria-like front-to-back layer freezing
//               (trainer/dynamism/freezing.h): every `every` iterations each
//               layer's plasticity is measured; a layer whose plasticity was
//               below `threshold` at `window` consecutive checks freezes,
//               strictly front to back, job-wide.
//   early-exit  CALM-style token exit (trainer/model/early_exit.h):
//               decoder blocks after..N-1 carry an exit point; a token whose
//               exit head is at least `threshold` confident leaves there.
//
// Thread-compatible value types.
#ifndef DYNMO_TRAINER_CONFIG_FREEZING_EXIT_CONFIG_H_
#define DYNMO_TRAINER_CONFIG_FREEZING_EXIT_CONFIG_H_

#include "absl/status/status.h"

namespace dynmo::trainer {

struct FreezingConfig {
  // --freeze_every: iterations between plasticity checks (the window one
  // plasticity value measures).
  int every = 10;
  // --freeze_window: consecutive checks a layer's plasticity must stay
  // below the threshold before it freezes (Egeria's tolerance window).
  int window = 2;
  // --freeze_threshold: normalised plasticity (relative parameter change over
  // the last check interval, divided by the same at the layer's first
  // check), so 0.3 = "moves less than 30% as fast as it did at first".
  double threshold = 0.3;
  // --freeze_max_layers: the most pipeline layers (from layer 0) that may
  // freeze; 0 = all but the head, which never freezes.
  int max_layers = 0;
};

struct EarlyExitConfig {
  // --exit_after: the first decoder block (1..N-1) with an exit point;
  // blocks before it are the warm-up every token runs through.
  int after = 2;
  // --exit_threshold: a token exits at an exit point when its exit head's
  // top softmax probability is at least this (CALM's softmax response).
  double threshold = 0.9;
  // --exit_loss_weight: weight of each exit point's cross-entropy (over the
  // tokens in flight there) in the training objective.
  double loss_weight = 0.1;
  // --exit_event_delta: the exit profile (fraction of tokens still in
  // flight after each exit point, job-wide) must move by at least this
  // since the last event to report "model changed" to the coordinator.
  double event_delta = 0.05;
  // --exit_warmup_iters: iterations before any token may exit (the exit
  // heads train from the start, so they are confident when exits begin).
  int warmup_iters = 0;
  // Whether decoder block `block_id` (1..num_blocks) has an exit point.
  bool HasExitPoint(int block_id, int num_blocks) const {
    return block_id >= after && block_id <= num_blocks - 1;
  }
};

// Errors name the offending flag.
absl::Status ValidateFreezingConfig(const FreezingConfig& c, int num_pipeline_layers);
absl::Status ValidateEarlyExitConfig(const EarlyExitConfig& c, int num_blocks);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_CONFIG_FREEZING_EXIT_CONFIG_H_
