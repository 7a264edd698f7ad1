#include "core/rank_speed.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dynmo::core {
namespace {

bool Weight(double w) { return std::isfinite(w) && w > 0 && w <= 1; }

// Ranks 0..n-1 in groups joined pair by pair (union-find, path halving);
// Of(k) names k's group by one of its members.
class RankGroups {
 public:
  explicit RankGroups(size_t n) : parent_(n) {
    for (size_t k = 0; k < n; ++k) parent_[k] = k;
  }
  void Join(int a, int b) { parent_[Of(static_cast<size_t>(a))] = Of(static_cast<size_t>(b)); }
  size_t Of(size_t k) {
    while (parent_[k] != k) k = parent_[k] = parent_[parent_[k]];
    return k;
  }

 private:
  std::vector<size_t> parent_;
};

}  // namespace

absl::Status ValidateRankSpeedOptions(const RankSpeedOptions& o) {
  if (!Weight(o.smoothing) || !Weight(o.noise_smoothing) || !Weight(o.settle_smoothing)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speed smoothing weights must be in (0, 1], got ", o.smoothing, ", ",
        o.noise_smoothing, " and ", o.settle_smoothing));
  }
  if (!std::isfinite(o.sigmas) || o.sigmas < 0 || !std::isfinite(o.publish_sigmas) ||
      o.publish_sigmas < 0 || !std::isfinite(o.min_change) || o.min_change < 0) {
    return absl::InvalidArgumentError(
        "speed sigmas, publish_sigmas and min_change must be finite and >= 0");
  }
  if (!std::isfinite(o.max_layer_correction) || o.max_layer_correction < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speed max_layer_correction must be finite and >= 1, got ", o.max_layer_correction));
  }
  if (!std::isfinite(o.doubt_sigmas) || o.doubt_sigmas < 0 ||
      !std::isfinite(o.doubt_min_change) || o.doubt_min_change < 0 || o.doubt_probes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speed doubt_sigmas and doubt_min_change must be finite and >= 0 and doubt_probes "
        ">= 0, got ", o.doubt_sigmas, ", ", o.doubt_min_change, " and ", o.doubt_probes));
  }
  if (o.confirmations < 1 || o.warmup < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speed confirmations and warmup must be >= 1, got ", o.confirmations, " and ",
        o.warmup));
  }
  return ValidateLayerOverlapOptions(o.overlap);
}

RankSpeeds::RankSpeeds(int ranks, const RankSpeedOptions& options)
    : options_(options),
      level_(static_cast<size_t>(std::max(ranks, 0)), 0.0),
      settled_(level_.size(), 0.0),
      settled_n_(level_.size(), 0.0),
      settled_f_(level_.size(), 0.0),
      var_(level_.size(), 0.0),
      published_(level_.size(), 1.0),
      doubt_(level_.size(), 0),
      count_(level_.size(), 0),
      pending_(level_.size()),
      correction_(level_.size(), 0.0),
      correction_sd_(level_.size(), 0.0) {}

double RankSpeeds::speed(int rank) const {
  if (rank < 0 || rank >= ranks()) return 1.0;
  return published_[static_cast<size_t>(rank)];
}

double RankSpeeds::probe_s(int rank) const {
  if (rank < 0 || rank >= ranks()) return 0;
  return level_[static_cast<size_t>(rank)];
}

bool RankSpeeds::Warm(size_t r) const { return count_[r] >= options_.warmup; }

bool RankSpeeds::warm(int rank) const {
  return rank >= 0 && rank < ranks() && Warm(static_cast<size_t>(rank));
}

int RankSpeeds::probes(int rank) const {
  return rank >= 0 && rank < ranks() ? count_[static_cast<size_t>(rank)] : 0;
}

double RankSpeeds::correction(int rank) const {
  if (rank < 0 || rank >= ranks()) return 1.0;
  return std::exp(correction_[static_cast<size_t>(rank)]);
}

