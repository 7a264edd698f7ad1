#include "core/scenario_models.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/scenario_random.h"

namespace dynmo::core::scenario_internal {
namespace {

int64_t DenseBytes(const ScenarioConfig& c) {
  return c.layer_params * c.bytes_per_param;
}

// Relative depth of layer i's input: 0 for the first layer, < 1 for the last.
double InputDepth(int i, int layers) { return static_cast<double>(i) / layers; }

// Relative position of layer i between the first (0) and the last (1).
double Position(int i, int layers) {
  return layers > 1 ? static_cast<double>(i) / (layers - 1) : 0.5;
}

// A stationary AR(1) process with unit variance per element: each step keeps
// `rho` of the old value, so batches in a row look alike while the process
// still wanders over hundreds of iterations, as measured loads do.
class Ar1 {
 public:
  Ar1(int size, double rho, ScenarioRandom& rng) : rho_(rho), x_(size) {
    for (double& v : x_) v = rng.Normal();
  }
  void Step(ScenarioRandom& rng) {
    const double fresh = std::sqrt(1 - rho_ * rho_);
    for (double& v : x_) v = rho_ * v + fresh * rng.Normal();
  }
  double operator[](int i) const { return x_[i]; }

 private:
  double rho_;
  std::vector<double> x_;
};

// Token-choice routing over `experts` experts in each of `layers` layers.
// Router logits drift as an AR(1) process (the auxiliary loss keeps pulling
// them back, so they mean-revert rather than run away). The layer finishes
// when its busiest expert does, so its MLP time scales with
// experts * max share: 1 when perfectly balanced.
class RouterDrift {
 public:
  RouterDrift(int layers, int experts, double rho, ScenarioRandom& rng)
      : experts_(experts), logits_(layers * experts, rho, rng) {}
  void Step(ScenarioRandom& rng) { logits_.Step(rng); }

  // experts * max share of layer `layer` when its logits have spread `sigma`.
  double BusiestExpertFactor(int layer, double sigma) const {
    double max_logit = -std::numeric_limits<double>::infinity();
    double sum = 0;
    for (int e = 0; e < experts_; ++e) {
      max_logit = std::max(max_logit, sigma * logits_[layer * experts_ + e]);
    }
    for (int e = 0; e < experts_; ++e) {
      sum += std::exp(sigma * logits_[layer * experts_ + e] - max_logit);
    }
    return experts_ / sum;  // experts * exp(max - max) / sum
  }

