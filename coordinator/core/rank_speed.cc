#include "coordinator/core/rank_speed.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dynmo::core {
namespace {

bool Weight(double w) { return std::isfinite(w) && w > 0 && w <= 1; }

}  // namespace

absl::Status ValidateRankSpeedOptions(const RankSpeedOptions& o) {
  if (!Weight(o.smoothing) || !Weight(o.noise_smoothing)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speed smoothing weights must be in (0, 1], got ", o.smoothing, " and ",
        o.noise_smoothing));
  }
  if (!std::isfinite(o.sigmas) || o.sigmas < 0 || !std::isfinite(o.min_change) ||
      o.min_change < 0) {
    return absl::InvalidArgumentError("speed sigmas and min_change must be finite and >= 0");
  }
  if (o.confirmations < 1 || o.warmup < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speed confirmations and warmup must be >= 1, got ", o.confirmations, " and ",
        o.warmup));
  }
  return absl::OkStatus();
}

RankSpeeds::RankSpeeds(int ranks, const RankSpeedOptions& options)
    : options_(options),
      level_(static_cast<size_t>(std::max(ranks, 0)), 0.0),
      var_(level_.size(), 0.0),
      published_(level_.size(), 1.0),
      count_(level_.size(), 0),
      pending_(level_.size()) {}

double RankSpeeds::speed(int rank) const {
  if (rank < 0 || rank >= ranks()) return 1.0;
  return published_[static_cast<size_t>(rank)];
}

double RankSpeeds::probe_s(int rank) const {
  if (rank < 0 || rank >= ranks()) return 0;
  return level_[static_cast<size_t>(rank)];
}

bool RankSpeeds::Warm(size_t r) const { return count_[r] >= options_.warmup; }


double RankSpeeds::PooledNoise() const {
  // Every rank runs the same probe: their spreads are pooled (a rank's own
  // few probes can look deceptively steady).
  double pooled = 0;
  int warm = 0;
  for (size_t k = 0; k < level_.size(); ++k) {
    if (!Warm(k) || level_[k] <= 0) continue;
    pooled += var_[k] / (level_[k] * level_[k]);
    ++warm;
  }
  return warm > 0 ? std::sqrt(pooled / warm) : 0;
}

double RankSpeeds::RelativeNoise(size_t r, double pooled) const {
  // A rank's own spread counts where it is larger than the pool's.
  const double own = level_[r] > 0 ? std::sqrt(var_[r]) / level_[r] : 0;
  return std::max(own, pooled);
}

bool RankSpeeds::AddProbe(int rank, double probe_s) {
  if (rank < 0 || rank >= ranks() || !std::isfinite(probe_s) || probe_s <= 0) return false;
  const size_t r = static_cast<size_t>(rank);
  const int n = ++count_[r];
  if (n <= options_.warmup) {
    // Plain running mean and sample variance of the first probes (Welford;
    // var_ holds the sum of squares until the warm-up ends).
    const double d = probe_s - level_[r];
    level_[r] += d / n;
    var_[r] += d * (probe_s - level_[r]);
    if (n == options_.warmup) var_[r] = n > 1 ? var_[r] / (n - 1) : 0;
  } else {
    const double gate =
        std::max(options_.min_change, options_.sigmas * RelativeNoise(r, PooledNoise())) *
        level_[r];
    const double d = probe_s - level_[r];
    std::vector<double>& pending = pending_[r];
    if (std::fabs(d) <= gate) {
      // Agrees with the level: smoothed in, and its spread is noise.
      var_[r] = (1 - options_.noise_smoothing) * var_[r] + options_.noise_smoothing * d * d;
      level_[r] += options_.smoothing * d;
      pending.clear();
    } else {
      // A step, or an outlier: a new level only once `confirmations`
      // probes in a row agree on its side.
      if (!pending.empty() && (pending.back() > level_[r]) != (probe_s > level_[r])) {
        pending.clear();
      }
      pending.push_back(probe_s);
      if (static_cast<int>(pending.size()) >= options_.confirmations) {
        double sum = 0;
        for (double p : pending) sum += p;
        level_[r] = sum / static_cast<double>(pending.size());
        pending.clear();
      }
    }
  }
  return Publish();
}

bool RankSpeeds::Publish() {
  // The reference "full speed": the lower quartile of the warmed-up ranks'
  // levels. Not the smallest, which noise alone pulls down as ranks are
  // added (every rank would look a little slow); not the median, which a
  // pool of half fast, half slow cards would put among the slow ones. With
  // two to four ranks it is the fastest.
  std::vector<double> warm;
  for (size_t k = 0; k < level_.size(); ++k) {
    if (Warm(k)) warm.push_back(level_[k]);
  }
  if (warm.empty()) return false;
  const size_t q = (warm.size() - 1) / 4;
  std::nth_element(warm.begin(), warm.begin() + static_cast<std::ptrdiff_t>(q), warm.end());
  const double ref = warm[q];
  // The ratio's noise is taken as two probes' (not two smoothed levels',
  // which are steadier): conservative, since the reference is the smallest
  // of several noisy levels. The pool is taken once: O(ranks) a probe.
  const double pooled = PooledNoise();
  bool changed = false;
  for (size_t k = 0; k < level_.size(); ++k) {
    if (!Warm(k)) continue;
    const double raw = std::min(1.0, ref / level_[k]);
    const double sd = raw * std::sqrt(2.0) * RelativeNoise(k, pooled);
    const double gap = std::fabs(raw - published_[k]);
    if (gap > options_.min_change * published_[k] && gap > options_.sigmas * sd) {
      published_[k] = raw;
      changed = true;
    }
  }
  return changed;
}

}  // namespace dynmo::core
