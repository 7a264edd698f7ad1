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
// Each rank keeps a level — the probe time it runs at — and the spread of
// its probes around it. The first `warmup` probes set both (a plain mean and
// variance). After that a probe within max(min_change, sigmas * spread) of
// the level is smoothed into it (an EWMA) and into the spread; one beyond is
// a step or an outlier: `confirmations` such probes in a row on the same side
// make their mean the new level at once (a throttle that starts or ends),
// while a lone outlier changes nothing and a step never inflates the spread.
// Beside that level, which follows a step within a few probes, each rank
// keeps a settled level: the mean of the probes the level took in since its
// last step (a running mean, then an EWMA of weight `settle_smoothing`),
// with its standard error (the probes' spread times the square root of the
// sum of its weights squared). A step restarts it at the confirming probes'
// mean, as uncertain as their number says; so does a level that parts from
// it by more than publish_sigmas (a change smaller than the gate's).
//
// The published speed of rank r is the reference's settled level (the
// lower quartile of the ranks' settled levels: the fastest with up to four
// ranks) over r's, at most 1. It leaves 1 only by more than min_change and
// `publish_sigmas` standard errors of that ratio, so noise on equal ranks
// does not move a speed (no flip-flop); once below 1 it moves by more than
// min_change and `sigmas` of them (nearer the settled level as probes add
// up, or back). A rank slowed by less than one probe's spread (0.7, probes
// scattering 15%) is so published within some ten probes, where a gate on
// two single probes' spread never published it. Ranks that have not
// finished their warm-up run at speed 1.
//
// Where ranks timed the same layers (layer_overlap.h: data-parallel
// replicas, a layer before and after a migration), the layers correct the
// probes: each rank's level is multiplied by exp(c_r), the corrections c
// being the least-squares fit of every pair's log ratio (c_b - c_a = the
// pair's evidence), pulled weakly towards 0 so that a rank no layer links
// keeps its probe's word. A pair counts as a ratio only once it is beyond
// its noise (4 times its spread, and min_change), and keeps counting down
// to 3/4 of that; below, the pair says its ranks run as their probes say.
// Each group of linked ranks keeps its fastest rank's probe level as is.
// A correction is bounded: ranks whose layers were timed side by side
// (replicas) keep the differences those times show, but what such a group
// (or a rank alone) moves as one, which only layers timed before and after
// a move can say, stays within a factor max_layer_correction of its
// probes: the probe measures the rank and such a layer only refines it,
// since it cannot tell a slower rank from a change in its own cost at the
// switch. The corrections' spread joins the probes' in the gate that
// publishes a speed.
//
// A rank whose warm-up probes scattered too much to publish what their
// level says may be in doubt: its level lies beyond min_change and
// `doubt_sigmas` (fewer than publish_sigmas) standard errors of its
// published speed, and by more than doubt_min_change (a straggler, not
// the scatter of equal ranks' few probes), and it is within
// `doubt_probes` probes of the end of its warm-up. Priced at the
// published speed, such a rank's layers look lighter or heavier than they
// run; a decision waits those few probes for the speed (a straggler whose
// start probes scattered once had its first plan priced at speed 1 and
// stopped a move short).
//
// Pure and deterministic; thread-compatible.
#ifndef DYNMO_CORE_RANK_SPEED_H_
#define DYNMO_CORE_RANK_SPEED_H_

#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/layer_overlap.h"

namespace dynmo::core {

struct RankSpeedOptions {
  double smoothing = 0.3;        // EWMA weight of a new probe time, (0, 1]
  double noise_smoothing = 0.1;  // EWMA weight in the spread estimate, (0, 1]
  double sigmas = 3.0;           // a change must exceed this many sd ...
  double min_change = 0.05;      // ... and this much of the speed
  int confirmations = 3;         // probes in a row that agree
  int warmup = 5;                // probes of a rank before it has a speed
  double settle_smoothing = 0.05;  // EWMA floor of the settled level, (0, 1]
  double publish_sigmas = 5.0;    // standard errors a published speed moves by
  LayerOverlapOptions overlap;   // the layers' own evidence
  // The most the layers' evidence moves a probe's level, either way (>= 1;
  // 1: the probes alone).
  double max_layer_correction = 1.25;
  // A warm rank is in doubt (in_doubt) while its level is beyond
  // min_change and this many standard errors of its published speed, for
  // at most `doubt_probes` probes after its warm-up (0: never in doubt).
  double doubt_sigmas = 2.0;
  double doubt_min_change = 0.15;  // ... and beyond this much of the speed
  int doubt_probes = 4;
};

// OK for weights in (0, 1], sigmas, publish_sigmas, doubt_sigmas,
// doubt_min_change and min_change finite and >= 0, max_layer_correction
// finite and >= 1, confirmations and warmup >= 1, doubt_probes >= 0.
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
  // The probe time `rank` runs at (its level); 0 until it probed.
  double probe_s(int rank) const;
  // Whether `rank` finished its warm-up (has a level decisions use).
  bool warm(int rank) const;
  // The probes of `rank` so far; 0 for a rank out of range.
  int probes(int rank) const;
  // Whether `rank`'s newest probes came in faster than its level and have
  // neither confirmed a step nor come back: it may have sped up (a throttle
  // ended), so its layers' times are taken at a speed not yet published and,
  // priced at the old one, look cheaper than they are. False for a rank out
  // of range.
  bool may_be_faster(int rank) const;
  // Whether `rank` is warm but its probes have not yet published the
  // speed its level calls for, within doubt_probes of its warm-up (see
  // above). False for a rank out of range.
  bool in_doubt(int rank) const;
  // The layers' correction of `rank`'s probe level, exp(c_r); 1 without
  // overlaps.
  double correction(int rank) const;

  // Takes `pairs` as the newest evidence of those pairs (ranks out of
  // range and pairs not finite are ignored; a pair not listed keeps its
  // last evidence), refits the corrections to every pair known and
  // publishes what they call for. Returns true when any published speed
  // changed.
  bool SetOverlaps(const std::vector<RankOverlap>& pairs);

 private:
  bool Warm(size_t r) const;
  // The warmed-up ranks' pooled relative spread.
  double PooledNoise() const;
  // The spread of rank r's probes relative to its level (at least `pooled`).
  double RelativeNoise(size_t r, double pooled) const;
  // Folds a probe the level took in into rank r's settled level.
  void Settle(size_t r, double probe_s);
  // Moves the published speeds the levels now call for; true if any moved.
  bool Publish();

  RankSpeedOptions options_;
  std::vector<double> level_;      // probe seconds each rank runs at
  std::vector<double> settled_;    // mean probe seconds since the last step
  std::vector<double> settled_n_;  // probes in it (its weight floors it)
  std::vector<double> settled_f_;  // sum of its weights squared: se^2 / sd^2
  std::vector<double> var_;        // spread of the probes around the level
  std::vector<double> published_;  // what decisions use
  std::vector<char> doubt_;        // level beyond the published speed, unproven
  std::vector<int> count_;         // probes so far
  std::vector<std::vector<double>> pending_;  // probes in a row beyond the gate
  std::vector<double> correction_;     // c_r, log
  std::vector<double> correction_sd_;  // its spread, log
  // Every pair's last evidence, whether it was beyond noise, and whether
  // its layers were timed side by side (RankOverlap::concurrent).
  struct Pair {
    double log_ratio = 0;
    double sd = 0;
    bool beyond = false;
    bool concurrent = false;
  };
  std::map<std::pair<int, int>, Pair> pairs_;
};

}  // namespace dynmo::core

#endif  // DYNMO_CORE_RANK_SPEED_H_
