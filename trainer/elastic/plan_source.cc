#include "trainer/elastic/plan_source.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainer/elastic/plan_step.h"

namespace dynmo::trainer {
namespace {

class TestPolicySource : public PlanSource {
 public:
  TestPolicySource(const TrainerConfig& config, int num_layers,
                   const std::vector<core::LayerCost>* layer_costs)
      : config_(config), num_layers_(num_layers), layer_costs_(layer_costs) {
    for (const std::vector<int>& stages : config.test_migration_stages) {
      releases_ = releases_ ||
                  (!stages.empty() && static_cast<int>(stages.size()) < config.pp);
    }
  }

  absl::StatusOr<std::optional<LayoutChange>> Due(int64_t iter, const StageLayout& layout,
                                                  Transport&) override {
    if (config_.test_reshape_at > 0 && iter == config_.test_reshape_at) {
      absl::StatusOr<ReshapeStep> step = PlanReshapeStep(
          layout, config_.dp, config_.microbatches,
          ReshapeTarget{config_.test_reshape_pp, config_.test_reshape_dp,
                        config_.test_reshape_boundaries},
          num_layers_);
      if (!step.ok()) return step.status();
      LayoutChange change;
      change.reshape = *std::move(step);
      change.by = "the test policy";
      return change;
    }
    const int64_t every = config_.test_migrate_every;
    if (every <= 0 || iter == 0 || iter % every != 0) return std::nullopt;
    const int64_t index = iter / every - 1;
    const auto& targets = config_.test_migration_targets;
    // A list that releases stages is walked once; others cycle.
    if (releases_ && index >= static_cast<int64_t>(targets.size())) return std::nullopt;
    const size_t k = static_cast<size_t>(index) % targets.size();
    LayoutTarget target;
    target.boundaries = targets[k];
    if (!config_.test_migration_stages.empty()) {
      target.active_stages = config_.test_migration_stages[k];
    }
    absl::StatusOr<RepackStep> step =
        PlanRepackStep(layout, ResolveTarget(layout, target), num_layers_, config_.dp);
    if (!step.ok()) return step.status();
    absl::StatusOr<core::MigrationPlan> moves =
        core::PlanMigration(*layer_costs_, step->owner_before, step->owner_after);
    if (!moves.ok()) return moves.status();
    return LayoutChange{*std::move(step), *std::move(moves), std::nullopt, std::nullopt,
                        "the test policy"};
  }

 private:
  const TrainerConfig& config_;
  int num_layers_;
  const std::vector<core::LayerCost>* layer_costs_;
  bool releases_ = false;
};

// The MIN all-reduce of the held epoch is done with the world sum: with
// [holds, epoch, epoch^2] summed, every rank holds epoch e exactly when the
// count is the world size, the sum W*e and the sum of squares W*e^2 (zero
// variance), i.e. when MIN == MAX == e. A plan not every rank holds, or one
// whose moves do not carry its layout, is acknowledged as failed and skipped.
class AgentPlanSource : public PlanSource {
 public:
  AgentPlanSource(agent::Agent* agent, int num_layers, const TrainerConfig& config,
                  const std::vector<core::LayerCost>* layer_costs)
      : agent_(agent), num_layers_(num_layers), config_(config), layer_costs_(layer_costs) {}

  int AgreementSlots() const override { return 3; }

  void OfferAgreement(int64_t next_iter, absl::Span<double> slots) override {
    offered_iter_ = next_iter;
    agreed_ = false;
    // No boundary follows the last iteration: ask the agent nothing (asking
    // fails a plan due there, which no rank would reach anyway).
    offered_ = next_iter < config_.steps ? agent_->PlanToApplyAt(next_iter) : std::nullopt;
    Held(offered_, slots);
  }

  void TakeAgreement(int64_t next_iter, absl::Span<const double> summed) override {
    if (next_iter != offered_iter_ || summed.size() != summed_.size()) return;
    std::copy(summed.begin(), summed.end(), summed_.begin());
    agreed_ = true;
  }

