// dynmo-bench-pruning: does a pruned layer really run faster in the
// trainer? Times, on this CPU with one intra-op thread (the trainer's
// default), forward and forward + backward of
//   1. one PrunableLinear of each decoder-block shape (H->3H, H->H, H->4H,
//      4H->H; n = micro_batch x seq_len rows) dense, and pruned by magnitude
//      to 50..97% in the CSR form (the break-even that sets
//      --prune_csr_min_sparsity);
//   2. a whole decoder block, dense and pruned to 90% by the same rule the
//      trainer uses (magnitude threshold over the block's four matrices,
//      CSR from --csr_min_sparsity).
// Median of --reps runs after a warm-up. Flags: --hidden, --rows, --reps,
// --csr_min_sparsity. Output: plain text tables (trainer/README.md quotes
// them).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "trainer/dynamism/pruning.h"
#include "trainer/model/prunable_linear.h"
#include "trainer/state/layer_state.h"

ABSL_FLAG(int, hidden, 64, "model hidden size H");
ABSL_FLAG(int, seq_len, 32, "tokens per sample");
ABSL_FLAG(int, micro_batch, 4, "samples per micro-batch");
ABSL_FLAG(int, reps, 41, "timed repetitions (median reported)");
ABSL_FLAG(double, csr_min_sparsity, 0.8, "CSR from this per-matrix sparsity");

namespace dynmo::trainer {
namespace {

double MedianUs(const std::function<void()>& fn, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                           start)
                     .count());
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

float KeepThreshold(const torch::Tensor& magnitudes, double sparsity) {
  const int64_t keep = std::max<int64_t>(
      1, std::llround(static_cast<double>(magnitudes.numel()) * (1.0 - sparsity)));
  // host-sync(event): dynmo-train --pruning_bench, a benchmark outside training
  return std::get<0>(torch::topk(magnitudes, keep)).min().item<float>();
}

struct Timing {
  double forward_us, step_us;  // forward; forward + backward
};

Timing TimeModule(const std::function<torch::Tensor(const torch::Tensor&)>& f,
                  const torch::Tensor& x, int reps) {
  Timing t;
  t.forward_us = MedianUs(
      [&] {
        torch::NoGradGuard no_grad;
        f(x);
      },
      reps);
  const torch::Tensor xg = x.detach().requires_grad_(true);
  t.step_us = MedianUs([&] { f(xg).sum().backward(); }, reps);
  return t;
}

void LinearTable(int64_t h, int64_t rows, int reps) {
  std::printf("PrunableLinear, n = %lld rows, one thread: microseconds (speedup vs dense)\n",
              static_cast<long long>(rows));
  std::printf("%-9s %-8s %22s %22s\n", "shape", "sparsity", "forward", "forward+backward");
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {h, 3 * h}, {h, h}, {h, 4 * h}, {4 * h, h}};
  for (auto [in, out] : shapes) {
    torch::manual_seed(1);
    const torch::Tensor x = torch::randn({rows, in});
    PrunableLinear dense(in, out, true);
    const Timing d = TimeModule([&](const torch::Tensor& v) { return dense(v); }, x, reps);
    const std::string shape = std::to_string(in) + "x" + std::to_string(out);
    std::printf("%-9s %-8s %14.1f         %14.1f\n", shape.c_str(), "dense", d.forward_us,
                d.step_us);
    for (double s : {0.5, 0.7, 0.8, 0.9, 0.95, 0.97}) {
      torch::manual_seed(1);
      PrunableLinear p(in, out, true);
      torch::optim::AdamW opt(p->parameters());
      if (!p->PruneBelow(KeepThreshold(p->StoredMagnitudes(), s), 0.0, opt).ok()) return;
      const Timing c = TimeModule([&](const torch::Tensor& v) { return p(v); }, x, reps);
      std::printf("%-9s csr %-4.2f %14.1f (%4.2fx) %14.1f (%4.2fx)\n", shape.c_str(), s,
                  c.forward_us, d.forward_us / c.forward_us, c.step_us,
                  d.step_us / c.step_us);
    }
  }
}

void BlockTable(int64_t h, int64_t seq_len, int64_t micro_batch, int reps, double csr_min) {
  TrainerConfig config;
  config.model.num_blocks = 1;
  config.model.hidden = static_cast<int>(h);
  config.model.heads = 4;
  config.model.seq_len = static_cast<int>(seq_len);
  config.model.dynamism = *ParseDynamism("pruning");
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({micro_batch, seq_len, h});
  std::printf("\nDecoder block, H = %lld, [%lld, %lld, H] input: microseconds\n",
              static_cast<long long>(h), static_cast<long long>(micro_batch),
              static_cast<long long>(seq_len));
  std::printf("%-28s %12s %12s %12s\n", "block", "forward", "backward", "fwd+bwd");
  double dense_total = 0;
  for (double s : {0.0, 0.5, 0.8, 0.9, 0.95}) {
    OwnedLayer owned = MakeOwnedLayer(config, 1);
    std::vector<PrunableLinear> linears = PrunableLinears(*owned.layer);
    std::string forms;
    if (s > 0) {
      std::vector<torch::Tensor> m;
      for (PrunableLinear& p : linears) m.push_back(p->StoredMagnitudes());
      const float t = KeepThreshold(torch::cat(m), s);
      for (PrunableLinear& p : linears) {
        if (!p->PruneBelow(t, csr_min, *owned.optimizer).ok()) return;
      }
    }
    for (PrunableLinear& p : linears) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%s%.2f ",
                    PrunableLinearImpl::IsCsr(p->form()) ? "c" : "d", p->sparsity());
      forms += buf;
    }
    MicroBatchContext ctx;
    const Timing t = TimeModule(
        [&](const torch::Tensor& v) { return owned.layer->Forward(v, ctx); }, x, reps);
    if (s == 0) dense_total = t.step_us;
    std::printf("%-4.2f %-23s %12.1f %12.1f %12.1f (%4.2fx)\n", s, forms.c_str(), t.forward_us,
                t.step_us - t.forward_us, t.step_us, dense_total / t.step_us);
  }
  std::printf("(forms: d = dense/masked, c = CSR, with each matrix's sparsity:"
              " qkv attention_out mlp_in mlp_out)\n");
}

}  // namespace
}  // namespace dynmo::trainer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  at::set_num_threads(1);
  const int64_t h = absl::GetFlag(FLAGS_hidden);
  const int64_t rows = int64_t{absl::GetFlag(FLAGS_micro_batch)} * absl::GetFlag(FLAGS_seq_len);
  dynmo::trainer::LinearTable(h, rows, absl::GetFlag(FLAGS_reps));
  dynmo::trainer::BlockTable(h, absl::GetFlag(FLAGS_seq_len), absl::GetFlag(FLAGS_micro_batch),
                             absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_csr_min_sparsity));
  return 0;
}
