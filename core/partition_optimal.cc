// The exact partitioner.
//
// Phase 1 finds the minimum bottleneck B*. A stage's cost and memory only grow
// when its layer range grows, so "can the pipeline run with bottleneck <= B?"
// is monotone in B and is answered exactly by propagating the set of positions
// reachable after each stage (kept as a few intervals). Because every stage
// cost is a double computed by one formula, B* is itself a double, and a
// bisection over the ordered bit patterns of non-negative doubles finds the
// smallest feasible one in at most 64 probes: no epsilon, nothing missed.
//
// Phase 2 picks, among partitions with bottleneck <= B*, the one that keeps
// the most resident bytes where they are (a DP over the reachable positions,
// with range-max queries split where the kept-bytes term changes shape).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/partition.h"
#include "core/partition_internal.h"

namespace dynmo::core {
namespace internal {
namespace {

using Interval = std::pair<int, int>;  // inclusive [lo, hi]
using Intervals = std::vector<Interval>;

constexpr int64_t kNone = std::numeric_limits<int64_t>::min() / 4;

// Sparse table: maximum of a fixed array over [a, b] in O(1).
template <typename T>
class RangeMax {
 public:
  explicit RangeMax(std::vector<T> v) {
    table_.push_back(std::move(v));
    const int m = static_cast<int>(table_[0].size());
    for (int l = 1; (1 << l) <= m; ++l) {
      const std::vector<T>& prev = table_.back();
      std::vector<T> next(m - (1 << l) + 1);
      for (size_t i = 0; i < next.size(); ++i) {
        next[i] = std::max(prev[i], prev[i + (1 << (l - 1))]);
      }
      table_.push_back(std::move(next));
    }
  }
  T Max(int a, int b) const {
    const int lev = 31 - __builtin_clz(static_cast<unsigned>(b - a + 1));
    return std::max(table_[lev][a], table_[lev][b - (1 << lev) + 1]);
  }

 private:
  std::vector<std::vector<T>> table_;
};

class StageOracle {
 public:
  explicit StageOracle(const PipelineModel& model)
      : model_(model),
        prefix_(model.layers),
        n_(static_cast<int>(model.layers.size())),
        k_(static_cast<int>(model.stages.size())),
        single_time_(PerLayer<double>([&](int i) { return prefix_.time(i, i + 1); })),
        single_resident_(PerLayer<int64_t>([&](int i) { return prefix_.resident(i, i + 1); })),
        single_activation_(PerLayer<int64_t>([&](int i) { return prefix_.activation(i, i + 1); })) {}

  int n() const { return n_; }
  int k() const { return k_; }
  const LayerPrefix& prefix() const { return prefix_; }

