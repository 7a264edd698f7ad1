#include "core/stage_program.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dynmo::core {
namespace {

// Writes one stage's program. When the schedule splits the weight gradient
// from the backward pass, every backward makes its W pending, and the builder
// emits the oldest pending W right after a backward once more than
// `wgrad_delay` backwards have run; whatever is still pending is drained at
// the end. With the delay at zero W follows its own B immediately; a larger
// delay moves W passes later, into the bubbles of the cool-down.
class StageProgramBuilder {
 public:
  StageProgramBuilder(bool split_wgrad, int wgrad_delay)
      : split_wgrad_(split_wgrad), wgrad_delay_(wgrad_delay) {}

  void Forward(int microbatch) {
    program_.push_back({OpKind::kForward, microbatch});
  }

  void Backward(int microbatch) {
    program_.push_back({OpKind::kBackward, microbatch});
    if (!split_wgrad_) return;
    pending_wgrads_.push_back(microbatch);
    if (++backwards_ > wgrad_delay_) EmitOldestWeightGrad();
  }

  StageProgram Finish() && {
    while (next_wgrad_ < pending_wgrads_.size()) EmitOldestWeightGrad();
    return std::move(program_);
  }

 private:
  void EmitOldestWeightGrad() {
    program_.push_back({OpKind::kWeightGrad, pending_wgrads_[next_wgrad_++]});
  }

  const bool split_wgrad_;
  const int wgrad_delay_;
  int backwards_ = 0;
  std::vector<int> pending_wgrads_;
  size_t next_wgrad_ = 0;
  StageProgram program_;
};

// The three phases of a one-forward-one-backward program, named as in the
// 1F1B figure and the trainer's executor.
void WarmupForwards(int count, StageProgramBuilder* b) {
  for (int mb = 0; mb < count; ++mb) b->Forward(mb);
}

// After `warmup` forwards, each step runs the next forward and then the
// oldest outstanding backward, keeping warmup + 1 micro-batches in flight.
void SteadyOneForwardOneBackward(int warmup, int microbatches,
                                 StageProgramBuilder* b) {
  for (int mb = 0; mb + warmup < microbatches; ++mb) {
    b->Forward(mb + warmup);
    b->Backward(mb);
  }
}

void CooldownBackwards(int warmup, int microbatches, StageProgramBuilder* b) {
  for (int mb = std::max(microbatches - warmup, 0); mb < microbatches; ++mb) {
    b->Backward(mb);
  }
}

// Every schedule is a 1F1B program with a different warm-up depth and W
// placement:
//   GPipe: the warm-up holds every micro-batch (all F, then all B), W fused.
//   1F1B:  stage s warms up with p-1-s forwards, W fused into B.
//   ZB-H1: 1F1B's order with W split out and delayed by s backwards on stage
//          s. Stage s then holds at most (p-1-s) + 1 + s = p micro-batches'
//          activations, the peak of 1F1B's first stage, and its last s+1 W
//          passes fill the cool-down bubble while the final gradients travel
//          back to stage 0.
}  // namespace

StageProgram BuildStageProgram(Schedule schedule, int stage, int num_stages,
                               int microbatches) {
  const bool split_wgrad = schedule == Schedule::kZBH1;
  const int wgrad_delay = split_wgrad ? stage : 0;
  const int warmup = WarmupCount(schedule, stage, num_stages, microbatches);
  StageProgramBuilder builder(split_wgrad, wgrad_delay);
  WarmupForwards(warmup, &builder);
  SteadyOneForwardOneBackward(warmup, microbatches, &builder);
  CooldownBackwards(warmup, microbatches, &builder);
  return std::move(builder).Finish();
}

int WarmupCount(Schedule schedule, int stage, int num_stages, int microbatches) {
  return schedule == Schedule::kGPipe ? microbatches
                                      : std::min(num_stages - 1 - stage, microbatches);
}

absl::StatusOr<Schedule> ParseSchedule(absl::string_view name) {
  for (Schedule s : {Schedule::kGPipe, Schedule::k1F1B, Schedule::kZBH1}) {
    if (name == ScheduleName(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown schedule \"", name, "\"; expected gpipe, 1f1b or zb-h1"));
}

std::string ScheduleName(Schedule schedule) {
  switch (schedule) {
    case Schedule::kGPipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kZBH1:
      return "zb-h1";
  }
  return "unknown";
}

}  // namespace dynmo::core
