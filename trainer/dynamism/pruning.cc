#include "trainer/dynamism/pruning.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "trainer/dynamism/global_magnitude_threshold.h"

namespace dynmo::trainer {

std::vector<PrunableLinear> PrunableLinears(PipelineLayer& layer) {
  std::vector<PrunableLinear> out;
  for (const std::shared_ptr<torch::nn::Module>& m : layer.modules(/*include_self=*/false)) {
    auto p = std::dynamic_pointer_cast<PrunableLinearImpl>(m);
    if (p != nullptr && p->prunable()) out.emplace_back(p);
  }
  return out;
}

absl::StatusOr<GlobalPruneResult> PruneGlobally(StageView& stage, double sparsity,
                                                const PruningConfig& config) {
  GlobalPruneResult r;
  r.target_sparsity = sparsity;
  const bool contributes = stage.dp_rank == 0;
  std::vector<torch::Tensor> magnitudes;
  torch::Tensor counts = torch::zeros({2}, torch::kLong);  // [prunable, stored]
  for (OwnedLayer& owned : stage.layers) {
    for (PrunableLinear& p : PrunableLinears(*owned.layer)) {
      if (!contributes) continue;
      counts[0] += p->dense_size();
      torch::Tensor m = p->StoredMagnitudes();
      counts[1] += m.numel();
      magnitudes.push_back(m);
    }
  }
  // host-sync(event): a pruning step: the world-wide parameter counts
  if (absl::Status s = stage.transport.AllReduceSumWorld(counts); !s.ok()) return s;
  r.prunable = counts[0].item<int64_t>();
  const int64_t stored = counts[1].item<int64_t>();
  r.keep = std::llround(static_cast<double>(r.prunable) * (1.0 - sparsity));
  if (r.keep >= stored) return r;  // already as sparse as the schedule asks
  // host-sync(event): a pruning step: the stored magnitudes, to the CPU for the threshold's
  //   radix select
  const torch::Tensor local = magnitudes.empty() ? torch::empty({0}, torch::kFloat)
                                                 : torch::cat(magnitudes).to(torch::kCPU);
  absl::StatusOr<GlobalThresholdResult> t =
      GlobalKeepThreshold(stage.transport, local, r.keep);
  if (!t.ok()) return t.status();
  r.threshold = t->threshold;
  r.changed = true;
  PrunableLinearImpl::FormPolicy policy;
  policy.csr_min_sparsity = config.csr_min_sparsity;
  policy.timed = config.form == "timed";
  policy.probe_rows = int64_t{stage.config.micro_batch} * stage.config.model.seq_len;
  // Replicas hold the same weights, so they reach the same matrices; the
  // summed timings make them decide alike.
  policy.agree = [&stage](PrunableLinearImpl::FormTimings* t) {
    // Replicas run on the same kind of device, so a form untimed on one
    // (negative) is untimed on all and its sum stays negative.
    torch::Tensor v = torch::tensor({t->masked, t->csr, t->torch_csr}, torch::kDouble);
    if (absl::Status s = stage.transport.AllReduceSumDataParallel(v); !s.ok()) return s;
    // host-sync(cpu): a double tensor built on the CPU and all-reduced there (the form timings)
    t->masked = v[0].item<double>();
    t->csr = v[1].item<double>();
    t->torch_csr = v[2].item<double>();
    return absl::OkStatus();
  };
  for (OwnedLayer& owned : stage.layers) {
    for (PrunableLinear& p : PrunableLinears(*owned.layer)) {
      absl::StatusOr<PrunableLinearImpl::PruneOutcome> n =
          p->Prune(r.threshold, policy, *owned.optimizer);
      if (!n.ok()) return n.status();
      r.pruned_here += n->removed;
      if (n->timed()) {
        const PrunableLinearImpl::Form f = p->form();
        (f == PrunableLinearImpl::Form::kCsr        ? r.timed_csr
         : f == PrunableLinearImpl::Form::kTorchCsr ? r.timed_torch_csr
                                                    : r.timed_masked) += 1;
        r.timed_masked_s += n->timings.masked;
        r.timed_csr_s += std::max(n->timings.csr, 0.0);
        r.timed_torch_csr_s += std::max(n->timings.torch_csr, 0.0);
      }
    }
  }
  return r;
}

absl::Status GradualPruning::BeforeIteration(int64_t iter, StageView& stage) {
  const int64_t t = iter - 1;  // the schedule point whose step just finished
  if (!IsPruningStep(config_, t)) return absl::OkStatus();
  absl::StatusOr<GlobalPruneResult> r =
      PruneGlobally(stage, TargetSparsity(config_, t), config_);
  if (!r.ok()) return r.status();
  changed_ = changed_ || r->changed;
  if (r->changed && stage.dp_rank == 0) {
    // One line per stage: what its blocks look like now.
    std::ostringstream layers;
    for (OwnedLayer& owned : stage.layers) {
      std::vector<PrunableLinear> linears = PrunableLinears(*owned.layer);
      if (linears.empty()) continue;
      int64_t nnz = 0, dense = 0, csr = 0;
      for (PrunableLinear& p : linears) {
        nnz += p->nnz();
        dense += p->dense_size();
        csr += PrunableLinearImpl::IsCsr(p->form()) ? 1 : 0;
      }
      layers << absl::StrFormat(" %d:%.2f%s", owned.layer->id(),
                                1.0 - static_cast<double>(nnz) / static_cast<double>(dense),
                                csr == static_cast<int64_t>(linears.size()) ? "c"
                                : csr > 0                                  ? "p"
                                                                           : "");
    }
    std::cout << absl::StrFormat(
                     "dynmo-train: iteration %d: pruned stage %d to global sparsity "
                     "%.3f (threshold %.4g, keep %d of %d); block sparsity:%s",
                     t, stage.stage, r->target_sparsity, r->threshold, r->keep,
                     r->prunable, layers.str())
              << std::endl;
    if (r->timed_csr + r->timed_torch_csr + r->timed_masked > 0) {
      // The form choice and what it was based on (summed over dp replicas).
      std::cout << absl::StrFormat(
                       "dynmo-train: iteration %d: stage %d forms timed on %s: %d masked "
                       "dense, %d CSR (ours), %d CSR (LibTorch sparse); fwd+bwd summed: "
                       "masked %.3f ms, ours %.3f ms, LibTorch %.3f ms",
                       t, stage.stage, stage.config.device, r->timed_masked, r->timed_csr,
                       r->timed_torch_csr, 1e3 * r->timed_masked_s, 1e3 * r->timed_csr_s,
                       1e3 * r->timed_torch_csr_s)
                << std::endl;
    }
  }
  return absl::OkStatus();
}

bool GradualPruning::TakeModelChanged() {
  const bool changed = changed_;
  changed_ = false;
  return changed;
}

}  // namespace dynmo::trainer