  double Cost(int s, int i, int j) const {
    return StageTime(prefix_, model_.stages[s], model_.link, s, k_, i, j);
  }
  bool Ok(int s, int i, int j, double bound) const {
    return Cost(s, i, j) <= bound && FitsMemory(prefix_, model_.stages[s], i, j);
  }
  // Largest j in [i, n] with Ok(s, i, j); i itself when layer i alone fails.
  int Reach(int s, int i, double bound) const {
    int lo = i, hi = n_;  // invariant: Ok(lo) (or lo == i), answer in [lo, hi]
    while (lo < hi) {
      int mid = lo + (hi - lo + 1) / 2;
      if (Ok(s, i, mid, bound)) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
  // True when no layer in [a, b] is too big to sit alone on stage s at
  // `bound`. Conservative (uses separate maxima of the memory terms): false
  // only means "look closer". x -> (x + exchange) / speed + link is monotone in floating
  // point, so the time test is exact.
  bool AllLive(int s, int a, int b, double bound) const {
    const StageSpec& st = model_.stages[s];
    const double t = (single_time_.Max(a, b) + st.exchange_s) / st.speed +
                     (s + 1 < k_ ? model_.link.exposed_transfer_s() : 0.0);
    if (!(t <= bound)) return false;
    if (st.capacity_bytes < 0) return true;
    return single_resident_.Max(a, b) +
               static_cast<int64_t>(st.inflight_microbatches) *
                   single_activation_.Max(a, b) <=
           st.capacity_bytes;
  }
  // Smallest i in [0, j] with Ok(s, i, j); j itself when layer j-1 alone fails.
  int ReachBack(int s, int j, double bound) const {
    int lo = 0, hi = j;
    while (lo < hi) {
      int mid = lo + (hi - lo) / 2;
      if (Ok(s, mid, j, bound)) hi = mid; else lo = mid + 1;
    }
    return lo;
  }

 private:
  template <typename T, typename F>
  std::vector<T> PerLayer(F f) const {
    std::vector<T> v(n_);
    for (int i = 0; i < n_; ++i) v[i] = f(i);
    return v;
  }

  const PipelineModel& model_;
  LayerPrefix prefix_;
  int n_, k_;
  RangeMax<double> single_time_;
  RangeMax<int64_t> single_resident_, single_activation_;
};

// Appends [lo, hi] to a sorted interval list, merging touching intervals.
void Append(Intervals& out, int lo, int hi) {
  if (lo > hi) return;
  if (!out.empty() && lo <= out.back().second + 1) {
    out.back().second = std::max(out.back().second, hi);
  } else {
    out.push_back({lo, hi});
  }
}

// Ends reachable on stage s from the starts in [a, b]. A start is "live" when
// its own layer fits the stage alone. Ends from start i are exactly
// (i, Reach(i)], and Reach never decreases from one live start to a later
// one, so a run of live starts [a, b] reaches exactly [a + 1, Reach(b)].
// Runs containing dead starts are split until the pieces are live or single.
void EndsFrom(const StageOracle& o, int s, int a, int b, double bound,
              int max_pos, Intervals& out) {
  if (o.AllLive(s, a, b, bound)) {
    Append(out, a + 1, std::min(o.Reach(s, b, bound), max_pos));
    return;
  }
  if (a == b) {
    if (o.Ok(s, a, a + 1, bound)) {
      Append(out, a + 1, std::min(o.Reach(s, a, bound), max_pos));
    }
    return;
  }
  const int mid = a + (b - a) / 2;
  EndsFrom(o, s, a, mid, bound, max_pos, out);
  EndsFrom(o, s, mid + 1, b, bound, max_pos, out);
}

// Positions reachable after stage s from the positions `starts` reachable
// before it, keeping a layer for each later stage.
Intervals NextReachable(const StageOracle& o, int s, const Intervals& starts,
                        double bound) {
  Intervals out;
  const int max_pos = o.n() - (o.k() - 1 - s);
  for (const auto& [a, b] : starts) {
    EndsFrom(o, s, a, std::min(b, o.n() - 1), bound, max_pos, out);
  }
  return out;
}

bool Contains(const Intervals& set, int x) {
  for (const auto& [lo, hi] : set) {
    if (lo <= x && x <= hi) return true;
  }
  return false;
}

// Reachable sets R_0..R_k for `bound`; stops early when one becomes empty.
std::vector<Intervals> ReachableSets(const StageOracle& o, double bound) {
  std::vector<Intervals> sets;
  sets.reserve(o.k() + 1);
  sets.push_back({{0, 0}});
  for (int s = 0; s < o.k() && !sets.back().empty(); ++s) {
    sets.push_back(NextReachable(o, s, sets.back(), bound));
  }
  return sets;
}

bool Feasible(const StageOracle& o, double bound) {
  std::vector<Intervals> sets = ReachableSets(o, bound);
  return static_cast<int>(sets.size()) == o.k() + 1 &&
         Contains(sets.back(), o.n());
}

uint64_t Bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}
double FromBits(uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
}

// Explains why no partition fits the memory caps at any bottleneck.
absl::Status ExplainInfeasibleCaps(const PipelineModel& model,
                                   const StageOracle& o) {
  const double inf = std::numeric_limits<double>::infinity();
  for (int l = 0; l < o.n(); ++l) {
    bool fits_somewhere = false;
    for (int s = 0; s < o.k() && !fits_somewhere; ++s) {
      fits_somewhere = FitsMemory(o.prefix(), model.stages[s], l, l + 1);
    }
    if (!fits_somewhere) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory caps admit no partition: layer ", l, " needs ",
          o.prefix().resident(l, l + 1), " resident bytes and fits no stage"));
    }
  }
  std::vector<Intervals> sets = ReachableSets(o, inf);
  int furthest = 0;
  for (size_t s = 0; s < sets.size(); ++s) {
    if (!sets[s].empty()) furthest = std::max(furthest, sets[s].back().second);
  }
  if (sets.size() < static_cast<size_t>(o.k()) + 1 || sets.back().empty()) {
    int stage = static_cast<int>(sets.size()) - 2;
    return absl::InvalidArgumentError(absl::StrCat(
        "memory caps admit no partition: stages 0..", std::max(stage, 0),
        " cannot hold layers in order beyond layer ", furthest,
        " of ", o.n(), " (total capacity too small or a stage too small for "
        "its share)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "memory caps admit no partition: the last stage cannot take the "
      "remaining layers (furthest reach: layer ", furthest, " of ", o.n(), ")"));
}

// Maximum of values[idx] over a window of `positions` whose two ends only
// move right (a monotone deque). Ties go to the smaller index, so results
// are deterministic.
class SlidingMax {
 public:
  SlidingMax(const std::vector<int>& positions,
             const std::vector<int64_t>& values)
      : pos_(positions), val_(values) {}

