#include "coordinator/core/rank_speed.h"

#include <algorithm>
#include <cmath>

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
      mean_(static_cast<size_t>(std::max(ranks, 0)), 0.0),
      var_(mean_.size(), 0.0),
      published_(mean_.size(), 1.0),
      agreeing_(mean_.size(), 0),
      count_(mean_.size(), 0) {}

double RankSpeeds::speed(int rank) const {
  if (rank < 0 || rank >= ranks()) return 1.0;
  return published_[static_cast<size_t>(rank)];
}

double RankSpeeds::probe_s(int rank) const {
  if (rank < 0 || rank >= ranks()) return 0;
  return mean_[static_cast<size_t>(rank)];
}

double RankSpeeds::RawSpeed(int rank, double* sd) const {
  const size_t r = static_cast<size_t>(rank);
  // The fastest rank that probed: the smallest smoothed probe time.
  size_t fastest = r;
  for (size_t k = 0; k < mean_.size(); ++k) {
    if (mean_[k] > 0 && mean_[k] < mean_[fastest]) fastest = k;
  }
  const double speed = std::min(1.0, mean_[fastest] / mean_[r]);
  // Relative noise of each probe mean; the ratio's relative noise adds them
  // in quadrature.
  const double rel_r = std::sqrt(var_[r]) / mean_[r];
  const double rel_f = fastest == r ? 0 : std::sqrt(var_[fastest]) / mean_[fastest];
  *sd = speed * std::sqrt(rel_r * rel_r + rel_f * rel_f);
  return speed;
}

bool RankSpeeds::AddProbe(int rank, double probe_s) {
  if (rank < 0 || rank >= ranks() || !std::isfinite(probe_s) || probe_s <= 0) return false;
  const size_t r = static_cast<size_t>(rank);
  const int n = ++count_[r];
  if (n == 1) {
    mean_[r] = probe_s;
  } else {
    // The first samples are averaged plainly, later ones smoothed.
    const double w = std::max(options_.smoothing, 1.0 / n);
    const double wv = std::max(options_.noise_smoothing, 1.0 / (n - 1));
    const double d = probe_s - mean_[r];
    var_[r] = (1 - wv) * var_[r] + wv * d * d;
    mean_[r] += w * d;
  }
  // Every rank's published speed is checked again: a faster rank joining
  // (or the fastest slowing) moves the reference of all.
  bool changed = false;
  for (size_t k = 0; k < mean_.size(); ++k) {
    if (mean_[k] == 0) continue;
    if (count_[k] < options_.warmup) continue;
    double sd = 0;
    const double raw = RawSpeed(static_cast<int>(k), &sd);
    const double gap = std::fabs(raw - published_[k]);
    const bool wants = gap > options_.min_change * published_[k] && gap > options_.sigmas * sd;
    // Only a probe of the rank itself (or of the reference) counts as a new
    // confirmation of its change; otherwise the count stays.
    if (!wants) {
      agreeing_[k] = 0;
      continue;
    }
    if (k == r || agreeing_[k] == 0) ++agreeing_[k];
    if (agreeing_[k] >= options_.confirmations) {
      published_[k] = raw;
      agreeing_[k] = 0;
      changed = true;
    }
  }
  return changed;
}

}  // namespace dynmo::core
