#include "trainer/stage/speed_probe.h"

#include <torch/torch.h>

#include <cmath>

namespace dynmo::trainer {
namespace {

// On cpu the probe must outlast the scheduler's time slice (a few ms):
// a shorter one runs within its slice on a core shared with another
// process and never sees the share it gets. On cuda, large enough products
// that the time is compute, not launch latency.
constexpr int64_t kCpuSize = 128;
constexpr int kCpuProducts = 192;  // ~8 ms on one core (2 GHz class)
constexpr int64_t kCudaSize = 1024;
constexpr int kCudaProducts = 16;  // ~1-3 ms

}  // namespace

SpeedProbe::SpeedProbe(torch::Device device, int cpu_clock_id)
    : clock_(device, cpu_clock_id),
      products_(device.is_cuda() ? kCudaProducts : kCpuProducts) {
  const int64_t size = device.is_cuda() ? kCudaSize : kCpuSize;
  // Seeded apart from the training generators: the probe changes no
  // random stream the model uses. Scaled so the chain neither grows nor
  // vanishes (an orthogonal-ish matrix).
  torch::Generator gen = at::detail::createCPUGenerator(/*seed_in=*/1234);
  a_ = torch::randn({size, size}, gen, torch::kFloat)
           .div_(std::sqrt(static_cast<double>(size)))
           .to(device);
  b_ = torch::empty_like(a_);
  // One untimed run: first-call allocations and kernel selection.
  torch::mm_out(b_, a_, a_);
}

double SpeedProbe::Run() {
  torch::NoGradGuard no_grad;
  double seconds = 0;
  const LayerClock::Span span = clock_.Start();
  torch::Tensor x = a_;
  for (int i = 0; i < products_; ++i) {
    torch::mm_out(b_, x, a_);
    x = b_.clone();
  }
  clock_.Stop(span, &seconds);
  clock_.Collect();
  return seconds;
}

}  // namespace dynmo::trainer
