#include "core/layer_overlap.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dynmo::core {
namespace {

bool Weight(double w) { return std::isfinite(w) && w > 0 && w <= 1; }

// The ranks one layer keeps times of (replicas and the ranks it moved
// from); the oldest beyond this are dropped, bounding memory by layers.
constexpr size_t kMaxRanksPerLayer = 32;

}  // namespace

absl::Status ValidateLayerOverlapOptions(const LayerOverlapOptions& o) {
  if (!Weight(o.smoothing) || !Weight(o.noise_smoothing)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "overlap smoothing weights must be in (0, 1], got ", o.smoothing, " and ",
        o.noise_smoothing));
  }
  if (o.settle < 0 || o.min_samples < 1 || o.gap < 1 || o.restart_after < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "overlap settle must be >= 0, min_samples, gap and restart_after >= 1, got ",
        o.settle, ", ", o.min_samples, ", ", o.gap, " and ", o.restart_after));
  }
  if (!std::isfinite(o.outlier_sigmas) || o.outlier_sigmas <= 0 ||
      !std::isfinite(o.outlier_floor) || o.outlier_floor <= 0) {
    return absl::InvalidArgumentError("overlap outlier_sigmas and outlier_floor must be > 0");
  }
  return absl::OkStatus();
}

LayerOverlaps::LayerOverlaps(int ranks, int layers, const LayerOverlapOptions& options)
    : options_(options),
      ranks_(std::max(ranks, 0)),
      layers_(static_cast<size_t>(std::max(layers, 0))) {}

void LayerOverlaps::Add(int rank, int layer, int64_t iteration, double seconds,
                        double reference_s) {
  if (!options_.enabled || rank < 0 || rank >= ranks_ || layer < 0 ||
      layer >= static_cast<int>(layers_.size()) || !std::isfinite(seconds) ||
      seconds <= 0 || !std::isfinite(reference_s) || reference_s <= 0) {
    return;
  }
  std::vector<Entry>& entries = layers_[static_cast<size_t>(layer)];
  auto it = std::find_if(entries.begin(), entries.end(),
                         [rank](const Entry& e) { return e.rank == rank; });
  if (it != entries.end() && (iteration < it->last || iteration - it->last > options_.gap)) {
    *it = Entry{rank, iteration};  // taken up again after a while (or time went back): afresh
  }
  if (it == entries.end()) {
    if (entries.size() >= kMaxRanksPerLayer) {
      entries.erase(std::min_element(entries.begin(), entries.end(),
                                     [](const Entry& x, const Entry& y) {
                                       return x.last < y.last;
                                     }));
    }
    entries.push_back(Entry{rank, iteration});
    it = entries.end() - 1;
  }
  Entry& e = *it;
  e.last = iteration;
  if (++e.seen <= options_.settle) return;  // settling
  const double u = std::log(seconds / reference_s);
  if (e.samples == 0) {
    e.mean = u;
    e.var = 0;
    e.samples = 1;
    return;
  }
  const double d = u - e.mean;
  if (e.samples >= options_.min_samples &&
      std::fabs(d) > std::max(std::log1p(options_.outlier_floor),
                              options_.outlier_sigmas * std::sqrt(e.var))) {
    // Not this entry's regime: an outlier, or a change the probes have not
    // caught up with yet (a throttle starting between probes). The entry is
    // in doubt until a time agrees again; enough in a row start it afresh.
    if (++e.outliers >= options_.restart_after) *it = Entry{rank, iteration};
    return;
  }
  e.outliers = 0;
  const int n = ++e.samples;
  // Plain running averages while they weigh more than the EWMA would (an
  // EWMA of the spread started at 0 would under-state it for its first
  // ~1 / noise_smoothing times, making noise look like evidence).
  e.mean += std::max(options_.smoothing, 1.0 / n) * d;
  const double v = std::max(options_.noise_smoothing, 1.0 / (n - 1));
  e.var = (1 - v) * e.var + v * d * d;
}

void LayerOverlaps::Forget() {
  for (std::vector<Entry>& entries : layers_) entries.clear();
}

bool LayerOverlaps::Usable(const Entry& e) const {
  return e.samples >= options_.min_samples && e.outliers == 0;
}

std::vector<RankOverlap> LayerOverlaps::Pairs() const {
  struct Sum {
    double d = 0;
    double var = 0;
    int layers = 0;
    bool concurrent = true;
  };
  std::map<std::pair<int, int>, Sum> sums;
  // The variance of the mean of one entry's n samples of variance v: v / n
  // while it is a running average, v * w / (2 - w) once an EWMA of weight w
  // (the larger of the two, conservatively, in between).
  const double w = options_.smoothing;
  auto mean_var = [&](const Entry& e) {
    return e.var * std::max(1.0 / e.samples, w / (2 - w));
  };
  for (const std::vector<Entry>& entries : layers_) {
    for (size_t i = 0; i < entries.size(); ++i) {
      if (!Usable(entries[i])) continue;
      for (size_t j = i + 1; j < entries.size(); ++j) {
        if (!Usable(entries[j])) continue;
        const Entry* x = &entries[i];
        const Entry* y = &entries[j];
        if (x->rank > y->rank) std::swap(x, y);
        Sum& s = sums[{x->rank, y->rank}];
        s.d += y->mean - x->mean;
        s.var += mean_var(*x) + mean_var(*y);
        ++s.layers;
        s.concurrent = s.concurrent &&
                       std::llabs(x->last - y->last) <= kConcurrentIterations;
      }
    }
  }
  std::vector<RankOverlap> pairs;
  pairs.reserve(sums.size());
  for (const auto& [key, s] : sums) {
    pairs.push_back(RankOverlap{key.first, key.second, s.d / s.layers,
                                std::sqrt(s.var / s.layers), s.layers, s.concurrent});
  }
  return pairs;
}

}  // namespace dynmo::core
