// The 1F1B executor: runs one training iteration of one pipeline stage
// (PipeDream-Flush / Megatron-Core's forward_backward_pipelining_without_
// interleaving) by walking the very program the simulator times
// (core/stage_program.h): stage s runs min(p-1-s, m) warm-up
// forwards, then one forward and one backward at a time, then the
// backwards still outstanding.
//
// The executor only orders the work and its communication; StageOps does
// it. Each pass receives what it needs first, unless the previous paired
// exchange brought it. Paired
// communications (send an activation while receiving a gradient and the
// reverse) are single calls so a transport can post both before waiting on
// either, which is what keeps neighbouring stages from deadlocking in the
// steady phase. On the first stage the receive-forward and send-backward
// halves are no-ops, on the last stage the send-forward and receive-backward
// halves; StageOps implementations own that rule.
//
// No LibTorch here: the schedule is testable with a recording StageOps.
// Not thread-safe; one executor call per iteration per rank.
#ifndef DYNMO_TRAINER_STAGE_ONE_F_ONE_B_H_
#define DYNMO_TRAINER_STAGE_ONE_F_ONE_B_H_

#include "absl/status/status.h"

namespace dynmo::trainer {

// The work of one stage, per micro-batch index. Any error aborts the
// iteration and is returned by RunOneFOneB unchanged.
class StageOps {
 public:
  virtual ~StageOps() = default;
  virtual absl::Status RecvForward(int mb) = 0;
  virtual absl::Status Forward(int mb) = 0;
  virtual absl::Status SendForward(int mb) = 0;
  // Sends micro-batch `send_mb`'s output downstream while receiving
  // micro-batch `recv_mb`'s output gradient from downstream.
  virtual absl::Status SendForwardRecvBackward(int send_mb, int recv_mb) = 0;
  virtual absl::Status Backward(int mb) = 0;
  virtual absl::Status SendBackward(int mb) = 0;
  // Sends micro-batch `send_mb`'s input gradient upstream while receiving
  // micro-batch `recv_mb`'s input from upstream.
  virtual absl::Status SendBackwardRecvForward(int send_mb, int recv_mb) = 0;
  virtual absl::Status RecvBackward(int mb) = 0;
};

// Runs one iteration of 1F1B on `stage`. Preconditions: 0 <= stage <
// num_stages, microbatches >= 1.
absl::Status RunOneFOneB(int stage, int num_stages, int microbatches,
                         StageOps& ops);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STAGE_ONE_F_ONE_B_H_
