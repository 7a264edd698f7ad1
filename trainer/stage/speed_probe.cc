#include "trainer/stage/speed_probe.h"

#include <torch/torch.h>

namespace dynmo::trainer {
namespace {

constexpr int64_t kSize = 128;
constexpr int kProducts = 8;

}  // namespace

SpeedProbe::SpeedProbe(torch::Device device, int cpu_clock_id)
    : clock_(device, cpu_clock_id) {
  // Seeded apart from the training generators: the probe changes no
  // random stream the model uses.
  torch::Generator gen = at::detail::createCPUGenerator(/*seed_in=*/1234);
  a_ = torch::randn({kSize, kSize}, gen, torch::kFloat).div_(16).to(device);
  b_ = torch::empty_like(a_);
  // One untimed run: first-call allocations and kernel selection.
  torch::mm_out(b_, a_, a_);
}

double SpeedProbe::Run() {
  torch::NoGradGuard no_grad;
  double seconds = 0;
  const LayerClock::Span span = clock_.Start();
  torch::Tensor x = a_;
  for (int i = 0; i < kProducts; ++i) {
    torch::mm_out(b_, x, a_);
    x = b_.clone();
  }
  clock_.Stop(span, &seconds);
  clock_.Collect();
  return seconds;
}

}  // namespace dynmo::trainer
