#include "core/realized_gain.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dynmo::core {
namespace {

// Median absolute deviation relative to the median; 0 for none.
double RelativeMad(const std::vector<double>& values, double median) {
  if (values.empty() || median <= 0) return 0;
  std::vector<double> dev;
  dev.reserve(values.size());
  for (double v : values) dev.push_back(std::fabs(v - median));
  return Median(std::move(dev)) / median;
}

}  // namespace

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<long>(mid));
  return (lower + upper) / 2;
}

void StepTimes::Add(int64_t iteration, double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds) || iteration < 0) return;
  // Reports arrive nearly in order: search from the back.
  auto it = times_.end();
  while (it != times_.begin() && std::prev(it)->first >= iteration) --it;
  if (it != times_.end() && it->first == iteration) {
    it->second = std::max(it->second, seconds);
    return;
  }
  if (it == times_.begin() && static_cast<int>(times_.size()) >= capacity_) return;  // too old
  if (first_ < 0 || iteration < first_) first_ = iteration;
  times_.insert(it, {iteration, seconds});
  while (static_cast<int>(times_.size()) > capacity_) times_.pop_front();
}

std::vector<double> StepTimes::Range(int64_t first, int64_t end) const {
  std::vector<double> out;
  for (const auto& [iteration, seconds] : times_) {
    if (iteration >= first && iteration < end) out.push_back(seconds);
  }
  return out;
}

int64_t AfterWindowEnd(int64_t apply_iteration, const GainWindows& windows) {
  return apply_iteration + windows.skip + windows.after;
}

std::optional<RealizedGain> MeasureRealizedGain(const StepTimes& steps,
                                                int64_t apply_iteration,
                                                const GainWindows& w) {
  const int64_t a = apply_iteration;
  const int64_t warm = steps.first() < 0 ? 0 : steps.first() + w.warmup;
  const std::vector<double> before =
      steps.Range(std::max(a - w.skip - w.before, warm), a - w.skip);
  const std::vector<double> after =
      steps.Range(std::max(a + w.skip + 1, warm), a + w.skip + 1 + w.after);
  if (static_cast<int>(before.size()) < w.min_samples ||
      static_cast<int>(after.size()) < w.min_samples) {
    return std::nullopt;
  }
  RealizedGain g;
  g.before_s = Median(before);
  g.after_s = Median(after);
  if (!(g.after_s > 0)) return std::nullopt;
  g.gain = g.before_s / g.after_s - 1;
  g.spread = std::max(RelativeMad(before, g.before_s), RelativeMad(after, g.after_s));
  g.samples_before = static_cast<int>(before.size());
  g.samples_after = static_cast<int>(after.size());
  return g;
}

void PredictionRecord::Add(double predicted_gain, const RealizedGain& realized) {
  shortfalls_.push_back(std::max(0.0, predicted_gain - realized.gain));
  spreads_.push_back(realized.spread);
  while (static_cast<int>(shortfalls_.size()) > capacity_) {
    shortfalls_.pop_front();
    spreads_.pop_front();
  }
}

std::optional<double> CurrentStepTime(const StepTimes& steps, int64_t since,
                                      const GainWindows& windows) {
  if (steps.first() < 0) return std::nullopt;
  const int64_t first = std::max(since, steps.first() + windows.warmup);
  std::vector<double> times = steps.Range(first, std::numeric_limits<int64_t>::max());
  if (static_cast<int>(times.size()) < std::max(1, windows.min_samples)) return std::nullopt;
  const size_t keep = static_cast<size_t>(std::max(1, windows.before));
  if (times.size() > keep) times.erase(times.begin(), times.end() - static_cast<long>(keep));
  return Median(std::move(times));
}

std::optional<double> PredictionRecord::MedianShortfall() const {
  if (shortfalls_.empty()) return std::nullopt;
  return Median({shortfalls_.begin(), shortfalls_.end()});
}

std::optional<double> PredictionRecord::MedianSpread() const {
  if (spreads_.empty()) return std::nullopt;
  return Median({spreads_.begin(), spreads_.end()});
}

}  // namespace dynmo::core
