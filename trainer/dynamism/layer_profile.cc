#include "trainer/dynamism/layer_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {

LayerProfile::LayerProfile(std::vector<double> initial, double event_delta)
    : reported_(std::move(initial)), event_delta_(event_delta) {}

bool LayerProfile::Update(const std::vector<double>& values) {
  double moved = 0;
  for (size_t l = 0; l < values.size() && l < reported_.size(); ++l) {
    moved = std::max(moved, std::fabs(values[l] - reported_[l]));
  }
  if (moved < event_delta_) return false;
  reported_ = values;
  changed_ = true;
  return true;
}

bool LayerProfile::TakeChanged() {
  const bool changed = changed_;
  changed_ = false;
  return changed;
}

std::string LayerProfile::Format(int first, int last) const {
  std::string out;
  for (int l = first; l < last; ++l) {
    char value[32];
    std::snprintf(value, sizeof(value), "%.2f", reported_[l]);
    absl::StrAppend(&out, l == first ? "" : " ", value);
  }
  return out;
}

}  // namespace dynmo::trainer
