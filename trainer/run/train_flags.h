// dynmo-train's command line, grouped by concern: one file per group, each
// defining its flags and reading them into the TrainerConfig (the shared
// coordinator-client flags live in cli/coordinator_flags.h):
//
//   model_flags.cc     the model, its data, the optimiser, pp x dp
//   layout_flags.cc    the starting partition and the test policies that
//                      change it (migrations, re-packs, a re-shape)
//   dynamism_flags.cc  --dynamism and each dynamic case's knobs
//   job_flags.cc       the coordinator, the job's name and policy
//   runtime_flags.cc   devices, clocks, logs, traces, checkpoints, memory
//
// Reading is thread-compatible: after absl::ParseCommandLine, before threads.
#ifndef DYNMO_TRAINER_RUN_TRAIN_FLAGS_H_
#define DYNMO_TRAINER_RUN_TRAIN_FLAGS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/config/config.h"

namespace dynmo::trainer {

// The whole configuration the flags describe (not yet validated against the
// world size: ValidateConfig). INVALID_ARGUMENT names the bad flag.
absl::StatusOr<TrainerConfig> ConfigFromFlags();

// Each group's part of it.
absl::Status ReadModelFlags(TrainerConfig& c);
absl::Status ReadLayoutFlags(TrainerConfig& c);
absl::Status ReadDynamismFlags(TrainerConfig& c);
absl::Status ReadJobFlags(TrainerConfig& c);
absl::Status ReadRuntimeFlags(TrainerConfig& c);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_RUN_TRAIN_FLAGS_H_
