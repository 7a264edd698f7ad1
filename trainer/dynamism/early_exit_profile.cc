#include "trainer/dynamism/early_exit_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "trainer/decoder_block.h"

namespace dynmo::trainer {

EarlyExitProfile::EarlyExitProfile(const TrainerConfig& config)
    : num_layers_(config.model.num_pipeline_layers()),
      event_delta_(config.model.dynamism.early_exit.event_delta),
      tokens_per_iteration_(static_cast<double>(config.dp) * config.microbatches *
                            config.micro_batch * config.model.seq_len),
      reported_(num_layers_, 1.0) {}

absl::Status EarlyExitProfile::AfterStep(int64_t iter, StageView& stage) {
  // Tokens that left at layer l's exit point, this iteration.
  torch::Tensor t = torch::zeros({num_layers_}, torch::kDouble);
  auto v = t.accessor<double, 1>();
  for (OwnedLayer& owned : stage.layers) {
    auto* block = dynamic_cast<DecoderBlock*>(owned.layer.get());
    if (block == nullptr || block->exit_head() == nullptr) continue;
    v[owned.layer->id()] = static_cast<double>(block->exit_head()->TakeCounts().second);
  }
  if (absl::Status s = stage.transport.AllReduceSumWorld(t); !s.ok()) return s;
  // In flight after l = in flight after l-1 minus those leaving at l.
  std::vector<double> profile(num_layers_, 1.0);
  double in_flight = 1.0, moved = 0;
  for (int l = 0; l < num_layers_; ++l) {
    in_flight -= v[l] / tokens_per_iteration_;
    profile[l] = in_flight;
    moved = std::max(moved, std::fabs(profile[l] - reported_[l]));
  }
  if (moved >= event_delta_) {
    changed_ = true;
    reported_ = profile;
    if (stage.transport.rank() == 0) {
      std::string p;
      for (int l = 1; l + 1 < num_layers_; ++l) {
        char value[32];
        std::snprintf(value, sizeof(value), "%.2f", profile[l]);
        absl::StrAppend(&p, l == 1 ? "" : " ", value);
      }
      std::cout << "dynmo-train: iteration " << iter
                << ": early exit: tokens in flight after blocks 1.." << num_layers_ - 2
                << ": " << p << std::endl;
    }
  }
  return absl::OkStatus();
}

bool EarlyExitProfile::TakeModelChanged() {
  const bool changed = changed_;
  changed_ = false;
  return changed;
}

}  // namespace dynmo::trainer
