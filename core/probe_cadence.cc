#include "core/probe_cadence.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dynmo::core {

absl::Status ValidateProbeCadenceOptions(const ProbeCadenceOptions& o) {
  auto bad = [](auto... what) { return absl::InvalidArgumentError(absl::StrCat(what...)); };
  if (o.every < 0) return bad("probe every must be >= 0 iterations (0: never), got ", o.every);
  if (o.start_probes < 0) return bad("probe start_probes must be >= 0, got ", o.start_probes);
  if (o.steady_every < o.every) {
    return bad("probe steady_every must be >= every (", o.every, "), got ", o.steady_every);
  }
  if (o.watch_probes < 1) return bad("probe watch_probes must be >= 1, got ", o.watch_probes);
  if (!std::isfinite(o.min_change) || o.min_change < 0) {
    return bad("probe min_change must be finite and >= 0, got ", o.min_change);
  }
  if (!std::isfinite(o.sigmas) || o.sigmas < 0) {
    return bad("probe sigmas must be finite and >= 0, got ", o.sigmas);
  }
  if (o.confirmations < 1) return bad("probe confirmations must be >= 1, got ", o.confirmations);
  if (!(o.smoothing > 0 && o.smoothing <= 1)) {
    return bad("probe smoothing must be in (0, 1], got ", o.smoothing);
  }
  return absl::OkStatus();
}

ProbeCadence::ProbeCadence(const ProbeCadenceOptions& options)
    : options_(options),
      watch_left_(options.watch_probes),
      start_left_(options.start_probes) {}

void ProbeCadence::Watch(int64_t iteration) {
  watch_left_ = options_.watch_probes;
  next_ = std::min(next_, iteration);
}

void ProbeCadence::Track(int64_t iteration, double layer_seconds, bool layers_changed) {
  if (layers_changed) {  // other work at the same speed: a new pace, no watch
    n_ = 0;
    beyond_ = 0;
  }
  if (!(layer_seconds > 0) || !std::isfinite(layer_seconds)) return;
  const double x = std::log(layer_seconds);
  if (n_ < 2) {  // the first two set the level; the spread starts at zero
    mean_ = n_ == 0 ? x : (mean_ + x) / 2;
    var_ = 0;
    ++n_;
    return;
  }
  const double d = x - mean_;
  const double bar =
      std::max(std::log1p(options_.min_change), options_.sigmas * std::sqrt(var_));
  if (std::fabs(d) > bar) {
    const int side = d > 0 ? 1 : -1;
    if (beyond_ * side < 0) {  // the other side: a new run of outliers
      beyond_ = 0;
      beyond_sum_ = 0;
    }
    beyond_ += side;
    beyond_sum_ += x;
    if (std::abs(beyond_) >= options_.confirmations) {
      // The rank's pace stepped: watch it, and start the pace over there.
      mean_ = beyond_sum_ / std::abs(beyond_);
      var_ = 0;
      n_ = 2;
      beyond_ = 0;
      beyond_sum_ = 0;
      Watch(iteration);
    }
    return;  // a step or an outlier never moves the pace or widens its spread
  }
  beyond_ = 0;
  beyond_sum_ = 0;
  const double a = options_.smoothing;
  mean_ += a * d;
  var_ = (1 - a) * (var_ + a * d * d);
}

bool ProbeCadence::ShouldProbe(int64_t iteration, double layer_seconds, bool layers_changed) {
  if (options_.every == 0) return false;
  if (!started_) {
    started_ = true;
    next_ = iteration;
  }
  Track(iteration, layer_seconds, layers_changed);
  if (iteration < next_) return false;
  if (watch_left_ > 0) --watch_left_;
  if (start_left_ > 0) --start_left_;
  next_ = iteration + (start_left_ > 0   ? 1
                       : watch_left_ > 0 ? options_.every
                                         : options_.steady_every);
  return true;
}

}  // namespace dynmo::core
