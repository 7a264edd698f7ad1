#include "coordinator/core/pipeline_sim.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dynmo::core {
namespace {

// One op in a stage's program, before it has been timed.
struct PlannedOp {
  OpKind kind;
  int microbatch;
};

using StageProgram = std::vector<PlannedOp>;

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
StageProgram BuildStageProgram(Schedule schedule, int stage, int num_stages,
                               int microbatches) {
  const bool split_wgrad = schedule == Schedule::kZBH1;
  const int wgrad_delay = split_wgrad ? stage : 0;
  const int warmup = schedule == Schedule::kGPipe
                         ? microbatches
                         : std::min(num_stages - 1 - stage, microbatches);
  StageProgramBuilder builder(split_wgrad, wgrad_delay);
  WarmupForwards(warmup, &builder);
  SteadyOneForwardOneBackward(warmup, microbatches, &builder);
  CooldownBackwards(warmup, microbatches, &builder);
  return std::move(builder).Finish();
}

bool BadTime(double t) { return !std::isfinite(t) || t < 0; }

absl::Status ValidateConfig(const SimConfig& config) {
  if (config.stages.empty()) {
    return absl::InvalidArgumentError("the pipeline has no stages");
  }
  if (config.microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("microbatches is ", config.microbatches,
                     "; an iteration needs at least 1"));
  }
  for (size_t s = 0; s < config.stages.size(); ++s) {
    const StagePassTimes& t = config.stages[s];
    if (BadTime(t.fwd_s) || BadTime(t.bwd_s) || BadTime(t.wgrad_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", s, " has pass times fwd=", t.fwd_s, " bwd=", t.bwd_s,
          " wgrad=", t.wgrad_s, "; each must be finite and >= 0 seconds"));
    }
  }
  if (BadTime(config.transfer_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer_s is ", config.transfer_s,
                     "; it must be finite and >= 0 seconds"));
  }
  return absl::OkStatus();
}

double OpDuration(const StagePassTimes& t, OpKind kind, bool split_wgrad) {
  switch (kind) {
    case OpKind::kForward:
      return t.fwd_s;
    case OpKind::kBackward:
      return split_wgrad ? t.bwd_s : t.bwd_s + t.wgrad_s;
    case OpKind::kWeightGrad:
      return t.wgrad_s;
  }
  return 0;
}

// End times of every (pass, stage, micro-batch); negative until computed.
class EndTimes {
 public:
  EndTimes(int num_stages, int microbatches)
      : microbatches_(microbatches) {
    for (auto& v : end_s_) v.assign(num_stages * microbatches, -1.0);
  }
  double Get(OpKind kind, int stage, int mb) const {
    return end_s_[static_cast<int>(kind)][stage * microbatches_ + mb];
  }
  void Set(OpKind kind, int stage, int mb, double t) {
    end_s_[static_cast<int>(kind)][stage * microbatches_ + mb] = t;
  }

 private:
  int microbatches_;
  std::array<std::vector<double>, 3> end_s_;
};

// Returns when the inputs of `op` on `stage` are available, or a negative
// value while its dependency has not been timed yet. A hop between stages
// costs transfer_s; W and the last stage's B depend on the same stage.
double ReadyTime(const PlannedOp& op, int stage, int num_stages,
                 double transfer_s, const EndTimes& end) {
  auto arrived = [&](OpKind kind, int from_stage, double hop) {
    const double t = end.Get(kind, from_stage, op.microbatch);
    return t < 0 ? -1.0 : t + hop;
  };
  switch (op.kind) {
    case OpKind::kForward:
      return stage == 0 ? 0.0
                        : arrived(OpKind::kForward, stage - 1, transfer_s);
    case OpKind::kBackward:
      return stage == num_stages - 1
                 ? arrived(OpKind::kForward, stage, 0)
                 : arrived(OpKind::kBackward, stage + 1, transfer_s);
    case OpKind::kWeightGrad:
      return arrived(OpKind::kBackward, stage, 0);
  }
  return -1;
}

}  // namespace

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

absl::StatusOr<SimResult> SimulatePipeline(const SimConfig& config) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;
  const int p = static_cast<int>(config.stages.size());
  const int m = config.microbatches;
  const bool split_wgrad = config.schedule == Schedule::kZBH1;

  std::vector<StageProgram> programs;
  size_t total_ops = 0;
  for (int s = 0; s < p; ++s) {
    programs.push_back(BuildStageProgram(config.schedule, s, p, m));
    total_ops += programs.back().size();
  }

  // List scheduling: each stage runs its program in order, so an op starts
  // at max(stage free, inputs arrived). Sweeping the stages and advancing
  // every one whose next op's input is already timed reaches a fixed point;
  // ops left over then mean the programs wait on each other in a cycle.
  EndTimes end(p, m);
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0.0);
  std::vector<std::vector<SimOp>> ran(p);
  size_t timed = 0;
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < programs[s].size()) {
        const PlannedOp& op = programs[s][next[s]];
        const double ready = ReadyTime(op, s, p, config.transfer_s, end);
        if (ready < 0) break;
        const double start = std::max(free_at[s], ready);
        const double finish =
            start + OpDuration(config.stages[s], op.kind, split_wgrad);
        end.Set(op.kind, s, op.microbatch, finish);
        free_at[s] = finish;
        ran[s].push_back({op.kind, s, op.microbatch, start, finish});
        ++next[s];
        ++timed;
        progressed = true;
      }
    }
  }
  if (timed != total_ops) {
    return absl::InternalError(absl::StrCat(
        ScheduleName(config.schedule), " programs deadlock after ", timed,
        " of ", total_ops, " ops (p=", p, ", m=", m, ")"));
  }

  SimResult result;
  result.iteration_time_s = *std::max_element(free_at.begin(), free_at.end());
  double idle_sum = 0;
  for (int s = 0; s < p; ++s) {
    double busy = 0;
    for (const SimOp& op : ran[s]) busy += op.end_s - op.start_s;
    result.stage_busy_s.push_back(busy);
    // Summing durations can overshoot T by a rounding error; idle is never
    // negative.
    result.stage_idle_s.push_back(
        std::max(0.0, result.iteration_time_s - busy));
    idle_sum += result.stage_idle_s.back();
    // A stage's ops run in program order back to back, so its slice is
    // already sorted by start time.
    result.timeline.insert(result.timeline.end(), ran[s].begin(),
                           ran[s].end());
  }
  if (result.iteration_time_s > 0) {
    result.bubble_ratio = idle_sum / (p * result.iteration_time_s);
  }
  return result;
}

}  // namespace dynmo::core
