#include "trainer/stage/one_f_one_b.h"

#include <vector>

#include "core/stage_program.h"

namespace dynmo::trainer {

absl::Status RunOneFOneB(int stage, int num_stages, int microbatches,
                         StageOps& ops) {
  // The compute order is the simulator's 1F1B program; this walk adds the
  // communication around each pass.
  const core::StageProgram program =
      core::BuildStageProgram(core::Schedule::k1F1B, stage, num_stages, microbatches);
  const int warmup =
      core::WarmupCount(core::Schedule::k1F1B, stage, num_stages, microbatches);
  std::vector<bool> have_input(static_cast<size_t>(microbatches), false);
  std::vector<bool> have_grad(static_cast<size_t>(microbatches), false);
  for (size_t i = 0; i < program.size(); ++i) {
    const core::PlannedOp& op = program[i];
    const core::PlannedOp* next = i + 1 < program.size() ? &program[i + 1] : nullptr;
    const int mb = op.microbatch;
    absl::Status s;
    if (op.kind == core::OpKind::kForward) {
      if (!have_input[mb] && !(s = ops.RecvForward(mb)).ok()) return s;
      if (!(s = ops.Forward(mb)).ok()) return s;
      // A steady-phase forward is followed by a backward: send the output
      // while receiving that backward's gradient.
      if (mb >= warmup && next != nullptr && next->kind == core::OpKind::kBackward) {
        s = ops.SendForwardRecvBackward(mb, next->microbatch);
        have_grad[next->microbatch] = true;
      } else {
        s = ops.SendForward(mb);
      }
    } else {
      if (!have_grad[mb] && !(s = ops.RecvBackward(mb)).ok()) return s;
      if (!(s = ops.Backward(mb)).ok()) return s;
      // A steady-phase backward followed by a forward: send the gradient
      // while receiving that forward's input.
      if (next != nullptr && next->kind == core::OpKind::kForward) {
        s = ops.SendBackwardRecvForward(mb, next->microbatch);
        have_input[next->microbatch] = true;
      } else {
        s = ops.SendBackward(mb);
      }
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