  absl::StatusOr<std::optional<LayoutChange>> Due(int64_t iter, const StageLayout& layout,
                                                  Transport& transport) override {
    std::optional<wire::Plan> due;
    std::array<double, 3> v{};
    if (agreed_ && offered_iter_ == iter) {
      // Agreed in the previous iteration's summary all-reduce: no
      // collective at this boundary.
      due = std::move(offered_);
      v = summed_;
    } else {
      due = agent_->PlanToApplyAt(iter);
      torch::Tensor t = torch::zeros({3}, torch::kDouble);
      Held(due, absl::MakeSpan(t.data_ptr<double>(), 3));
      // host-sync(event): the first boundary of a run (no iteration summary before it to
      //   carry the agreement): the in-band agreement on the plan epoch every rank holds
      //   (three doubles on the CPU, which NCCL stages through the device and copies back).
      if (absl::Status s = transport.AllReduceSumWorld(t); !s.ok()) return s;
      std::copy(t.data_ptr<double>(), t.data_ptr<double>() + 3, v.begin());
    }
    agreed_ = false;
    offered_.reset();
    if (!due) return std::nullopt;
    const double e = static_cast<double>(due->epoch);
    const double w = transport.world_size();
    auto fail = [&](const std::string& why) -> std::optional<LayoutChange> {
      std::cerr << "dynmo-train: rank " << transport.rank() << ": plan epoch "
                << due->epoch << " not applied at iteration " << iter << ": " << why
                << std::endl;
      (void)agent_->Acknowledge(due->epoch, false, why);
      return std::nullopt;
    };
    if (v[0] != w || v[1] != w * e || v[2] != w * e * e) {
      return fail(absl::StrCat("in-band agreement failed: ", static_cast<int>(v[0]),
                               " of ", static_cast<int>(w), " ranks hold epoch ",
                               due->epoch));
    }
    // Deterministic checks on a plan every rank holds: all decide alike.
    if (due->reshape.has_value()) {
      absl::StatusOr<ReshapeStep> step = ReshapeForPlan(*due, layout, config_.dp,
                                                        config_.microbatches, num_layers_);
      if (!step.ok()) return fail(std::string(step.status().message()));
      plan_ = *std::move(due);
      LayoutChange change;
      change.reshape = *std::move(step);
      change.epoch = plan_.epoch;
      change.by = absl::StrCat("plan epoch ", plan_.epoch);
      return change;
    }
    absl::StatusOr<PlanExecution> execution =
        ExecutionForPlan(*due, layout, num_layers_, config_.dp, *layer_costs_);
    if (!execution.ok()) return fail(std::string(execution.status().message()));
    plan_ = *std::move(due);
    return LayoutChange{std::move(execution->step), std::move(execution->moves),
                        std::nullopt, plan_.epoch,
                        absl::StrCat("plan epoch ", plan_.epoch)};
  }

  void Applied(int64_t iter, const LayoutChange& change, bool announce) override {
    const RepackStep& step = change.step;
    if (announce && !change.reshape) {
      std::cout << "dynmo-train: iteration " << iter << ": applied plan epoch "
                << plan_.epoch << " (" << plan_.reason << "), boundaries "
                << absl::StrJoin(step.from.boundaries, ",") << " -> "
                << absl::StrJoin(step.to.boundaries, ",");
      if (step.releases()) {
        std::cout << ", stages " << absl::StrJoin(step.from.active_stages, ",") << " -> "
                  << absl::StrJoin(step.to.active_stages, ",") << " (re-packed: released "
                  << absl::StrJoin(plan_.released_stages, ",") << ")";
      }
      std::cout << std::endl;
    }
    (void)agent_->Acknowledge(plan_.epoch, true);
  }

  void Failed(const LayoutChange&, const absl::Status& why) override {
    (void)agent_->Acknowledge(plan_.epoch, false, std::string(why.message()));
  }

 private:
  agent::Agent* agent_;
  int num_layers_;
  const TrainerConfig& config_;
  const std::vector<core::LayerCost>* layer_costs_;
  // This rank's part of the agreement: [holds a plan, its epoch, epoch^2].
  static void Held(const std::optional<wire::Plan>& due, absl::Span<double> out) {
    const double e = due ? static_cast<double>(due->epoch) : 0;
    out[0] = due ? 1 : 0;
    out[1] = e;
    out[2] = e * e;
  }

  wire::Plan plan_;  // the plan of the change last handed out
  // The agreement offered in the last iteration summary, for offered_iter_:
  // the plan this rank held then and, once taken back, the world's sums.
  int64_t offered_iter_ = -1;
  std::optional<wire::Plan> offered_;
  bool agreed_ = false;
  std::array<double, 3> summed_{};
};

}  // namespace

std::unique_ptr<PlanSource> MakeTestPolicySource(
    const TrainerConfig& config, int num_layers,
    const std::vector<core::LayerCost>* layer_costs) {
  return std::make_unique<TestPolicySource>(config, num_layers, layer_costs);
}

std::unique_ptr<PlanSource> MakeAgentPlanSource(
    agent::Agent* agent, int num_layers, const TrainerConfig& config,
    const std::vector<core::LayerCost>* layer_costs) {
  return std::make_unique<AgentPlanSource>(agent, num_layers, config, layer_costs);
}

}  // namespace dynmo::trainer
