// LayerOverlaps: the same layer timed on different ranks, as evidence of how
// fast those ranks run layers relative to each other.
//
// A speed probe (rank_speed.h) is a short fixed kernel; on a shared CPU
// core, a GPU with other tenants or a card whose clocks differ between short
// and long kernels, the probe can say 0.54 while the layers run at 0.6. The
// layers themselves say it exactly where two ranks have timed the same layer:
// the replicas of one stage (data parallelism) every iteration, and the
// ranks before and after a migration.
//
// Each (layer, rank) keeps a smoothed mean and spread (running averages
// for the first times, exponential after) of
// u = log(layer seconds / the rank's probe level when it ran), so that a
// time measured before a throttle started still compares with one after it.
// For two ranks a < b that both timed a layer, u_b - u_a is how much slower b
// runs that layer than the probes predict, relative to a (a log ratio); a
// pair's evidence is the mean of that over the layers both timed.
//
// A rank's first `settle` times of a layer (a layer just migrated: caches,
// allocator) are skipped, and a rank that takes a layer up again after more
// than `gap` iterations starts it afresh; a time far outside an entry's
// spread is left out, and several in a row (the rank's regime changed
// between two probes) start it afresh too. A model change (pruning, freezing:
// every layer's cost moved) makes all earlier times incomparable: Forget().
//
// Pure and deterministic; thread-compatible.
#ifndef DYNMO_CORE_LAYER_OVERLAP_H_
#define DYNMO_CORE_LAYER_OVERLAP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace dynmo::core {

struct LayerOverlapOptions {
  bool enabled = true;           // false: probes alone decide speeds
  double smoothing = 0.05;       // EWMA weight of a new time, (0, 1]
  double noise_smoothing = 0.1;  // EWMA weight in the spread, (0, 1]
  int settle = 2;                // first times of a layer on a rank skipped
  int min_samples = 8;           // times on each side before a layer counts
  int64_t gap = 20;              // iterations after which a layer starts afresh
  // A time beyond max(outlier_floor, outlier_sigmas * spread) of a settled
  // entry's mean is not folded in; `restart_after` of them in a row start
  // the entry afresh (its rank's regime changed).
  double outlier_sigmas = 4.0;
  double outlier_floor = 0.1;
  int restart_after = 5;
};

// OK for weights in (0, 1], settle >= 0, min_samples, gap and
// restart_after >= 1, outlier bounds > 0.
absl::Status ValidateLayerOverlapOptions(const LayerOverlapOptions& options);

// Two ranks' evidence: `log_ratio` = mean over `layers` of u_b - u_a, with
// `sd` its standard deviation (taken per layer, not divided by the number
// of layers: one rank's layers share each iteration's noise). `concurrent`:
// every one of those layers was timed on both ranks side by side (newest
// times at most kConcurrentIterations apart: data-parallel replicas), not
// on one before a move and on the other after it, where a change in the
// layer's own cost at the switch reads as a speed.
struct RankOverlap {
  int a = 0;
  int b = 0;  // a < b
  double log_ratio = 0;
  double sd = 0;
  int layers = 0;
  bool concurrent = false;
};

// How far apart two ranks' newest times of a layer may be for the two to
// count as timed side by side (reports of one iteration arrive a little
// apart; a moved layer's sides are at least settle + min_samples apart).
inline constexpr int64_t kConcurrentIterations = 2;

class LayerOverlaps {
 public:
  // `ranks`, `layers` >= 0; times of ranks or layers out of range are
  // ignored.
  LayerOverlaps(int ranks, int layers, const LayerOverlapOptions& options);

  // One report: `seconds` of `layer` on `rank` at `iteration`, which ran
  // with probe level `reference_s`. Ignored unless both are finite and > 0.
  void Add(int rank, int layer, int64_t iteration, double seconds, double reference_s);

  // Every earlier time is void (the model changed).
  void Forget();

  // The pairs of ranks with evidence, ordered by (a, b).
  std::vector<RankOverlap> Pairs() const;

 private:
  struct Entry {
    int rank = 0;
    int64_t last = 0;  // iteration of the newest time
    int seen = 0;      // times so far, the settling ones included
    int samples = 0;   // times folded into the mean
    int outliers = 0;  // times in a row beyond the mean's spread
    double mean = 0;   // of u
    double var = 0;    // spread of u around the mean
  };
  bool Usable(const Entry& e) const;

  LayerOverlapOptions options_;
  int ranks_;
  std::vector<std::vector<Entry>> layers_;  // per layer, the ranks that timed it
};

}  // namespace dynmo::core

#endif  // DYNMO_CORE_LAYER_OVERLAP_H_
