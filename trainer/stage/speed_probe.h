// SpeedProbe: a fixed piece of work every rank times the same way as its
// layers (LayerClock: the steady clock or a CPU-time clock on cpu, CUDA
// events on a GPU), so the coordinator can tell a slow rank from a heavy
// layer (core/rank_speed.h). The work is a chain of matrix
// products of one seeded matrix on the rank's device — the kind of kernel
// the layers run: 192 products of 128 x 128 on cpu (~8 ms: longer than the
// scheduler's time slice, or a core shared with another process would go
// unseen), 16 of 1024 x 1024 on cuda (~1-3 ms of compute, not launch
// latency) — run every few iterations (--speed_probe_every). A throttled GPU or a CPU core shared with another process
// takes longer for it, and so for every layer the rank holds; the CPU-time
// clock (--layer_clock=cpu) sees neither, by design.
//
// Not thread-safe: one per rank's training thread.
#ifndef DYNMO_TRAINER_STAGE_SPEED_PROBE_H_
#define DYNMO_TRAINER_STAGE_SPEED_PROBE_H_

#include <torch/types.h>

#include "trainer/stage/layer_clock.h"

namespace dynmo::trainer {

class SpeedProbe {
 public:
  // `cpu_clock_id` as LayerClock's.
  SpeedProbe(torch::Device device, int cpu_clock_id);

  // Runs the probe once and returns its seconds (cuda: waits for it).
  double Run();

 private:
  LayerClock clock_;
  int products_;
  torch::Tensor a_;
  torch::Tensor b_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STAGE_SPEED_PROBE_H_
