// What a plan gained, read from the job's own step times, and how far the
// cost model's predictions have missed — the record an auto gate calibrates
// its minimum gain by (coordinator/job/policy.h).
//
// StepTimes keeps the newest iterations' step times (per iteration the
// largest any rank reported: a pipeline runs at its slowest rank's pace).
// MeasureRealizedGain compares the median step time of the iterations
// before a plan's switch with the median after it, the iterations around
// the switch (the migration's own, the first one on the new layout) left
// out, and so are the job's first iterations (warm-up: allocators, caches,
// the first collective's connection). PredictionRecord keeps the newest plans' shortfalls (how much less
// than predicted they delivered; a plan that delivered more — a model still
// shrinking under it — misses nothing) and the spread of their
// measurements.
//
// Pure and deterministic; thread-compatible (plain values).
#ifndef DYNMO_CORE_REALIZED_GAIN_H_
#define DYNMO_CORE_REALIZED_GAIN_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

namespace dynmo::core {

class StepTimes {
 public:
  explicit StepTimes(int capacity = 128) : capacity_(capacity) {}
  // A rank's step time of `iteration` (> 0 and finite; others are
  // ignored). Iterations older than the newest `capacity` are dropped.
  void Add(int64_t iteration, double seconds);
  // The step times of the iterations in [first, end) that have one, in
  // ascending iteration order.
  std::vector<double> Range(int64_t first, int64_t end) const;
  int64_t newest() const { return times_.empty() ? -1 : times_.back().first; }
  // The oldest iteration ever added (kept or since dropped); -1 for none.
  int64_t first() const { return first_; }

 private:
  int capacity_;
  int64_t first_ = -1;
  std::deque<std::pair<int64_t, double>> times_;  // ascending iteration
};

struct GainWindows {
  int before = 8;  // iterations measured before the switch
  int after = 8;   // and after it
  // Iterations left out on each side of the apply iteration A: before
  // covers [A - skip - before, A - skip), after [A + skip + 1, A + skip +
  // 1 + after). skip = 1 leaves out A - 1 (preparing), A (the migration)
  // and A + 1 (the first on the new layout).
  int skip = 1;
  // The first `warmup` iterations the step times hold (StepTimes::first()
  // on) are never measured: a job's first iterations run slower than
  // any layout will again, and would credit the first plan with their
  // warm-up.
  int warmup = 2;
  int min_samples = 3;  // per window, for a measurement at all
};

struct RealizedGain {
  double before_s = 0;  // median step time before
  double after_s = 0;   // and after
  double gain = 0;      // before_s / after_s - 1
  // The larger relative median absolute deviation of the two windows:
  // how far apart two measurements of the same layout may lie.
  double spread = 0;
  int samples_before = 0;
  int samples_after = 0;
  // The model changed between the first iteration measured and the last
  // (set by the caller, who knows the changes): the gain holds that change
  // too, not only the plan's.
  bool model_changed = false;
};

// The first iteration after which the after-window of a plan applied at
// `apply_iteration` is complete.
int64_t AfterWindowEnd(int64_t apply_iteration, const GainWindows& windows);
// What a plan applied at `apply_iteration` gained, from what `steps` holds
// (the after-window may be partial); nullopt when either window has fewer
// than windows.min_samples step times.
std::optional<RealizedGain> MeasureRealizedGain(const StepTimes& steps,
                                                int64_t apply_iteration,
                                                const GainWindows& windows);

// The job's step time on the layout it runs now: the median of the newest
// `windows.before` step times from iteration `since` on (the first after a
// plan's switch: apply + skip + 1; -1 for the job's start), the warm-up
// left out as MeasureRealizedGain does; nullopt with fewer than
// windows.min_samples.
std::optional<double> CurrentStepTime(const StepTimes& steps, int64_t since,
                                      const GainWindows& windows);

// The newest plans' shortfalls and measurement spreads.
class PredictionRecord {
 public:
  explicit PredictionRecord(int capacity = 8) : capacity_(capacity) {}
  void Add(double predicted_gain, const RealizedGain& realized);
  int size() const { return static_cast<int>(shortfalls_.size()); }
  // The median max(0, predicted - realized) gain over the record; nullopt
  // when empty.
  std::optional<double> MedianShortfall() const;
  // The median spread of the measurements; nullopt when empty.
  std::optional<double> MedianSpread() const;

 private:
  int capacity_;
  std::deque<double> shortfalls_;
  std::deque<double> spreads_;
};

// The median of `values` (the mean of the middle two for an even count);
// 0 for none.
double Median(std::vector<double> values);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_REALIZED_GAIN_H_
