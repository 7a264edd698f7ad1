// JobSpeeds: how fast each rank of one job runs, as the job's reports show
// it — the speed probes (core::RankSpeeds), the same layers timed on
// several ranks as their correction (core::LayerOverlaps), each rank's
// exchanges per micro-batch at speed 1, how far its layers' noise moves
// together (core::StageCorrelation) — and what follows for the layers'
// costs: a rank whose speed moved has its smoothed costs started again
// (a rank_speed event per move). JobMachine feeds it every active rank's
// report and prices its PipelineModel with it.
//
// Thread-compatible: the owner serialises every call.
#ifndef DYNMO_COORDINATOR_JOB_JOB_SPEEDS_H_
#define DYNMO_COORDINATOR_JOB_JOB_SPEEDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "core/cost_model.h"
#include "core/cost_noise.h"
#include "core/cost_profile.h"
#include "core/layer_overlap.h"
#include "core/rank_speed.h"
#include "coordinator/job/job_effects.h"
#include "coordinator/job/job_layout.h"
#include "coordinator/job/rank_roster.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::service {

class JobSpeeds {
 public:
  JobSpeeds(const std::string& job, int ranks, int num_layers,
            const core::RankSpeedOptions& options, double smoothing);

  // What an active rank's report says of its speed.
  struct Reported {
    double speed = 1;          // the rank's, to price its times at speed 1
    bool speed_moved = false;  // some rank's published speed moved
    bool rebase = false;       // the rank's smoothed costs start again
  };
  // `raw`: the report's layers as measured. Its exchanges count only with
  // `exchange_settled` (not an iteration around a plan's switch, whose
  // exchanges carry the migration and the new layout's first waits: the
  // main job's measured 7-9 ms per micro-batch there against 1-1.4 ms
  // after, which priced its next plan's gain at 18% for 30% delivered).
  // Events (rank_speed) and speeds_changed go to `out`.
  Reported OnReport(int rank, const dynmo::v1::IterationReport& report,
                    const std::vector<core::LayerCost>& raw, int microbatches,
                    bool exchange_settled, JobEffects* out);

  // After the report's layers went into `profile` (at speed 1, `rebase` as
  // OnReport said): the rank's stage time beside its layers' spreads.
  void OnStage(int rank, int replica, const std::vector<core::LayerCost>& layers,
               const core::CostProfile& profile, double weight, bool rebase);
  // The largest StageCorrelation::inflation() of an active rank: how much
  // more than independent the job's layer noise adds up. O(ranks).
  double NoiseInflation(const RankRoster& roster, const JobLayout& layout) const;

  const core::RankSpeeds& ranks() const { return speeds_; }
  // Each active rank's speed by position, active stage index * dp +
  // replica (DecisionInput::rank_speeds); 1 where a rank has not
  // registered. O(ranks).
  std::vector<double> PositionSpeeds(const RankRoster& roster,
                                     const JobLayout& layout) const;
  // Whether an active rank's probes say it may have sped up, not yet
  // confirmed (core::RankSpeeds::may_be_faster). O(ranks).
  bool Rising(const RankRoster& roster, const JobLayout& layout) const;
  // Whether an active rank has probed but not yet as often as a speed
  // needs (core::RankSpeedOptions::warmup): its layers are priced at speed
  // 1 until then; or is warm but in doubt (core::RankSpeeds::in_doubt: its
  // level not yet published, for a few probes). O(ranks).
  bool Warming(const RankRoster& roster, const JobLayout& layout) const;
  // Every stage's exchanges per micro-batch at speed 1: what the active
  // rank that waits least measured (the bottleneck's are nearly all
  // sending and receiving); 0 when none did.
  double Exchange(const RankRoster& roster, const JobLayout& layout) const;

 private:
  // Calls `visit(k)` for each rank k of `roster` that is registered on an
  // active stage of `layout` and that this JobSpeeds knows, in rank order,
  // until it returns true; returns whether one did. O(ranks).
  bool AnyActiveRank(const RankRoster& roster, const JobLayout& layout,
                     absl::FunctionRef<bool(int)> visit) const;

  std::string job_;
  double smoothing_;
  core::RankSpeeds speeds_;
  // The same layer timed on several ranks (replicas, before and after a
  // move): the layers' correction of the probes (core/layer_overlap.h),
  // refitted at most once per iteration, on a report that carries a probe.
  core::LayerOverlaps overlaps_;
  int64_t overlaps_fitted_iteration_ = -1;
  // Per rank: its exchanges' seconds per micro-batch at speed 1, smoothed
  // (0 = never measured).
  std::vector<double> exchange_s_;
  // Per rank: its speed moved since its last report, so its layers'
  // smoothed costs and noise start again from its next one.
  std::vector<char> rebase_costs_;
  // Per rank: its stage's time against its layers' spreads.
  std::vector<core::StageCorrelation> correlation_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_JOB_SPEEDS_H_
