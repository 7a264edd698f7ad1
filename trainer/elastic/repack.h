// Elastic re-packing in dynmo-train: carrying out one layout step (repack_
// layout.h) that releases stages, at an iteration boundary, on every rank
// of the running job:
//   1. the layers move to their new owners over the CURRENT transport, with
//      their weights and AdamW state: the stage's own live migration
//      (PipelineStage::ApplyMigration, every layout step's first step); a
//      released stage ends with none;
//   2. the transport shrinks to the survivors (Transport::Shrink: new
//      groups, ranks renumbered by the new stage index), and the survivors'
//      stages are rebound to it (ShrinkToSurvivors, below).
// A released rank comes back with a null transport and must leave the job.
// (What a coordinator plan asks for, and the moves it sends: plan_step.h.)
#ifndef DYNMO_TRAINER_ELASTIC_REPACK_H_
#define DYNMO_TRAINER_ELASTIC_REPACK_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/comm/transport.h"
#include "trainer/layout/repack_layout.h"
#include "trainer/stage/pipeline_stage.h"

namespace dynmo::trainer {

// Step 2 of a releasing `step` (see above), after its layers moved:
// `*transport` becomes the survivors' transport, or null when this rank's
// stage was released. Every rank of the current transport must call it with
// the same step.
absl::Status ShrinkToSurvivors(const RepackStep& step, PipelineStage& stage,
                               std::unique_ptr<Transport>* transport);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_ELASTIC_REPACK_H_
