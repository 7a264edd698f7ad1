#include "trainer/stage/activation_meter.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>

namespace dynmo::trainer {

class ActivationMeter::Reporter : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size,
                         size_t /*total_allocated*/, size_t /*total_reserved*/,
                         c10::Device /*device*/) override {
    if (open_.load(std::memory_order_relaxed)) {
      net_.fetch_add(alloc_size, std::memory_order_relaxed);
    }
  }
  bool memoryProfilingEnabled() const override { return true; }

  void Open() {
    net_.store(0, std::memory_order_relaxed);
    open_.store(true, std::memory_order_relaxed);
  }
  int64_t Close() {
    open_.store(false, std::memory_order_relaxed);
    return net_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<bool> open_{false};
  std::atomic<int64_t> net_{0};
};

ActivationMeter::ActivationMeter() : reporter_(std::make_shared<Reporter>()) {}
ActivationMeter::~ActivationMeter() = default;

ActivationMeter::Scope::Scope(ActivationMeter& meter)
    : guard_(std::make_unique<c10::DebugInfoGuard>(
          c10::DebugInfoKind::PROFILER_STATE, meter.reporter_)) {}
ActivationMeter::Scope::~Scope() = default;

void ActivationMeter::Begin() { reporter_->Open(); }
int64_t ActivationMeter::End() { return reporter_->Close(); }

}  // namespace dynmo::trainer
