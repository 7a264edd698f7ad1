#include "core/pipeline_sim.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cost_model.h"
#include "core/stage_program.h"

namespace dynmo::core {
namespace {


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
    if (!FiniteNonNegative(t.fwd_s) || !FiniteNonNegative(t.bwd_s) ||
        !FiniteNonNegative(t.wgrad_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", s, " has pass times fwd=", t.fwd_s, " bwd=", t.bwd_s,
          " wgrad=", t.wgrad_s, "; each must be finite and >= 0 seconds"));
    }
  }
  if (!FiniteNonNegative(config.transfer_s)) {
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
