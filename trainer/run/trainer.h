// RunTraining: one dynmo-train rank from connection to the last iteration.
//
// Every rank opens the corpus, connects the transport (transport.h), builds
// its stage of the starting partition and runs --steps iterations of 1F1B +
// dp gradient averaging + AdamW. After each iteration one world all-reduce
// gathers the loss and every layer's forward/backward time, so rank 0 can
// hand a job-wide IterationRecord to `on_iteration` (other ranks never call
// it). With config.coordinator set, every rank also runs an agent::Agent:
// it reports its stage's per-layer times each iteration and, at each
// iteration boundary, joins the in-band agreement on the committed plan due
// (all ranks hold its epoch or none switches) before migrating layers to
// the plan's boundaries. Any rank's error (bad data, a dead peer, a timeout) ends that rank
// with the Status; its peers then fail their next communication.
//
// No LibTorch in this header: the main and tests include it freely.
#ifndef DYNMO_TRAINER_RUN_TRAINER_H_
#define DYNMO_TRAINER_RUN_TRAINER_H_

#include <functional>

#include "absl/status/status.h"
#include "trainer/comm/dist_env.h"
#include "trainer/config/config.h"
#include "trainer/run/training_log.h"

namespace dynmo::trainer {

using IterationCallback = std::function<absl::Status(const IterationRecord&)>;

// Runs the whole job on this rank. Precondition: ValidateConfig(config,
// env.world_size) is OK.
absl::Status RunTraining(const TrainerConfig& config, const DistEnv& env,
                         const IterationCallback& on_iteration);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_RUN_TRAINER_H_
