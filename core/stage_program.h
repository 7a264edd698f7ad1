// The program of one pipeline stage for one training iteration: the order
// of its forward, backward (input-gradient) and weight-gradient passes over
// the micro-batches, for GPipe, 1F1B and ZB-H1. Generated once, here, and
// used by both the simulator (pipeline_sim.h times it) and the trainer's
// executor (trainer/stage/one_f_one_b.h runs it). Pure; thread-safe.
#ifndef DYNMO_CORE_STAGE_PROGRAM_H_
#define DYNMO_CORE_STAGE_PROGRAM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynmo::core {

enum class Schedule { kGPipe, k1F1B, kZBH1 };

// "gpipe", "1f1b", "zb-h1".
absl::StatusOr<Schedule> ParseSchedule(absl::string_view name);
std::string ScheduleName(Schedule schedule);

enum class OpKind { kForward, kBackward, kWeightGrad };

// One pass of one micro-batch.
struct PlannedOp {
  OpKind kind;
  int microbatch;
};

using StageProgram = std::vector<PlannedOp>;

// Number of warm-up forwards of `stage` (0-based) of `num_stages`:
// min(p-1-s, m) for 1F1B and ZB-H1, m for GPipe.
int WarmupCount(Schedule schedule, int stage, int num_stages, int microbatches);

// The program of `stage`: WarmupCount forwards, then one forward and one
// backward at a time, then the backwards still outstanding (the three phases
// of the 1F1B figure); weight-gradient passes only for ZB-H1 (see .cc).
// Preconditions: 0 <= stage < num_stages, microbatches >= 1.
StageProgram BuildStageProgram(Schedule schedule, int stage, int num_stages,
                               int microbatches);

}  // namespace dynmo::core

#endif  // DYNMO_CORE_STAGE_PROGRAM_H_