bool RankSpeeds::SetOverlaps(const std::vector<RankOverlap>& pairs) {
  // Minimises  lambda * sum_r c_r^2 + sum_pairs (c_b - c_a - d_ab)^2  by
  // conjugate gradients on its normal equations (symmetric positive
  // definite: a graph Laplacian plus lambda), warm-started at the last fit.
  // lambda keeps ranks no pair links at 0 and costs a lone pair's fit
  // 2 * lambda / (1 + 2 * lambda) of its ratio (1% at 0.005).
  constexpr double kLambda = 0.005;
  // A job has many pairs and refits every iteration, and a pair that
  // compares a layer's times before and after a move keeps one side fixed
  // for good: the bar for a pair is higher than for one rank's probes.
  constexpr double kPairSigmas = 4.0;
  for (const RankOverlap& p : pairs) {
    if (p.a < 0 || p.b < 0 || p.a >= ranks() || p.b >= ranks() || p.a == p.b ||
        !std::isfinite(p.log_ratio) || !std::isfinite(p.sd) || p.layers < 1) {
      continue;
    }
    // A pair's ratio counts only beyond its noise (and min_change): else
    // the two ranks run layers as their probes say (ratio 0), which also
    // ties them together. Once beyond, it stays counted down to 3/4 of
    // those bounds: a ratio that hovers at the edge does not flip.
    const bool swap = p.a > p.b;
    Pair& kept = pairs_[{swap ? p.b : p.a, swap ? p.a : p.b}];
    const double ratio = swap ? -p.log_ratio : p.log_ratio;
    const double scale = kept.beyond ? 0.75 : 1.0;
    kept.beyond = std::fabs(ratio) >
                  scale * std::max(std::log1p(options_.min_change), kPairSigmas * p.sd);
    kept.log_ratio = ratio;
    kept.sd = p.sd;
    kept.concurrent = p.concurrent;
  }
  // Pairs not in this list keep their last word (a layer's times in doubt
  // for a while, a model change that voided the times): the ratio between
  // two ranks' layers and their probes is the ranks', not the layers'.
  std::vector<RankOverlap> used;
  for (const auto& [key, kept] : pairs_) {
    used.push_back(RankOverlap{key.first, key.second, kept.beyond ? kept.log_ratio : 0.0,
                               kept.sd, 1});
  }
  if (used.empty()) return false;
  const size_t n = correction_.size();
  auto apply = [&](const std::vector<double>& x, std::vector<double>* y) {
    for (size_t k = 0; k < n; ++k) (*y)[k] = kLambda * x[k];
    for (const RankOverlap& p : used) {
      const double diff = x[static_cast<size_t>(p.b)] - x[static_cast<size_t>(p.a)];
      (*y)[static_cast<size_t>(p.b)] += diff;
      (*y)[static_cast<size_t>(p.a)] -= diff;
    }
  };
  std::vector<double> rhs(n, 0.0);
  for (const RankOverlap& p : used) {
    rhs[static_cast<size_t>(p.b)] += p.log_ratio;
    rhs[static_cast<size_t>(p.a)] -= p.log_ratio;
  }
  std::vector<double>& x = correction_;
  std::vector<double> ax(n), r(n), dir(n), ad(n);
  apply(x, &ax);
  double rr = 0, bb = 0;
  for (size_t k = 0; k < n; ++k) {
    r[k] = rhs[k] - ax[k];
    dir[k] = r[k];
    rr += r[k] * r[k];
    bb += rhs[k] * rhs[k];
  }
  const double tolerance = 1e-20 * std::max(bb, 1e-12);
  for (size_t it = 0; it < 4 * n + 16 && rr > tolerance; ++it) {
    apply(dir, &ad);
    double dad = 0;
    for (size_t k = 0; k < n; ++k) dad += dir[k] * ad[k];
    if (!(dad > 0)) break;
    const double alpha = rr / dad;
    double next = 0;
    for (size_t k = 0; k < n; ++k) {
      x[k] += alpha * dir[k];
      r[k] -= alpha * ad[k];
      next += r[k] * r[k];
    }
    for (size_t k = 0; k < n; ++k) dir[k] = r[k] + (next / rr) * dir[k];
    rr = next;
  }
  // The pairs fix only differences within each group of linked ranks. The
  // probe is taken at its word for the group's fastest rank (its layers
  // run as fast as its probe says, beside every rank no pair links): each
  // group is shifted so that its fastest rank's correction is 0.
  RankGroups groups(n);
  for (const RankOverlap& p : used) groups.Join(p.a, p.b);
  std::vector<double> anchor(n, 0.0);
  std::vector<double> fastest(n, std::numeric_limits<double>::infinity());
  for (size_t k = 0; k < n; ++k) {
    if (!Warm(k)) continue;
    const double effective = settled_[k] * std::exp(x[k]);
    const size_t g = groups.Of(k);
    if (effective < fastest[g]) {
      fastest[g] = effective;
      anchor[g] = x[k];
    }
  }
  for (size_t k = 0; k < n; ++k) x[k] -= anchor[groups.Of(k)];
  // The probe measures the rank; the layers only refine it. Ranks whose
  // layers were timed side by side (replicas) keep the differences those
  // times show; what such a group (or a rank alone) moves as one, which
  // only layers timed before and after a move can say, is bounded: such a
  // layer cannot tell a slower rank from a change in its own cost at the
  // switch (freezing, pruning or routing that moved without a model-change
  // report), nor a rank whose share of a shared core follows how often it
  // waits. One such layer once said 1.9x where every probe said 1
  // (docs/benchmarks.md, "What-if through the coordinator's code").
  RankGroups side_by_side(n);
  for (const auto& [key, kept] : pairs_) {
    if (kept.concurrent) side_by_side.Join(key.first, key.second);
  }
  // What a group moves as one: the correction of its member nearest its
  // own probe (0 for a group that holds its linked ranks' anchor).
  std::vector<double> common(n, std::numeric_limits<double>::infinity());
  for (size_t k = 0; k < n; ++k) {
    double& c = common[side_by_side.Of(k)];
    if (std::fabs(x[k]) < std::fabs(c)) c = x[k];
  }
  const double bound = std::log(options_.max_layer_correction);
  for (size_t k = 0; k < n; ++k) {
    const double c = common[side_by_side.Of(k)];
    x[k] += std::clamp(c, -bound, bound) - c;
  }
  // A rank's correction is as uncertain as its best-measured pair (the
  // combined precision of its pairs).
  std::vector<double> precision(n, 0.0);
  std::vector<bool> linked(n, false);
  for (const RankOverlap& p : used) {
    const double v = std::max(p.sd * p.sd, 1e-12);
    for (int k : {p.a, p.b}) {
      precision[static_cast<size_t>(k)] += 1 / v;
      linked[static_cast<size_t>(k)] = true;
    }
  }
  for (size_t k = 0; k < n; ++k) {
    correction_sd_[k] = linked[k] ? std::sqrt(1 / precision[k]) : 0.0;
  }
  return Publish();
}


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

