// LayerClock: times spans of work (one layer's forward or backward) on the
// device that runs them, and adds each span's seconds to a slot the caller
// names.
//
// On cpu a span is the steady clock (or a CPU-time clock) around the call
// (CPU kernels are synchronous). On cuda a span is a pair of CUDA events recorded on the
// device's current stream; nothing waits while the iteration runs, and
// Collect() waits once for the last event and reads every pair, so the
// per-layer clocks cost two event records per layer and one
// synchronisation per iteration. Events are pooled across iterations.
// Slots must stay valid until Collect(). Not thread-safe: one per rank's
// training thread.
#ifndef DYNMO_TRAINER_STAGE_LAYER_CLOCK_H_
#define DYNMO_TRAINER_STAGE_LAYER_CLOCK_H_

#include <c10/core/Event.h>
#include <torch/types.h>

#include <chrono>
#include <cstddef>
#include <vector>

namespace dynmo::trainer {

class LayerClock {
 public:
  // On cpu, `cpu_clock_id` names what is read: -1 for the steady clock,
  // else a clock_gettime clock (CLOCK_THREAD_CPUTIME_ID, ...).
  explicit LayerClock(torch::Device device, int cpu_clock_id = -1);

  struct Span {
    double cpu_start = 0;  // seconds on the cpu clock
    size_t start_event = 0;
  };
  // Marks the start of a span of work queued from now on.
  Span Start();
  // Ends `span`; its seconds are added to *slot now (cpu) or by Collect().
  void Stop(const Span& span, double* slot);
  // Adds every pending span's seconds to its slot (cuda: waits once for the
  // device to reach the last event) and forgets them.
  void Collect();

  bool on_device() const { return cuda_; }

 private:
  size_t Record();
  double CpuNow() const;

  torch::Device device_;
  bool cuda_;
  int cpu_clock_id_;
  std::vector<c10::Event> events_;  // pool; [0, used_) recorded this round
  size_t used_ = 0;
  struct Pending {
    size_t start, stop;
    double* slot;
  };
  std::vector<Pending> pending_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STAGE_LAYER_CLOCK_H_
