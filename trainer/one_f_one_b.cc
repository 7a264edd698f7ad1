#include "trainer/one_f_one_b.h"

#include <algorithm>

namespace dynmo::trainer {
namespace {

#define DYNMO_RETURN_IF_ERROR(expr)            \
  do {                                         \
    if (absl::Status s_ = (expr); !s_.ok()) {  \
      return s_;                               \
    }                                          \
  } while (0)

absl::Status WarmupForwards(int warmup, StageOps& ops) {
  for (int mb = 0; mb < warmup; ++mb) {
    DYNMO_RETURN_IF_ERROR(ops.RecvForward(mb));
    DYNMO_RETURN_IF_ERROR(ops.Forward(mb));
    DYNMO_RETURN_IF_ERROR(ops.SendForward(mb));
  }
  return absl::OkStatus();
}

// Micro-batch `warmup + i` goes forward, then micro-batch i goes backward,
// keeping warmup + 1 micro-batches in flight. The input of the next forward
// arrives together with the gradient this step sends upstream.
absl::Status SteadyOneForwardOneBackward(int warmup, int microbatches,
                                         StageOps& ops) {
  const int steady = microbatches - warmup;
  if (steady <= 0) return absl::OkStatus();
  DYNMO_RETURN_IF_ERROR(ops.RecvForward(warmup));
  for (int i = 0; i < steady; ++i) {
    const int forward_mb = warmup + i;
    DYNMO_RETURN_IF_ERROR(ops.Forward(forward_mb));
    DYNMO_RETURN_IF_ERROR(ops.SendForwardRecvBackward(forward_mb, i));
    DYNMO_RETURN_IF_ERROR(ops.Backward(i));
    if (i == steady - 1) {
      DYNMO_RETURN_IF_ERROR(ops.SendBackward(i));
    } else {
      DYNMO_RETURN_IF_ERROR(ops.SendBackwardRecvForward(i, forward_mb + 1));
    }
  }
  return absl::OkStatus();
}

absl::Status CooldownBackwards(int warmup, int microbatches, StageOps& ops) {
  for (int mb = std::max(microbatches - warmup, 0); mb < microbatches; ++mb) {
    DYNMO_RETURN_IF_ERROR(ops.RecvBackward(mb));
    DYNMO_RETURN_IF_ERROR(ops.Backward(mb));
    DYNMO_RETURN_IF_ERROR(ops.SendBackward(mb));
  }
  return absl::OkStatus();
}

}  // namespace

int WarmupCount(int stage, int num_stages, int microbatches) {
  return std::min(num_stages - 1 - stage, microbatches);
}

absl::Status RunOneFOneB(int stage, int num_stages, int microbatches,
                         StageOps& ops) {
  const int warmup = WarmupCount(stage, num_stages, microbatches);
  DYNMO_RETURN_IF_ERROR(WarmupForwards(warmup, ops));
  DYNMO_RETURN_IF_ERROR(SteadyOneForwardOneBackward(warmup, microbatches, ops));
  return CooldownBackwards(warmup, microbatches, ops);
}

}  // namespace dynmo::trainer