bool RankSpeeds::in_doubt(int rank) const {
  if (rank < 0 || rank >= ranks()) return false;
  const size_t r = static_cast<size_t>(rank);
  return doubt_[r] != 0 && count_[r] < options_.warmup + options_.doubt_probes;
}

bool RankSpeeds::may_be_faster(int rank) const {
  if (rank < 0 || rank >= ranks()) return false;
  const std::vector<double>& pending = pending_[static_cast<size_t>(rank)];
  return !pending.empty() && pending.back() < level_[static_cast<size_t>(rank)];
}

void RankSpeeds::Settle(size_t r, double probe_s) {
  // A running mean, then an EWMA: w = max(1/n, settle_smoothing). For
  // independent probes its variance is the probes' times f, the sum of the
  // weights squared: f' = (1 - w)^2 f + w^2 (1/n while it is a mean).
  settled_n_[r] += 1;
  const double w = std::max(1 / settled_n_[r], options_.settle_smoothing);
  settled_[r] += w * (probe_s - settled_[r]);
  settled_f_[r] = (1 - w) * (1 - w) * settled_f_[r] + w * w;
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
    Settle(r, probe_s);
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
      Settle(r, probe_s);
      pending.clear();
      // A change the gate lets through (a rank slowed by less than its
      // probes scatter) moves the level within a few probes and the settled
      // level only slowly: once they part by more than publish_sigmas of
      // their difference's spread, the settled level starts again at the
      // level. For EWMAs of weights a and b over the same independent
      // probes, Var(a-EWMA - b-EWMA) / sd^2 = a/(2-a) + b/(2-b) -
      // 2ab/(a+b-ab).
      const double a = options_.smoothing;
      const double b = std::max(1 / settled_n_[r], options_.settle_smoothing);
      const double fa = a / (2 - a);
      if (a > b) {
        const double apart =
            std::sqrt(std::max(0.0, fa + b / (2 - b) - 2 * a * b / (a + b - a * b))) *
            std::sqrt(var_[r]);
        if (std::fabs(level_[r] - settled_[r]) > options_.publish_sigmas * apart) {
          settled_[r] = level_[r];
          settled_n_[r] = 1 / a;
          settled_f_[r] = fa;
        }
      }
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
        const double old_level = level_[r];
        level_[r] = sum / static_cast<double>(pending.size());
        // The spread is relative to the level: it scales with the step.
        var_[r] *= (level_[r] / old_level) * (level_[r] / old_level);
        // The settled level starts again from the step's probes.
        settled_[r] = level_[r];
        settled_n_[r] = static_cast<double>(pending.size());
        settled_f_[r] = 1 / settled_n_[r];
        pending.clear();
      }
    }
  }
  return Publish();
}