  // Index of the maximum over positions in [lo, hi]; -1 when none.
  int Query(int lo, int hi) {
    while (next_ < static_cast<int>(pos_.size()) && pos_[next_] <= hi) {
      if (val_[next_] != kNone) {
        while (!dq_.empty() && val_[dq_.back()] < val_[next_]) dq_.pop_back();
        dq_.push_back(next_);
      }
      ++next_;
    }
    while (!dq_.empty() && pos_[dq_.front()] < lo) dq_.pop_front();
    if (lo > hi || dq_.empty() || pos_[dq_.front()] > hi) return -1;
    return dq_.front();
  }

 private:
  const std::vector<int>& pos_;
  const std::vector<int64_t>& val_;
  std::deque<int> dq_;
  int next_ = 0;
};

std::vector<int> Expand(const Intervals& set, int lower) {
  std::vector<int> out;
  for (const auto& [lo, hi] : set) {
    for (int x = std::max(lo, lower); x <= hi; ++x) out.push_back(x);
  }
  return out;
}

// Phase 2: among partitions with every stage Ok at `bound`, maximise kept
// bytes. Domain of boundary s: reachable positions no smaller than the
// backward bound G_s (the earliest start from which stages s.. can finish).
absl::StatusOr<ExactPartition> MaximiseKept(const StageOracle& o,
                                            const CurrentRanges& current,
                                            double bound) {
  const int n = o.n(), k = o.k();
  const LayerPrefix& p = o.prefix();
  std::vector<Intervals> sets = ReachableSets(o, bound);
  std::vector<int> earliest(k + 1, 0);
  earliest[k] = n;
  for (int s = k - 1; s >= 0; --s) {
    earliest[s] = std::min(o.ReachBack(s, earliest[s + 1], bound),
                           earliest[s + 1] - 1);
  }
  std::vector<std::vector<int>> domain(k + 1);
  for (int s = 0; s <= k; ++s) domain[s] = Expand(sets[s], earliest[s]);

  std::vector<std::vector<int64_t>> value(k + 1);
  std::vector<std::vector<int>> parent(k + 1);  // index into domain[s-1]
  value[0].assign(domain[0].size(), kNone);
  if (!domain[0].empty() && domain[0][0] == 0) value[0][0] = 0;

  for (int s = 0; s < k; ++s) {
    const std::vector<int>& from = domain[s];
    const std::vector<int>& to = domain[s + 1];
    const std::vector<int64_t>& g = value[s];
    std::vector<int64_t> g_minus_w(g.size());
    for (size_t x = 0; x < g.size(); ++x) {
      g_minus_w[x] = g[x] == kNone ? kNone : g[x] - p.resident(0, from[x]);
    }
    // Without a current layout nothing is kept: c = e = -1 routes every
    // start into the "keeps nothing" window.
    const bool has_cur = static_cast<size_t>(s) < current.size() &&
                         current[s].first < current[s].second;
    const int c = has_cur ? current[s].first : -1;
    const int e = has_cur ? current[s].second : -1;
    // Three windows over the starts, split where the kept-bytes term changes
    // shape; all their ends move right as j grows, so each is a deque.
    SlidingMax keeps_head(from, g);          // i <= c: keeps [c, min(j, e))
    SlidingMax keeps_tail(from, g_minus_w);  // c < i < min(j, e): keeps [i, ..)
    SlidingMax keeps_none(from, g);          // i >= max(c + 1, min(j, e))
    value[s + 1].assign(to.size(), kNone);
    parent[s + 1].assign(to.size(), -1);
    int lo = -1;  // L(j): smallest start with Ok(s, i, j); never decreases
    for (size_t y = 0; y < to.size(); ++y) {
      const int j = to[y];
      if (lo < 0) lo = o.ReachBack(s, j, bound);
      while (lo < j && !o.Ok(s, lo, j, bound)) ++lo;
      const int hi = j - 1;
      const int je = std::min(j, e);
      int64_t best = kNone;
      int arg = -1;
      auto consider = [&](int idx, int64_t v) {
        if (idx < 0) return;
        if (v > best || (v == best && idx < arg)) {
          best = v;
          arg = idx;
        }
      };
      // Query every window even when empty so each deque sees every j.
      if (int idx = keeps_head.Query(lo, std::min(hi, c)); idx >= 0) {
        consider(idx, g[idx] + (je > c ? p.resident(c, je) : 0));
      }
      if (int idx = keeps_tail.Query(std::max(lo, c + 1), std::min(hi, je - 1));
          idx >= 0) {
        consider(idx, g_minus_w[idx] + p.resident(0, je));
      }
      if (int idx = keeps_none.Query(std::max({lo, c + 1, je}), hi); idx >= 0) {
        consider(idx, g[idx]);
      }
      value[s + 1][y] = best;
      parent[s + 1][y] = arg;
    }
  }
  const std::vector<int>& last = domain[k];
  if (last.empty() || last.back() != n || value[k].back() == kNone) {
    return absl::InternalError("exact partitioner: no partition at the "
                               "bound its feasibility check accepted");
  }
  ExactPartition out;
  out.kept_bytes = value[k].back();
  out.boundaries.assign(k + 1, 0);
  int idx = static_cast<int>(last.size()) - 1;
  for (int s = k; s > 0; --s) {
    out.boundaries[s] = domain[s][idx];
    idx = parent[s][idx];
  }
  out.boundaries[0] = 0;
  double worst = 0;
  for (int s = 0; s < k; ++s) {
    worst = std::max(worst, o.Cost(s, out.boundaries[s], out.boundaries[s + 1]));
  }
  out.bottleneck = worst;
  return out;
}

absl::StatusOr<double> MinimumBottleneck(const PipelineModel& model,
                                         const StageOracle& o) {
  const double inf = std::numeric_limits<double>::infinity();
  if (!Feasible(o, inf)) return ExplainInfeasibleCaps(model, o);
  // Smallest feasible double in [0, +inf]: bisection on the bit patterns,
  // which order non-negative doubles exactly like their values.
  uint64_t lo = Bits(0.0), hi = Bits(inf);
  if (Feasible(o, 0.0)) return 0.0;
  while (hi - lo > 1) {  // invariant: infeasible(lo), feasible(hi)
    uint64_t mid = lo + (hi - lo) / 2;
    if (Feasible(o, FromBits(mid))) hi = mid; else lo = mid;
  }
  return FromBits(hi);
}

absl::Status CheckShape(const PipelineModel& model) {
  if (absl::Status st = ValidateModel(model); !st.ok()) return st;
  if (model.stages.size() > model.layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "more stages (", model.stages.size(), ") than layers (",
        model.layers.size(), "): every stage needs at least one layer"));
  }
  return absl::OkStatus();
}

}  // namespace

