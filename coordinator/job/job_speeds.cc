#include "coordinator/job/job_speeds.h"

#include <algorithm>

namespace dynmo::service {

JobSpeeds::JobSpeeds(const std::string& job, int ranks, int num_layers,
                     const core::RankSpeedOptions& options, double smoothing)
    : job_(job),
      smoothing_(smoothing),
      speeds_(ranks, options),
      overlaps_(ranks, num_layers, options.overlap),
      exchange_s_(static_cast<size_t>(std::max(0, ranks)), 0.0),
      rebase_costs_(exchange_s_.size(), 0),
      correlation_(exchange_s_.size()) {}

JobSpeeds::Reported JobSpeeds::OnReport(int rank, const dynmo::v1::IterationReport& report,
                                        const std::vector<core::LayerCost>& raw,
                                        int microbatches, bool exchange_settled,
                                        JobEffects* out) {
  Reported got;
  // The raw times, as evidence of this rank's speed beside the others' (a
  // model change voids every earlier time), from the rank's first probe
  // on: its level then is what each time is taken relative to (a level
  // that moves later is a new regime).
  if (report.model_changed()) overlaps_.Forget();
  if (const double level = speeds_.probe_s(rank); level > 0) {
    for (const core::LayerCost& l : raw) {
      overlaps_.Add(rank, l.id, report.iteration(), l.time_s(), level);
    }
  }
  // Only a report that carries a probe can move a speed (and pays for the
  // copy the event compares against).
  if (report.probe_s() > 0) {
    const std::vector<double> before = speeds_.speeds();
    got.speed_moved = speeds_.AddProbe(rank, report.probe_s());
    if (report.iteration() > overlaps_fitted_iteration_) {
      overlaps_fitted_iteration_ = report.iteration();
      got.speed_moved = speeds_.SetOverlaps(overlaps_.Pairs()) || got.speed_moved;
    }
    if (got.speed_moved) {
      out->speeds_changed = true;
      // One event per rank whose speed moved (a probe of one rank can move
      // another's: the reference "full speed" is every rank's).
      for (int k = 0; k < speeds_.ranks(); ++k) {
        if (speeds_.speed(k) == before[static_cast<size_t>(k)]) continue;
        rebase_costs_[static_cast<size_t>(k)] = 1;
        out->events.push_back(JobEvent{LogLevel::kInfo, "rank_speed",
                                       {{"job", job_},
                                        {"rank", k},
                                        {"iteration", report.iteration()},
                                        {"speed", speeds_.speed(k)},
                                        {"previous", before[static_cast<size_t>(k)]},
                                        {"probe_s", speeds_.probe_s(k)},
                                        {"layer_correction", speeds_.correction(k)}}});
      }
    }
  }
  // A layer measured t on a rank of speed s costs t * s at speed 1.
  got.speed = speeds_.speed(rank);
  if (exchange_settled && report.exchange_s() > 0) {
    // Per micro-batch at speed 1, smoothed like the layers' costs.
    const double x = report.exchange_s() / std::max(1, microbatches) * got.speed;
    double& kept = exchange_s_[static_cast<size_t>(rank)];
    kept = kept > 0 ? kept + smoothing_ * (x - kept) : x;
  }
  // A rank whose speed moved: until the probes confirmed the step its
  // times were taken at the old speed, so its layers' smoothed costs mix
  // two regimes and their noise counts the step as scatter (which would
  // hold every plan back until it decayed). They start again from this
  // report, taken at the new speed, as after a model change.
  got.rebase = report.model_changed();
  if (rebase_costs_[static_cast<size_t>(rank)] != 0) {
    rebase_costs_[static_cast<size_t>(rank)] = 0;
    got.rebase = true;
  }
  return got;
}

std::vector<double> JobSpeeds::PositionSpeeds(const RankRoster& roster,
                                              const JobLayout& layout) const {
  const int pp = roster.shape().pipeline_size;
  const int dp = std::max(1, roster.shape().data_parallel_size);
  const std::vector<int>& active = layout.active_stages;
  std::vector<int> index(static_cast<size_t>(std::max(pp, 0)), -1);
  for (size_t i = 0; i < active.size(); ++i) {
    if (active[i] >= 0 && active[i] < pp) {
      index[static_cast<size_t>(active[i])] = static_cast<int>(i);
    }
  }
  std::vector<double> speeds(active.size() * static_cast<size_t>(dp), 1.0);
  for (int k = 0; k < roster.size(); ++k) {
    const RosterRank& r = roster.at(k);
    if (!r.registered || r.pipeline_rank < 0 || r.pipeline_rank >= pp ||
        r.data_parallel_rank < 0 || r.data_parallel_rank >= dp) {
      continue;
    }
    const int i = index[static_cast<size_t>(r.pipeline_rank)];
    if (i < 0) continue;
    speeds[static_cast<size_t>(i * dp + r.data_parallel_rank)] = speeds_.speed(k);
  }
  return speeds;
}

bool JobSpeeds::AnyActiveRank(const RankRoster& roster, const JobLayout& layout,
                              absl::FunctionRef<bool(int)> visit) const {
  const int known = std::min(roster.size(), static_cast<int>(exchange_s_.size()));
  for (int k = 0; k < known; ++k) {
    const RosterRank& r = roster.at(k);
    if (r.registered && RankRoster::IsActiveStage(layout.active_stages, r.pipeline_rank) &&
        visit(k)) {
      return true;
    }
  }
  return false;
}

bool JobSpeeds::Rising(const RankRoster& roster, const JobLayout& layout) const {
  return AnyActiveRank(roster, layout, [&](int k) { return speeds_.may_be_faster(k); });
}

bool JobSpeeds::Warming(const RankRoster& roster, const JobLayout& layout) const {
  return AnyActiveRank(roster, layout, [&](int k) {
    return (speeds_.probes(k) > 0 && !speeds_.warm(k)) || speeds_.in_doubt(k);
  });
}

void JobSpeeds::OnStage(int rank, int replica, const std::vector<core::LayerCost>& layers,
                        const core::CostProfile& profile, double weight, bool rebase) {
  if (layers.empty() || rank < 0 || rank >= static_cast<int>(correlation_.size())) return;
  double stage_s = 0, layer_var = 0;
  int first = layers.front().id;
  for (const core::LayerCost& l : layers) {
    stage_s += l.time_s();
    layer_var += profile.SampleVariance(replica, l.id);
    first = std::min(first, l.id);
  }
  correlation_[static_cast<size_t>(rank)].Add(stage_s, layer_var, first,
                                               static_cast<int>(layers.size()), weight, rebase);
}

double JobSpeeds::NoiseInflation(const RankRoster& roster, const JobLayout& layout) const {
  double inflation = 1;
  AnyActiveRank(roster, layout, [&](int k) {
    inflation = std::max(inflation, correlation_[static_cast<size_t>(k)].inflation());
    return false;
  });
  return inflation;
}

double JobSpeeds::Exchange(const RankRoster& roster, const JobLayout& layout) const {
  double exchange = 0;
  AnyActiveRank(roster, layout, [&](int k) {
    const double x = exchange_s_[static_cast<size_t>(k)];
    if (x > 0) exchange = exchange > 0 ? std::min(exchange, x) : x;
    return false;
  });
  return exchange;
}

}  // namespace dynmo::service
