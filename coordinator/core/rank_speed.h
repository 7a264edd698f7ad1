// RankSpeeds: how fast each rank of a job runs, relative to the fastest,
// from the time each rank takes for the same fixed piece of work (a speed
// probe: a fixed kernel every rank times the same way as its layers). A
// throttled GPU, a noisy neighbour or an older card in a mixed pool takes
// longer for the probe, and so for every layer it holds.
//
// The model keeps "layer L costs X at speed 1" apart from "rank r runs at
// speed s": a layer measured t seconds on a rank of speed s costs t * s at
// speed 1, and t' = t * s / s' on a rank of speed s'. The partitioners price
// a stage's load at load / speed (cost_model.h).
//
// Each rank's probe time is smoothed (an EWMA) and its spread tracked (an
// EWMA of the squared deviation, as cost_noise.h does for layers); the
// first probes are averaged plainly (weight max(w, 1/n)), so neither
// estimate starts from nothing, and a rank's speed stays until it probed
// `warmup` times. The
// published speed of rank r is fastest_probe / probe_r, and it moves only
// when the new value differs from the published one by more than both
// `min_change` and `sigmas` standard deviations of the ratio's noise, for
// `confirmations` probes of that rank in a row: a throttle that starts
// or ends is followed within a bounded number of probes, and noise on
// equal ranks never moves a speed (no flip-flop). Ranks never probed are at
// speed 1.
//
// Pure and deterministic; thread-compatible.
#ifndef DYNMO_COORDINATOR_CORE_RANK_SPEED_H_
#define DYNMO_COORDINATOR_CORE_RANK_SPEED_H_

#include <vector>

#include "absl/status/status.h"

namespace dynmo::core {

struct RankSpeedOptions {
  double smoothing = 0.3;        // EWMA weight of a new probe time, (0, 1]
  double noise_smoothing = 0.1;  // EWMA weight in the spread estimate, (0, 1]
  double sigmas = 3.0;           // a change must exceed this many sd ...
  double min_change = 0.05;      // ... and this much of the speed
  int confirmations = 3;         // probes in a row that agree
  int warmup = 5;                // probes of a rank before its speed may move
};

// OK for weights in (0, 1], sigmas and min_change finite and >= 0,
// confirmations and warmup >= 1.
absl::Status ValidateRankSpeedOptions(const RankSpeedOptions& options);

class RankSpeeds {
 public:
  // `ranks` >= 0; every rank starts at speed 1, unprobed.
  RankSpeeds(int ranks, const RankSpeedOptions& options);

  // Folds one probe time of `rank` in. Returns true when any published
  // speed changed. INVALID_ARGUMENT-like misuse (a rank out of range, a
  // time not finite or not > 0) is ignored and returns false: callers
  // validate what ranks send.
  bool AddProbe(int rank, double probe_s);

  int ranks() const { return static_cast<int>(published_.size()); }
  // The published speed of `rank`, in (0, 1]; 1 for a rank out of range.
  double speed(int rank) const;
  const std::vector<double>& speeds() const { return published_; }
  // The smoothed probe time of `rank`; 0 until it probed.
  double probe_s(int rank) const;

 private:
  // The speed the smoothed probes say now, and its noise (one sd).
  double RawSpeed(int rank, double* sd) const;

  RankSpeedOptions options_;
  std::vector<double> mean_;       // smoothed probe seconds; 0 = none yet
  std::vector<double> var_;        // smoothed squared deviation
  std::vector<double> published_;  // what decisions use
  std::vector<int> agreeing_;      // probes in a row that want a change
  std::vector<int> count_;         // probes so far
};

}  // namespace dynmo::core

#endif  // DYNMO_COORDINATOR_CORE_RANK_SPEED_H_
