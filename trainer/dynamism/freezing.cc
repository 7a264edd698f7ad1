#include "trainer/dynamism/freezing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {

FreezeSchedule::FreezeSchedule(const FreezingConfig& config, int num_layers)
    : config_(config),
      limit_(config.max_layers > 0 ? std::min(config.max_layers, num_layers - 1)
                                   : num_layers - 1),
      first_change_(num_layers, 0.0),
      plasticity_(num_layers, std::numeric_limits<double>::quiet_NaN()),
      streak_(num_layers, 0) {}

int FreezeSchedule::Observe(const std::vector<double>& change,
                            const std::vector<bool>& known) {
  for (int l = prefix_; l < limit_; ++l) {
    if (!known[l]) continue;  // no measurement: the streak stands
    if (first_change_[l] == 0) first_change_[l] = change[l];
    plasticity_[l] = first_change_[l] > 0 ? change[l] / first_change_[l] : 0.0;
    streak_[l] = plasticity_[l] < config_.threshold ? streak_[l] + 1 : 0;
  }
  while (prefix_ < limit_ && streak_[prefix_] >= config_.window) ++prefix_;
  return prefix_;
}

namespace {

torch::Tensor FlatParameters(const OwnedLayer& owned) {
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& p : owned.layer->parameters()) {
    flat.push_back(p.detach().reshape({-1}));
  }
  return torch::cat(flat);
}

}  // namespace

Freezing::Freezing(const TrainerConfig& config)
    : every_(config.model.dynamism.freezing.every),
      num_layers_(config.model.num_pipeline_layers()),
      schedule_(config.model.dynamism.freezing, config.model.num_pipeline_layers()) {}

absl::Status Freezing::BeforeIteration(int64_t, StageView& stage) {
  const int prefix = schedule_.frozen_prefix();
  for (OwnedLayer& owned : stage.layers) {
    if (owned.layer->id() >= prefix) continue;
    for (torch::Tensor& p : owned.layer->parameters()) {
      p.requires_grad_(false);
      p.mutable_grad() = torch::Tensor();  // AdamW skips it; zero_grad too
    }
    reference_.erase(owned.layer->id());
  }
  if (stage.frozen_prefix != nullptr) *stage.frozen_prefix = prefix;
  changed_ = changed_ || pending_;
  pending_ = false;
  return absl::OkStatus();
}

absl::Status Freezing::AfterStep(int64_t iter, StageView& stage) {
  if ((iter + 1) % every_ != 0) return absl::OkStatus();
  return Check(iter, stage);
}

absl::Status Freezing::Check(int64_t iter, StageView& stage) {
  const int before = schedule_.frozen_prefix();
  // [relative change per layer, replicas that measured it], world sums: a
  // layer's dp replicas hold identical parameters, so the mean is exact.
  torch::Tensor t = torch::zeros({2 * num_layers_}, torch::kDouble);
  auto v = t.accessor<double, 1>();
  std::map<int, torch::Tensor> next;
  for (const OwnedLayer& owned : stage.layers) {
    const int id = owned.layer->id();
    if (id < before || id >= schedule_.limit()) continue;
    torch::Tensor now = FlatParameters(owned);
    auto ref = reference_.find(id);
    if (ref != reference_.end()) {
      // host-sync(event): at a freezing check (every few iterations, per candidate layer): how
      //   far its weights moved
      const double base = ref->second.norm().item<double>();
      const double moved = (now - ref->second).norm().item<double>();
      v[id] = base > 0 ? moved / base : 0.0;
      v[num_layers_ + id] = 1;
    }
    next[id] = std::move(now);
  }
  reference_ = std::move(next);
  // host-sync(event): at a freezing check: the layers' relative changes, summed over the
  //   world
  if (absl::Status s = stage.transport.AllReduceSumWorld(t); !s.ok()) return s;
  std::vector<double> change(num_layers_);
  std::vector<bool> known(num_layers_);
  // The job's dp now (a re-shape may have changed it).
  const int dp = stage.config.dp;
  for (int l = 0; l < num_layers_; ++l) {
    known[l] = v[num_layers_ + l] == dp;
    change[l] = known[l] ? v[l] / dp : 0.0;
  }
  const int after = schedule_.Observe(change, known);
  if (after > before) {
    pending_ = true;
    if (stage.transport.rank() == 0) {
      std::string p;
      for (int l = before; l < after; ++l) {
        char value[32];
        std::snprintf(value, sizeof(value), "%.3f", schedule_.plasticity(l));
        absl::StrAppend(&p, l == before ? "" : " ", value);
      }
      std::cout << "dynmo-train: iteration " << iter << ": froze layers " << before
                << ".." << after - 1 << " (plasticity " << p << "); frozen prefix "
                << after << " of " << num_layers_ << std::endl;
    }
  }
  return absl::OkStatus();
}

bool Freezing::TakeModelChanged() {
  const bool changed = changed_;
  changed_ = false;
  return changed;
}

}  // namespace dynmo::trainer
