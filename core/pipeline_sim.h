// Pipeline simulator: an event-driven model of one training iteration under
// GPipe, 1F1B or ZB-H1, with per-stage forward (F), input-gradient (B) and
// weight-gradient (W) times that may all differ and a point-to-point transfer
// time between neighbouring stages. GPipe and 1F1B run B and W as one pass.
//
// Each stage executes its schedule's op list in order (warm-up forwards,
// steady one-forward-one-backward, cool-down backwards — the same phase names
// as the trainer's executor); an op starts when its stage is free and its
// cross-stage dependency has arrived. For equal stages and zero transfer the
// result equals the closed forms: GPipe and 1F1B take (m+p-1)(F+B+W), ZB-H1
// takes m(F+B+W) + (p-1)(F+B-W) for m >= p and W <= F. When W > F no
// schedule within 1F1B's activation memory reaches that: stage 0 holds p
// forwards and then waits (p-1)B for its first gradient, so ZB-H1 takes
// m(F+B+W) + (p-1)B.
#ifndef DYNMO_CORE_PIPELINE_SIM_H_
#define DYNMO_CORE_PIPELINE_SIM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/stage_program.h"

namespace dynmo::core {


// Seconds one stage spends per micro-batch in each pass.
struct StagePassTimes {
  double fwd_s = 0;
  double bwd_s = 0;    // input gradient
  double wgrad_s = 0;  // weight gradient
};

struct SimConfig {
  Schedule schedule = Schedule::k1F1B;
  int microbatches = 1;
  std::vector<StagePassTimes> stages;
  double transfer_s = 0;  // one activation or gradient hop between stages
};

// One executed op: stage, micro-batch and when it ran.
struct SimOp {
  OpKind kind = OpKind::kForward;
  int stage = 0;
  int microbatch = 0;
  double start_s = 0;
  double end_s = 0;
};

struct SimResult {
  double iteration_time_s = 0;
  // Idle stage-seconds over total stage-seconds: sum(idle) / (p * T).
  double bubble_ratio = 0;
  std::vector<double> stage_idle_s;  // T minus the stage's busy time
  std::vector<double> stage_busy_s;
  std::vector<SimOp> timeline;  // every op, sorted by (stage, start)
};

// Simulates one iteration. Errors: no stages, microbatches < 1, negative or
// non-finite times.
absl::StatusOr<SimResult> SimulatePipeline(const SimConfig& config);

// An SVG Gantt chart of `result`: one row per stage, one box per op, coloured
// by pass, labelled with the micro-batch, with a time axis and the iteration
// time and bubble ratio in the title.
std::string RenderGanttSvg(const SimResult& result, absl::string_view title);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_PIPELINE_SIM_H_
