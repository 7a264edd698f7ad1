#include "core/smoothed_costs.h"

#include <cmath>

#include "core/rebalance_trigger.h"

namespace dynmo::core {

std::vector<LayerCost> MeanCosts(const std::vector<std::vector<LayerCost>>& records) {
  std::vector<LayerCost> out(records.front().size());
  const double k = static_cast<double>(records.size());
  for (size_t i = 0; i < out.size(); ++i) {
    double f = 0, b = 0, w = 0, params = 0, bytes = 0, act = 0;
    for (const auto& r : records) {
      f += r[i].fwd_s;
      b += r[i].bwd_s;
      w += r[i].wgrad_s;
      params += static_cast<double>(r[i].params);
      bytes += static_cast<double>(r[i].resident_bytes);
      act += static_cast<double>(r[i].activation_bytes);
    }
    out[i].id = static_cast<int>(i);
    out[i].fwd_s = f / k;
    out[i].bwd_s = b / k;
    out[i].wgrad_s = w / k;
    out[i].params = static_cast<int64_t>(std::llround(params / k));
    out[i].resident_bytes = static_cast<int64_t>(std::llround(bytes / k));
    out[i].activation_bytes = static_cast<int64_t>(std::llround(act / k));
  }
  return out;
}

std::vector<LayerCost> SmoothedCosts(const std::deque<std::vector<LayerCost>>& recent,
                                     double step_threshold) {
  std::vector<std::vector<LayerCost>> window = {recent.back()};
  std::vector<LayerCost> mean = recent.back();
  for (auto it = recent.rbegin() + 1; it != recent.rend(); ++it) {
    if (RelativeTimeChange(mean, *it) > step_threshold) break;
    window.push_back(*it);
    mean = MeanCosts(window);
  }
  return mean;
}

}  // namespace dynmo::core
