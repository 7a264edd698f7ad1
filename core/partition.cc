// Partition(): the dispatcher, plus the two simple methods (uniform and the
// single-weight balancers). The exact solver lives in partition_optimal.cc,
// diffusion in partition_diffusion.cc.
#include "core/partition.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dynmo::core {
namespace {

absl::StatusOr<Boundaries> BalanceWeights(const PipelineModel& model,
                                          bool by_params) {
  std::vector<double> w(model.layers.size());
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = by_params ? static_cast<double>(model.layers[i].params)
                     : model.layers[i].time_s();
  }
  return PartitionMinBottleneck(w, static_cast<int>(model.stages.size()));
}

}  // namespace

absl::StatusOr<PartitionMethod> ParsePartitionMethod(absl::string_view name) {
  if (name == "uniform") return PartitionMethod::kUniform;
  if (name == "parameters") return PartitionMethod::kParameters;
  if (name == "time") return PartitionMethod::kTime;
  if (name == "optimal") return PartitionMethod::kOptimal;
  if (name == "diffusion") return PartitionMethod::kDiffusion;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown partition method '", name,
      "' (want uniform, parameters, time, optimal or diffusion)"));
}

std::string PartitionMethodName(PartitionMethod method) {
  switch (method) {
    case PartitionMethod::kUniform: return "uniform";
    case PartitionMethod::kParameters: return "parameters";
    case PartitionMethod::kTime: return "time";
    case PartitionMethod::kOptimal: return "optimal";
    case PartitionMethod::kDiffusion: return "diffusion";
  }
  return "unknown";
}

Boundaries PartitionUniform(int num_layers, int num_stages) {
  Boundaries b(num_stages + 1);
  const int base = num_layers / num_stages, extra = num_layers % num_stages;
  for (int s = 0; s <= num_stages; ++s) {
    b[s] = s * base + (s < extra ? s : extra);
  }
  return b;
}

absl::StatusOr<PartitionResult> Partition(const PipelineModel& model,
                                          const PartitionOptions& options) {
  if (absl::Status st = ValidateModel(model); !st.ok()) return st;
  const int n = static_cast<int>(model.layers.size());
  const int k = static_cast<int>(model.stages.size());
  if (k > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "more stages (", k, ") than layers (", n,
        "): every stage needs at least one layer"));
  }
  if (!(std::isfinite(options.near_tie) && options.near_tie >= 0)) {
    return absl::InvalidArgumentError("near_tie must be finite and >= 0");
  }
  if (options.current) {
    if (absl::Status st = ValidateBoundaries(*options.current, n, k);
        !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("current partition: ", st.message()));
    }
  }
  PartitionResult result;
  absl::StatusOr<Boundaries> b;
  switch (options.method) {
    case PartitionMethod::kUniform:
      b = PartitionUniform(n, k);
      break;
    case PartitionMethod::kParameters:
      b = BalanceWeights(model, /*by_params=*/true);
      break;
    case PartitionMethod::kTime:
      b = BalanceWeights(model, /*by_params=*/false);
      break;
    case PartitionMethod::kOptimal:
      b = PartitionOptimal(model, options.current ? &*options.current : nullptr,
                           options.near_tie);
      break;
    case PartitionMethod::kDiffusion:
      return PartitionDiffusion(
          model, options.current ? *options.current : PartitionUniform(n, k),
          options.diffusion_max_rounds);
  }
  if (!b.ok()) return b.status();
  result.boundaries = *std::move(b);
  return result;
}

}  // namespace dynmo::core
