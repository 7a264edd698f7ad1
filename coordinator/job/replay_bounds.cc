#include "coordinator/job/replay_bounds.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/partition.h"

namespace dynmo::service {
namespace {

absl::Status Validate(const ElasticBoundsInput& in) {
  if (in.pp < 1 || in.dp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pp and dp must be >= 1, got ", in.pp, " and ", in.dp));
  }
  if (in.records.empty() || in.records.size() != in.static_iteration_s.size() ||
      (!in.rank_speeds.empty() && in.rank_speeds.size() != in.records.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bounds need one static time (and speed list) per record, got ", in.records.size(),
        " records, ", in.static_iteration_s.size(), " times, ", in.rank_speeds.size(),
        " speed lists"));
  }
  for (const std::vector<double>& speeds : in.rank_speeds) {
    if (speeds.size() != static_cast<size_t>(in.pp * in.dp)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a speed list must name all ", in.pp * in.dp, " ranks, got ", speeds.size()));
    }
  }
  const auto in_unit = [](double x) { return std::isfinite(x) && x > 0 && x <= 1; };
  if (!in_unit(in.min_throughput_share) || !in_unit(in.tail_fraction)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the throughput share and the tail fraction must be in (0, 1], got ",
        in.min_throughput_share, " and ", in.tail_fraction));
  }
  return absl::OkStatus();
}

// The fastest `count` of record `t`'s rank speeds, fastest first; empty
// when every rank runs at 1.
std::vector<double> FastestSpeeds(const ElasticBoundsInput& in, size_t t, int count) {
  if (in.rank_speeds.empty()) return {};
  std::vector<double> speeds = in.rank_speeds[t];
  std::sort(speeds.begin(), speeds.end(), std::greater<double>());
  speeds.resize(static_cast<size_t>(count));
  return speeds;
}

}  // namespace

int TailStart(int n, double tail_fraction) {
  const int tail = std::max(1, static_cast<int>(std::ceil(n * tail_fraction)));
  return std::max(0, n - tail);
}

absl::StatusOr<ReleaseBound> ReleaseGpuSecondsBound(const ElasticBoundsInput& in) {
  if (absl::Status s = Validate(in); !s.ok()) return s;
  // Per record, each stage count's (time, GPU-seconds); static always counts.
  struct Option {
    double time_s;
    double gpu_s;
  };
  std::vector<std::vector<Option>> options(in.records.size());
  ReleaseBound out;
  double budget_s = 0;
  for (size_t t = 0; t < in.records.size(); ++t) {
    const std::vector<core::LayerCost>& layers = in.records[t];
    const double static_s = in.static_iteration_s[t];
    out.static_gpu_s += static_s * in.pp * in.dp;
    budget_s += static_s / in.min_throughput_share;
    options[t].push_back({static_s, static_s * in.pp * in.dp});
    for (int s = 1; s <= std::min<int>(in.pp, static_cast<int>(layers.size())); ++s) {
      core::ShapeSpec spec = in.spec;
      spec.rank_speeds = FastestSpeeds(in, t, s * in.dp);
      const core::Grid from{s, in.dp, core::PartitionUniform(static_cast<int>(layers.size()), s)};
      absl::StatusOr<core::ShapeCost> c = core::CostOfShape(layers, spec, from, s, in.dp);
      if (!c.ok()) continue;  // does not fit on s stages
      options[t].push_back({c->iteration_s, c->iteration_s * s * in.dp});
    }
  }
  // LB(lambda) = sum_t min_s (gpu + lambda time) - lambda budget, for
  // lambda = 0 and a geometric grid up to far beyond any rank count.
  double best = 0;
  const int n = in.pp * in.dp;
  for (int k = -1; k <= 400; ++k) {
    const double lambda = k < 0 ? 0.0 : 1e-3 * n * std::pow(10.0, k / 50.0);
    double sum = -lambda * budget_s;
    for (const std::vector<Option>& opts : options) {
      double least = std::numeric_limits<double>::infinity();
      for (const Option& o : opts) least = std::min(least, o.gpu_s + lambda * o.time_s);
      sum += least;
    }
    best = std::max(best, sum);
  }
  out.min_gpu_s = best;
  out.fraction = out.static_gpu_s > 0 ? best / out.static_gpu_s : 1;
  return out;
}

absl::StatusOr<ReshapeBound> ReshapeSpeedBound(const ElasticBoundsInput& in) {
  if (absl::Status s = Validate(in); !s.ok()) return s;
  const int n = static_cast<int>(in.records.size());
  const int tail_start = TailStart(n, in.tail_fraction);
  double static_total = 0, static_tail = 0, best_tail = 0;
  ReshapeBound out;
  for (int t = 0; t < n; ++t) {
    const std::vector<core::LayerCost>& layers = in.records[static_cast<size_t>(t)];
    core::ShapeSpec spec = in.spec;
    spec.data_parallel.copy_bandwidth_bytes_per_s = 0;
    spec.rank_speeds = FastestSpeeds(in, static_cast<size_t>(t), in.pp * in.dp);
    const core::Grid from{in.pp, in.dp,
                          core::PartitionUniform(static_cast<int>(layers.size()), in.pp)};
    absl::StatusOr<std::vector<core::ShapeCost>> shapes =
        core::FeasibleShapes(layers, spec, from);
    if (!shapes.ok()) {
      return absl::Status(shapes.status().code(),
                          absl::StrCat("record ", t, ": ", shapes.status().message()));
    }
    const double static_s = in.static_iteration_s[static_cast<size_t>(t)];
    const double best = std::min(static_s, shapes->front().iteration_s);
    static_total += static_s;
    out.total_s += best;
    if (t >= tail_start) {
      static_tail += static_s;
      best_tail += best;
    }
  }
  out.speedup = out.total_s > 0 ? static_total / out.total_s : 1;
  out.tail_speedup = best_tail > 0 ? static_tail / best_tail : 1;
  return out;
}

}  // namespace dynmo::service
