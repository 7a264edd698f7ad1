// PlanSource: where a rank's layout changes come from, behind one interface,
// so that the training loop (trainer.cc) reads like the paper's Algorithm 1:
// at every iteration boundary ask each source whether a change is due,
// migrate (and re-pack) as it says, tell the source how it went, train.
//
//   TestPolicySource   --test_migrate_every: a fixed list of targets walked
//                      every N iterations, or --test_reshape_at: one
//                      re-shape of the grid (tests, demos; no coordinator);
//   AgentPlanSource    the coordinator's committed plan due now, agreed
//                      in-band by every rank (all hold its epoch or none
//                      switches), executed as sent (plan_step.h) and
//                      acknowledged through the agent.
//
// Due() may be a collective (the agent source all-reduces): every rank calls
// every source at every iteration boundary, in the same order. A source
// that agrees in-band can instead ride the iteration summary's world
// all-reduce (iteration_report.h), which every rank runs at the end of
// every iteration: it offers its AgreementSlots() for the next iteration's
// change before that all-reduce and takes them back summed after it, and
// its Due() for that iteration then runs no collective of its own. Every
// rank offers at the same iterations (each Gather), so whether a Due() is
// pre-agreed is the same on every rank. Not thread-safe: the rank's
// training thread.
#ifndef DYNMO_TRAINER_ELASTIC_PLAN_SOURCE_H_
#define DYNMO_TRAINER_ELASTIC_PLAN_SOURCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "agent/agent.h"
#include "core/cost_model.h"
#include "core/migration.h"
#include "trainer/comm/transport.h"
#include "trainer/config/config.h"
#include "trainer/layout/repack_layout.h"
#include "trainer/layout/reshape_layout.h"

namespace dynmo::trainer {

// One layout change to carry out at an iteration boundary: a re-shape of
// the grid when `reshape` is set (then `step` and `moves` are unused), else
// a migration that may re-pack.
struct LayoutChange {
  RepackStep step;
  core::MigrationPlan moves;       // over the current active indices, in order
  std::optional<ReshapeStep> reshape;
  std::optional<uint64_t> epoch;   // the coordinator's; none: one more locally
  std::string by;                  // "the test policy", "plan epoch 3"
};

class PlanSource {
 public:
  virtual ~PlanSource() = default;
  // The change due before iteration `iter`, if any, from `layout`.
  virtual absl::StatusOr<std::optional<LayoutChange>> Due(int64_t iter,
                                                          const StageLayout& layout,
                                                          Transport& transport) = 0;
  // Doubles this source adds to the iteration summary's all-reduce (0: none).
  virtual int AgreementSlots() const { return 0; }
  // Before the summary's all-reduce at the end of the iteration before
  // `next_iter`: this rank's part of the agreement on the change due before
  // `next_iter`, in `slots` (AgreementSlots() of them, zeroed).
  virtual void OfferAgreement(int64_t next_iter, absl::Span<double> slots) {}
  // After it: the same slots summed over the world.
  virtual void TakeAgreement(int64_t next_iter, absl::Span<const double> summed) {}
  // The change was carried out; `announce`: this rank prints it.
  virtual void Applied(int64_t iter, const LayoutChange& change, bool announce) {}
  // Carrying it out failed (the job then stops with `why`).
  virtual void Failed(const LayoutChange& change, const absl::Status& why) {}
};

// `layer_costs`: bytes per layer for the moves the source derives itself.
// `config` is the job's running configuration: the sources read its dp and
// micro-batches per replica at each Due (a re-shape changes both), so it
// must outlive them.
std::unique_ptr<PlanSource> MakeTestPolicySource(
    const TrainerConfig& config, int num_layers,
    const std::vector<core::LayerCost>* layer_costs);
std::unique_ptr<PlanSource> MakeAgentPlanSource(
    agent::Agent* agent, int num_layers, const TrainerConfig& config,
    const std::vector<core::LayerCost>* layer_costs);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_ELASTIC_PLAN_SOURCE_H_
