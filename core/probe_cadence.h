// ProbeCadence: when a trainer rank runs the speed probe (the fixed kernel
// whose time tells the coordinator a slow rank from heavy layers,
// core/rank_speed.h). Probing costs the whole pipeline its time
// every time it runs (tens of milliseconds on a throttled CPU core), while
// a rank's speed changes rarely. So a rank probes on each of its first
// `start_probes` iterations (as many probes as the coordinator needs before
// it publishes a speed, core/rank_speed.h: a job's first plan is then priced
// at the ranks' real speeds, not at speed 1), every `every` iterations
// while it is watched — from its start, for `watch_probes` probes (the
// coordinator publishes a speed after five to some fifteen), and again
// whenever the time its own layers take moves — and every `steady_every`
// iterations otherwise.
//
// "Moves": the rank's seconds in its layers, per iteration, against an EWMA
// of their log and of its spread. `confirmations` iterations in a row beyond
// max(min_change, sigmas * spread) on the same side start a watch at once
// (the probe runs that iteration) and restart the pace at the new level; a
// lone outlier (a collection, a page fault) starts nothing. A change of the
// rank's layers (a plan moved some) restarts the pace without a watch: the
// same speed, other work. A throttle that starts mid-run is so probed
// within `confirmations` iterations, and one that creeps in below the
// threshold within `steady_every`.
//
// Both trainers use it (dynmo-train's --speed_probe_every, the pipelining
// adapter's speed_probe_every through dynmo._core). Pure and deterministic;
// thread-compatible.
#ifndef DYNMO_CORE_PROBE_CADENCE_H_
#define DYNMO_CORE_PROBE_CADENCE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace dynmo::core {

struct ProbeCadenceOptions {
  int every = 5;            // iterations between probes while watched; 0: never
  int start_probes = 5;     // probes on consecutive iterations from the start
  int steady_every = 25;    // ... and otherwise (>= every)
  int watch_probes = 12;    // probes a watch lasts, from the start or a change
  double min_change = 0.1;  // a pace change below this fraction is none ...
  double sigmas = 4.0;      // ... nor one within this many sd of its spread
  int confirmations = 2;    // iterations in a row beyond, on one side
  double smoothing = 0.1;   // EWMA weight of the pace and its spread, (0, 1]
};

// OK for every >= 0, start_probes >= 0, steady_every >= every,
// watch_probes >= 1, finite
// min_change and sigmas >= 0, confirmations >= 1, smoothing in (0, 1].
absl::Status ValidateProbeCadenceOptions(const ProbeCadenceOptions& options);

class ProbeCadence {
 public:
  // `options` must validate.
  explicit ProbeCadence(const ProbeCadenceOptions& options = {});

  // Called once per iteration, in order, after the iteration ran: whether
  // to run the probe now. `layer_seconds` is the time this rank's layers
  // took this iteration (<= 0 or not finite: not measured, only the
  // schedule counts); `layers_changed` says a plan changed which layers the
  // rank holds since the last call.
  bool ShouldProbe(int64_t iteration, double layer_seconds, bool layers_changed);

  // True while the rank probes every `every` iterations.
  bool watching() const { return watch_left_ > 0; }

 private:
  void Watch(int64_t iteration);
  void Track(int64_t iteration, double layer_seconds, bool layers_changed);

  ProbeCadenceOptions options_;
  int watch_left_;
  int start_left_;  // of the start's consecutive probes
  bool started_ = false;
  int64_t next_ = 0;  // the first iteration that probes
  // The pace: EWMA of log(layer seconds) and of its squared deviation.
  int n_ = 0;
  double mean_ = 0, var_ = 0;
  int beyond_ = 0;  // iterations in a row beyond, signed by side
  double beyond_sum_ = 0;
};

}  // namespace dynmo::core

#endif  // DYNMO_CORE_PROBE_CADENCE_H_