 private:
  int experts_;
  Ar1 logits_;
};

// ---- pruning -------------------------------------------------------------

constexpr double kFinalSparsity = 0.9;
constexpr int kPruningSteps = 10;
constexpr double kPruningStart = 0.1;  // progress of the first pruning step
constexpr double kPruningSpan = 0.7;   // progress from first to last step
// Unstructured sparse kernels beat dense GEMM only at low density: at 30% of
// the weights a sparse kernel about matches dense, below it wins in
// proportion to the non-zeros.
constexpr double kSparseBreakEvenDensity = 0.3;
constexpr int64_t kCsrIndexBytes = 4;  // int32 column index per non-zero

// Zhu & Gupta (2017): S_t = S_f + (S_i - S_f)(1 - (t - t0)/(n dt))^3 with
// S_i = 0, evaluated at pruning step j = (t - t0) / dt.
double CubicSparsity(int step) {
  const double left = 1.0 - static_cast<double>(step) / kPruningSteps;
  return kFinalSparsity * (1.0 - left * left * left);
}

// Global magnitude pruning: one threshold tau over all layers; a layer whose
// weights are N(0, scale^2) keeps P(|w| > tau) = erfc(tau / (scale sqrt 2)).
// Finds tau so the kept fraction over the (equal-sized) layers is
// 1 - sparsity, by bisection (the kept fraction falls as tau rises).
std::vector<double> GlobalMagnitudeDensities(const std::vector<double>& scale,
                                             double sparsity) {
  auto kept = [&](double tau, std::vector<double>* out) {
    double total = 0;
    for (size_t i = 0; i < scale.size(); ++i) {
      const double d = std::erfc(tau / (scale[i] * std::sqrt(2.0)));
      if (out) (*out)[i] = d;
      total += d;
    }
    return total / scale.size();
  };
  const double target = 1.0 - sparsity;
  double lo = 0, hi = 10 * *std::max_element(scale.begin(), scale.end());
  for (int it = 0; it < 200 && hi - lo > 1e-15 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    (kept(mid, nullptr) > target ? lo : hi) = mid;
  }
  std::vector<double> density(scale.size());
  kept(0.5 * (lo + hi), &density);
  return density;
}

// ---- freezing ------------------------------------------------------------

constexpr double kFreezeStart = 0.2;         // progress of the first freeze
constexpr double kFreezeLastLayer = 0.9;     // when the last freezable one goes
constexpr double kMaxFrozenShare = 0.75;     // the head-side quarter trains on
constexpr int kFreezeChecks = 20;            // checks over the whole trace
constexpr double kFreezeJitter = 0.04;       // per-layer jitter, in progress
constexpr int64_t kFrozenBytesPerParam = 2;  // fp16 weights only

// ---- sparse attention ----------------------------------------------------

constexpr double kSparsityRho = 0.9;
constexpr double kSparsityNoise = 0.15;  // log-space std of batch noise
constexpr double kMinAttentionShare = 0.02;

// ---- early exit ----------------------------------------------------------

constexpr double kFinalSurvivors = 0.15;  // tokens reaching the end at u = 1
constexpr double kExitBatchNoise = 0.15;  // log-space std of kappa per batch

// ---- MoE and MoD ---------------------------------------------------------

constexpr int kExperts = 8;
constexpr double kRouterRho = 0.95;
constexpr double kMoEMaxLogitSpread = 0.45;  // ~1.7x busiest expert
constexpr int kExpertsPerRank = 2;           // 8 experts over 4 EP ranks
constexpr double kModCapacity = 0.125;       // Raposo et al.'s best setting
constexpr double kModWarmup = 0.3;           // capacity anneal ends here
constexpr double kPredictorRho = 0.8;
constexpr double kPredictorNoise = 0.2;   // log-space std at full routing
constexpr double kPredictorBias = 0.35;   // log-space std across layers
constexpr double kModLogitSpread = 0.12;  // the MoE inside MoD blocks

}  // namespace

LoadSeries DenseSeries(const ScenarioConfig& c) {
  LayerLoad dense;
  dense.mem_bytes = DenseBytes(c);
  return LoadSeries(c.iterations, std::vector<LayerLoad>(c.layers, dense));
}


double Progress(int k, int iterations) {
  return iterations > 1 ? static_cast<double>(k) / (iterations - 1) : 0.0;
}

LoadSeries PruningLoads(const ScenarioConfig& c) {
  ScenarioRandom traits(c.seed, kTraitStream);
  // Layers differ in weight scale, so one global threshold prunes them
  // unevenly; the first and last layers carry larger weights and keep more,
  // as magnitude pruning of transformers typically finds.
  std::vector<double> scale(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    const double edge = std::fabs(2 * Position(i, c.layers) - 1);
    scale[i] = std::exp(0.3 * traits.Normal()) * (1 + 0.4 * edge);
  }
  const int last = c.iterations - 1;
  const int t0 = static_cast<int>(std::lround(kPruningStart * last));
  const int dt = std::max(
      1, static_cast<int>(std::lround(kPruningSpan * last / kPruningSteps)));

  LoadSeries out = DenseSeries(c);
  std::vector<double> density(c.layers, 1.0);
  int step = -1;
  for (int k = 0; k < c.iterations; ++k) {
    const int now = k < t0 ? -1 : std::min(kPruningSteps, (k - t0) / dt);
    if (now != step) {
      step = now;
      density =
          GlobalMagnitudeDensities(scale, step < 0 ? 0 : CubicSparsity(step));
    }
    for (int i = 0; i < c.layers; ++i) {
      LayerLoad& l = out[k][i];
      const double d = density[i];
      if (d < kSparseBreakEvenDensity) {
        l.projections = l.mlp = d / kSparseBreakEvenDensity;
        l.mem_bytes = std::llround(c.layer_params * d *
                                   (c.bytes_per_param + kCsrIndexBytes));
      }
      // Above break-even the layer runs dense with a mask: no time or bytes
      // saved (the mask's bit per weight is negligible).
    }
  }
  return out;
}

LoadSeries FreezingLoads(const ScenarioConfig& c) {
  ScenarioRandom traits(c.seed, kTraitStream);
  const int freezable =
      static_cast<int>(std::floor(kMaxFrozenShare * c.layers));
  // Progress at which each layer has converged: front to back, with jitter
  // that lets a layer converge a little before the one in front of it.
  std::vector<double> converged(c.layers, std::numeric_limits<double>::max());
  for (int i = 0; i < freezable; ++i) {
    converged[i] = kFreezeStart +
                   (kFreezeLastLayer - kFreezeStart) * (i + 1) / freezable +
                   kFreezeJitter * traits.Normal();
    converged[i] = std::max(converged[i], kFreezeStart);
  }
  const int check_every = std::max(1, c.iterations / kFreezeChecks);

  LoadSeries out = DenseSeries(c);
  for (int k = 0; k < c.iterations; ++k) {
    const int last_check = (k / check_every) * check_every;
    const double checked_at = Progress(last_check, c.iterations);
    std::vector<bool> frozen(c.layers);
    int prefix = 0;  // layers [0, prefix) are all frozen
    for (int i = 0; i < c.layers; ++i) {
      frozen[i] = checked_at >= converged[i];
      if (frozen[i] && prefix == i) prefix = i + 1;
    }
    for (int i = 0; i < c.layers; ++i) {
      LayerLoad& l = out[k][i];
      if (frozen[i]) {
        l.needs_wgrad = false;
        l.mem_bytes = c.layer_params * kFrozenBytesPerParam;
      }
      // Autograd computes an input gradient only when something earlier
      // wants it: not inside the frozen prefix, and not in the first
      // trainable layer right after it either.
      if (prefix > 0 && i <= prefix) l.needs_input_grad = false;
    }
  }
  return out;
}

LoadSeries SparseAttentionLoads(const ScenarioConfig& c) {
  ScenarioRandom traits(c.seed, kTraitStream);
  ScenarioRandom dynamics(c.seed, kDynamicsStream);
  // Early on, hash buckets collide almost at random and each layer keeps
  // about half its blocks; as queries and keys specialise, layers settle at
  // their own density, some sparse, some still dense-ish.
  // Deeper layers end sparser (their attention concentrates on fewer keys);
  // the per-layer jitter keeps the trend from being a clean ramp.
  std::vector<double> start(c.layers), end(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    start[i] = 0.45 + 0.1 * traits.Uniform();
    end[i] = std::clamp(
        0.6 - 0.45 * Position(i, c.layers) + 0.1 * (traits.Uniform() - 0.5),
        0.05, 1.0);
  }
  Ar1 batch(c.layers, kSparsityRho, dynamics);

  LoadSeries out = DenseSeries(c);
  for (int k = 0; k < c.iterations; ++k) {
    if (k > 0) batch.Step(dynamics);
    const double u = Progress(k, c.iterations);
    for (int i = 0; i < c.layers; ++i) {
      const double mean = start[i] + (end[i] - start[i]) * u;
      out[k][i].attention = std::clamp(
          mean * std::exp(kSparsityNoise * batch[i]), kMinAttentionShare, 1.0);
    }
  }
  return out;
}

LoadSeries EarlyExitLoads(const ScenarioConfig& c) {
  ScenarioRandom dynamics(c.seed, kDynamicsStream);
  const double final_kappa = std::log(1.0 / kFinalSurvivors);
  LoadSeries out = DenseSeries(c);
  for (int k = 0; k < c.iterations; ++k) {
    // The exit classifiers grow confident as the model trains; harder
    // batches keep more tokens in.
    const double kappa = final_kappa * Progress(k, c.iterations) *
                         std::exp(kExitBatchNoise * dynamics.Normal());
    for (int i = 0; i < c.layers; ++i) {
      const double x = InputDepth(i, c.layers);
      out[k][i].tokens = std::exp(-kappa * x * x);
    }
  }
  return out;
}

LoadSeries MoELoads(const ScenarioConfig& c) {
  ScenarioRandom traits(c.seed, kTraitStream);
  ScenarioRandom dynamics(c.seed, kDynamicsStream);
  // Routers differ in how well they balance. We let deeper ones balance
  // worse (their experts specialise more), which gives the skew a direction
  // a partitioner can use; the jitter keeps it from being a clean ramp.
  std::vector<double> layer_spread(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    layer_spread[i] = std::clamp(
        0.2 + 0.8 * Position(i, c.layers) + 0.15 * traits.Normal(), 0.1, 1.2);
  }
  RouterDrift router(c.layers, kExperts, kRouterRho, dynamics);
  // Attention as dense; the MLP is kExpertsPerRank experts' worth of weights.
  const int64_t moe_bytes =
      DenseBytes(c) / 3 + DenseBytes(c) * 2 / 3 * kExpertsPerRank;

  LoadSeries out = DenseSeries(c);
  for (int k = 0; k < c.iterations; ++k) {
    if (k > 0) router.Step(dynamics);
    const double u = Progress(k, c.iterations);
    for (int i = 1; i < c.layers; i += 2) {  // every other layer, GShard-style
      const double sigma =
          kMoEMaxLogitSpread * layer_spread[i] * (0.3 + 0.7 * u);
      // Expert parallelism spreads the top-2 experts' work so that a
      // perfectly balanced MoE MLP costs what the dense MLP does; the layer
      // then pays for its busiest expert.
      out[k][i].mlp = router.BusiestExpertFactor(i, sigma);
      out[k][i].mem_bytes = moe_bytes;
    }
  }
  return out;
}

LoadSeries MoDLoads(const ScenarioConfig& c) {
  ScenarioRandom traits(c.seed, kTraitStream);
  ScenarioRandom dynamics(c.seed, kDynamicsStream);
  // Each routed block's predictor is miscalibrated its own way: some admit
  // more tokens than their capacity, some fewer, throughout training.
  std::vector<double> bias(c.layers);
  for (double& b : bias) b = kPredictorBias * traits.Normal();
  Ar1 predictor(c.layers, kPredictorRho, dynamics);
  RouterDrift router(c.layers, kExperts, kRouterRho, dynamics);

  LoadSeries out = DenseSeries(c);
  for (int k = 0; k < c.iterations; ++k) {
    if (k > 0) {
      predictor.Step(dynamics);
      router.Step(dynamics);
    }
    const double u = Progress(k, c.iterations);
    const double warm = std::min(1.0, u / kModWarmup);
    const double capacity = 1.0 - (1.0 - kModCapacity) * warm;
    // The predictor only matters once blocks are routed at all.
    const double noise = kPredictorNoise * warm;
    for (int i = 0; i < c.layers; ++i) {
      LayerLoad& l = out[k][i];
      l.mlp = router.BusiestExpertFactor(i, kModLogitSpread);
      if (i % 2 == 1) {
        l.tokens = std::min(
            1.0, capacity * std::exp(warm * bias[i] + noise * predictor[i]));
      }
    }
  }
  return out;
}

}  // namespace dynmo::core::scenario_internal
