// Elastic re-packing in dynmo-train: carrying out one layout step (repack_
// layout.h) that may release stages, at an iteration boundary, on every rank
// of the running job:
//   1. the layers move to their new owners over the CURRENT transport, with
//      their weights and AdamW state, exactly as live migration does
//      (PipelineStage::ApplyMigration); a released stage ends with none;
//   2. when stages are released, the transport shrinks to the survivors
//      (Transport::Shrink: new groups, ranks renumbered by the new stage
//      index), and the survivors' stages are rebound to it.
// A released rank comes back with a null transport and must leave the job.
// Also the coordinator plan -> StageLayout conversion, validated alike on
// every rank so that all ranks accept or refuse a plan together.
#ifndef DYNMO_TRAINER_REPACK_H_
#define DYNMO_TRAINER_REPACK_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "coordinator/core/cost_model.h"
#include "dynmo/v1/plan.pb.h"
#include "trainer/pipeline_stage.h"
#include "trainer/repack_layout.h"
#include "trainer/transport.h"

namespace dynmo::trainer {

// The layout a committed plan asks for (active_stages empty: the running
// ones), as a step from `current`. Errors are the reason to refuse the plan.
absl::StatusOr<RepackStep> StepForPlan(const dynmo::v1::Plan& plan,
                                       const StageLayout& current, int num_layers,
                                       int dp);

// Applies `step` (see above). `*transport` becomes the survivors' transport,
// or null when this rank's stage was released. Every rank of the current
// transport must call it with the same step.
absl::Status ApplyLayoutStep(const RepackStep& step,
                             absl::Span<const core::LayerCost> layer_costs,
                             PipelineStage& stage,
                             std::unique_ptr<Transport>* transport);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_REPACK_H_