bool RankSpeeds::Publish() {
  // The reference "full speed": the lower quartile of the warmed-up ranks'
  // settled levels. Not the smallest, which noise alone pulls down as ranks
  // are added (every rank would look a little slow); not the median, which
  // a pool of half fast, half slow cards would put among the slow ones.
  // With two to four ranks it is the fastest.
  // Levels as the layers run them: the probe's, corrected by the overlaps.
  std::vector<double> effective(level_.size());
  std::vector<size_t> warm;
  for (size_t k = 0; k < level_.size(); ++k) {
    effective[k] = settled_[k] * std::exp(correction_[k]);
    if (Warm(k)) warm.push_back(k);
  }
  if (warm.empty()) return false;
  const size_t q = (warm.size() - 1) / 4;
  std::nth_element(warm.begin(), warm.begin() + static_cast<std::ptrdiff_t>(q), warm.end(),
                   [&effective](size_t a, size_t b) {
                     return effective[a] < effective[b] || (effective[a] == effective[b] && a < b);
                   });
  const size_t ref = warm[q];
  // The ratio's relative variance is the two settled levels' (each the
  // probes' relative spread squared times its weights' f) plus the
  // correction's. The pairs' spread understates how far a fitted
  // correction strays on equal ranks (6.5% at a claimed 1% was seen), so a
  // rank the layers correct keeps at least the bar the probes alone had:
  // `sigmas` standard deviations of two single probes. The pool is taken
  // once: O(ranks) a probe.
  const double pooled = PooledNoise();
  const double ref_rel = RelativeNoise(ref, pooled);
  const double ref_var = ref_rel * ref_rel * settled_f_[ref];
  bool changed = false;
  for (size_t k : warm) {
    const double raw = std::min(1.0, effective[ref] / effective[k]);
    const double rel = RelativeNoise(k, pooled);
    double corr_var = correction_sd_[k] * correction_sd_[k];
    if (std::fabs(correction_[k]) > 1e-6 && options_.publish_sigmas > 0) {
      const double scale = options_.sigmas / options_.publish_sigmas;
      corr_var = std::max(corr_var, 2 * rel * rel * scale * scale);
    }
    const double var = rel * rel * settled_f_[k] + (k == ref ? 0.0 : ref_var) + corr_var;
    // Calling a full-speed rank slow takes publish_sigmas; a rank already
    // called slow moves on (nearer its settled level, or back to full
    // speed) at `sigmas`: its first value came from few probes.
    const double gap = std::fabs(raw - published_[k]);
    const double bar = published_[k] == 1.0 ? options_.publish_sigmas : options_.sigmas;
    const bool beyond = gap > options_.min_change * published_[k];
    if (beyond && gap > bar * raw * std::sqrt(var)) {
      published_[k] = raw;
      changed = true;
      doubt_[k] = 0;
    } else {
      doubt_[k] = beyond && gap > options_.doubt_min_change * published_[k] &&
                  gap > options_.doubt_sigmas * raw * std::sqrt(var);
    }
  }
  return changed;
}

}  // namespace dynmo::core
