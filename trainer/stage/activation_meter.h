// ActivationMeter: the bytes a layer's forward leaves allocated — its output
// and everything autograd saved for its backward — measured, not estimated.
//
// It reads the allocators' own reports: c10's CPU allocator and the CUDA
// caching allocator report every allocation and free to the
// MemoryReportingInfoBase installed as the thread's PROFILER_STATE debug
// info (the autograd engine carries it to its device threads). A Scope
// installs the meter's reporter; Begin() / End() around one layer's forward
// return the net bytes allocated in between (what was freed inside the
// window is subtracted).
//
// Keep a Scope open from the gradients being zeroed to the last backward of
// the iteration, so that the frees of what it allocated are reported to the
// same reporter (c10's CPU allocator keeps a table of the blocks allocated
// while a reporter was installed until they are freed with one installed).
//
// Thread-safety: Begin/End and Scope on the rank's training thread; the
// reports may arrive from any thread (an atomic counter).
#ifndef DYNMO_TRAINER_STAGE_ACTIVATION_METER_H_
#define DYNMO_TRAINER_STAGE_ACTIVATION_METER_H_

#include <cstdint>
#include <memory>

namespace c10 {
class DebugInfoGuard;
}  // namespace c10

namespace dynmo::trainer {

class ActivationMeter {
 public:
  ActivationMeter();
  ~ActivationMeter();
  ActivationMeter(const ActivationMeter&) = delete;
  ActivationMeter& operator=(const ActivationMeter&) = delete;

  // Installs the meter's reporter on this thread for the Scope's lifetime.
  class Scope {
   public:
    explicit Scope(ActivationMeter& meter);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::unique_ptr<c10::DebugInfoGuard> guard_;
  };

  // Opens a window; End() returns the bytes allocated minus the bytes freed
  // since Begin() (0 outside a Scope).
  void Begin();
  int64_t End();

 private:
  class Reporter;
  std::shared_ptr<Reporter> reporter_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STAGE_ACTIVATION_METER_H_