CurrentRanges RangesOf(const Boundaries& b) {
  CurrentRanges out;
  for (size_t s = 0; s + 1 < b.size(); ++s) out.push_back({b[s], b[s + 1]});
  return out;
}

absl::StatusOr<ExactPartition> SolveExact(const PipelineModel& model,
                                          const CurrentRanges& current,
                                          double near_tie) {
  if (absl::Status st = CheckShape(model); !st.ok()) return st;
  StageOracle oracle(model);
  absl::StatusOr<double> bound = MinimumBottleneck(model, oracle);
  if (!bound.ok()) return bound.status();
  if (near_tie > 0 && !current.empty()) {
    absl::StatusOr<ExactPartition> near =
        MaximiseKept(oracle, current, *bound * (1 + near_tie));
    if (near.ok()) return near;
  }
  return MaximiseKept(oracle, current, *bound);
}

}  // namespace internal

absl::StatusOr<double> OptimalBottleneck(const PipelineModel& model) {
  if (absl::Status st = internal::CheckShape(model); !st.ok()) return st;
  internal::StageOracle oracle(model);
  return internal::MinimumBottleneck(model, oracle);
}

absl::StatusOr<Boundaries> PartitionOptimal(const PipelineModel& model,
                                            const Boundaries* current, double near_tie) {
  internal::CurrentRanges ranges;
  if (current != nullptr) {
    if (absl::Status st = ValidateBoundaries(
            *current, static_cast<int>(model.layers.size()),
            static_cast<int>(model.stages.size()));
        !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("current partition: ", st.message()));
    }
    ranges = internal::RangesOf(*current);
  }
  absl::StatusOr<internal::ExactPartition> exact =
      internal::SolveExact(model, ranges, near_tie);
  if (!exact.ok()) return exact.status();
  return exact->boundaries;
}

absl::StatusOr<Boundaries> PartitionMinBottleneck(
    absl::Span<const double> weights, int num_stages) {
  if (num_stages < 1) {
    return absl::InvalidArgumentError("need at least one stage");
  }
  PipelineModel model;
  model.stages.assign(num_stages, StageSpec{});
  model.layers.resize(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    model.layers[i].id = static_cast<int>(i);
    model.layers[i].fwd_s = weights[i];
  }
  return PartitionOptimal(model, nullptr);
}

}  // namespace dynmo::core
