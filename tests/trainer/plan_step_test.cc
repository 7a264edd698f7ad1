// What a rank executes is what the coordinator decided: a Decision made by
// the coordinator's own code (service::Decide) is put into a Plan message as
// the coordinator sends it (the Decision is the plan's layout part; wire::PlanToProto),
// read back as the agent hands it over (wire::PlanFromProto) by the
// trainer (ExecutionForPlan), and the moves the rank will run are compared
// with the coordinator's list, move by move and round by round; plans whose
// moves or split disagree with their layout are refused.
#include "trainer/elastic/plan_step.h"

#include <algorithm>
#include <string>
#include <vector>

#include "coordinator/job/decision.h"
#include "gtest/gtest.h"

namespace dynmo::trainer {
namespace {

core::PipelineModel Model(const std::vector<double>& times, int stages) {
  core::PipelineModel m;
  for (size_t i = 0; i < times.size(); ++i) {
    core::LayerCost c;
    c.id = static_cast<int>(i);
    c.fwd_s = times[i];
    c.resident_bytes = 1000 + static_cast<int64_t>(i);
    m.layers.push_back(c);
  }
  m.stages.assign(static_cast<size_t>(stages), core::StageSpec{});
  return m;
}

struct Decided {
  service::Decision decision;
  dynmo::v1::Plan plan;
};

Decided Decide(const core::PipelineModel& model, std::vector<int> active,
               core::Boundaries current, bool repack) {
  service::DecisionInput in;
  in.model = model;
  in.active_stages = std::move(active);
  in.current = std::move(current);
  in.policy.balancer = core::PartitionMethod::kOptimal;
  in.policy.repack = repack;
  in.policy.repack_tolerance = 0.5;
  absl::StatusOr<service::Decision> d = service::Decide(in);
  EXPECT_TRUE(d.ok()) << d.status();
  Decided out{*d, {}};
  wire::PlanToProto(out.decision, &out.plan);
  return out;
}

// A job re-packed earlier: original stages 1, 2, 3 hold two layers each.
StageLayout PackedLayout() {
  StageLayout l;
  l.active_stages = {1, 2, 3};
  l.boundaries = {0, 2, 4, 6};
  return l;
}

// The coordinator's moves (original ids) as the current active indices.
void ExpectSameMoves(const service::Decision& d, const std::vector<int>& active,
                     const core::MigrationPlan& executed) {
  ASSERT_EQ(executed.migrations.size(), d.migrations.size());
  for (size_t i = 0; i < d.migrations.size(); ++i) {
    const core::LayerMigration& want = d.migrations[i];
    const core::LayerMigration& got = executed.migrations[i];
    SCOPED_TRACE(testing::Message() << "move " << i << " of layer " << want.layer);
    EXPECT_EQ(got.layer, want.layer);
    EXPECT_EQ(active[static_cast<size_t>(got.from_stage)], want.from_stage);
    EXPECT_EQ(active[static_cast<size_t>(got.to_stage)], want.to_stage);
    EXPECT_EQ(got.round, want.round);
    EXPECT_EQ(got.bytes, want.bytes);
  }
  EXPECT_EQ(executed.total_bytes, d.migration_bytes);
}

TEST(PlanStepTest, ARebalanceExecutesTheCoordinatorsMovesInTheirRounds) {
  const core::PipelineModel m = Model({5, 5, 1, 1, 1, 1, 1, 1}, 4);
  const Decided p = Decide(m, {0, 1, 2, 3}, {0, 2, 4, 6, 8}, false);
  ASSERT_TRUE(p.decision.changes_layout);
  ASSERT_GE(p.decision.migrations.size(), 2u);
  absl::StatusOr<PlanExecution> e =
      ExecutionForPlan(wire::PlanFromProto(p.plan), InitialLayout(4, {0, 2, 4, 6, 8}), 8, 2,
                       m.layers);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->step.to.boundaries, p.decision.boundaries);
  ExpectSameMoves(p.decision, {0, 1, 2, 3}, e->moves);
}

TEST(PlanStepTest, ARepackExecutesTheMovesAndTheSplitAsSent) {
  // After an earlier re-pack the job runs on original stages 1, 2, 3: the
  // plan names original ids, the rank works in current active indices.
  const core::PipelineModel m = Model({1, 1, 1, 1, 1, 1}, 3);
  const StageLayout current = PackedLayout();
  const Decided p = Decide(m, current.active_stages, current.boundaries, true);
  ASSERT_FALSE(p.decision.released_stages.empty());
  absl::StatusOr<PlanExecution> e =
      ExecutionForPlan(wire::PlanFromProto(p.plan), current, 6, 1, m.layers);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->step.to.active_stages, p.decision.active_stages);
  ExpectSameMoves(p.decision, current.active_stages, e->moves);
  for (const core::CommSplit& c : p.decision.split) {
    const size_t i = static_cast<size_t>(
        std::find(current.active_stages.begin(), current.active_stages.end(), c.stage) -
        current.active_stages.begin());
    ASSERT_LT(i, current.active_stages.size());
    EXPECT_EQ(e->step.new_index[i], c.key) << "stage " << c.stage;
  }
}

TEST(PlanStepTest, ARebalanceOfARePackedJobNamesItsOriginalStages) {
  // The job runs on original stages 1, 2, 3 (0 was released): the core
  // plans the moves by original id and the rank runs them in its positions.
  const core::PipelineModel m = Model({5, 5, 1, 1, 1, 1}, 3);
  const StageLayout current = PackedLayout();
  const Decided p = Decide(m, current.active_stages, current.boundaries, false);
  ASSERT_TRUE(p.decision.changes_layout);
  ASSERT_FALSE(p.decision.migrations.empty());
  for (const core::LayerMigration& mv : p.decision.migrations) {
    EXPECT_GE(mv.from_stage, 1) << "layer " << mv.layer;
    EXPECT_GE(mv.to_stage, 1) << "layer " << mv.layer;
  }
  absl::StatusOr<PlanExecution> e =
      ExecutionForPlan(wire::PlanFromProto(p.plan), current, 6, 1, m.layers);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->step.to.boundaries, p.decision.boundaries);
  ExpectSameMoves(p.decision, current.active_stages, e->moves);
}

TEST(PlanStepTest, MovesThatDoNotCarryTheLayoutAreRefused) {
  const core::PipelineModel m = Model({5, 5, 1, 1, 1, 1, 1, 1}, 4);
  const Decided p = Decide(m, {0, 1, 2, 3}, {0, 2, 4, 6, 8}, false);
  const StageLayout current = InitialLayout(4, {0, 2, 4, 6, 8});
  ASSERT_GE(p.plan.migrations_size(), 2);
  auto refused = [&](const dynmo::v1::Plan& plan, const std::string& why) {
    absl::StatusOr<PlanExecution> e =
        ExecutionForPlan(wire::PlanFromProto(plan), current, 8, 1, m.layers);
    EXPECT_FALSE(e.ok()) << why;
    if (!e.ok()) {
      EXPECT_FALSE(e.status().message().empty());
    }
  };
  dynmo::v1::Plan wrong_target = p.plan;
  wrong_target.mutable_migrations(0)->set_to_stage(
      (wrong_target.migrations(0).to_stage() + 2) % 4);
  refused(wrong_target, "a move to a stage the layout does not give the layer");
  dynmo::v1::Plan missing = p.plan;
  missing.mutable_migrations()->RemoveLast();
  refused(missing, "a layer the layout moves but the list does not");
  dynmo::v1::Plan twice = p.plan;
  *twice.add_migrations() = twice.migrations(0);
  refused(twice, "a layer moved twice");
  dynmo::v1::Plan crowded = p.plan;
  for (auto& mv : *crowded.mutable_migrations()) mv.set_round(0);
  bool shares_stage = false;
  for (int i = 0; i < crowded.migrations_size(); ++i) {
    for (int j = i + 1; j < crowded.migrations_size(); ++j) {
      const auto& a = crowded.migrations(i);
      const auto& b = crowded.migrations(j);
      shares_stage = shares_stage || a.from_stage() == b.from_stage() ||
                     a.from_stage() == b.to_stage() || a.to_stage() == b.from_stage() ||
                     a.to_stage() == b.to_stage();
    }
  }
  if (shares_stage) refused(crowded, "one stage in two moves of one round");
  dynmo::v1::Plan unknown = p.plan;
  unknown.mutable_migrations(0)->set_from_stage(9);
  refused(unknown, "a stage that is not running");
  dynmo::v1::Plan bad_split = p.plan;
  ASSERT_GT(bad_split.split_size(), 1);
  bad_split.mutable_split(0)->set_key(1);
  refused(bad_split, "a split that numbers the survivors differently");
  dynmo::v1::Plan short_split = p.plan;
  short_split.mutable_split()->RemoveLast();
  refused(short_split, "a split that leaves a running stage out");
}

TEST(PlanStepTest, APlanWithoutAMigrationListGetsTheDerivedMoves) {
  const core::PipelineModel m = Model({5, 5, 1, 1, 1, 1, 1, 1}, 4);
  Decided p = Decide(m, {0, 1, 2, 3}, {0, 2, 4, 6, 8}, false);
  p.plan.clear_migrations();
  absl::StatusOr<PlanExecution> e =
      ExecutionForPlan(wire::PlanFromProto(p.plan), InitialLayout(4, {0, 2, 4, 6, 8}), 8, 1,
                       m.layers);
  ASSERT_TRUE(e.ok()) << e.status();
  ExpectSameMoves(p.decision, {0, 1, 2, 3}, e->moves);
}

// A re-shaping plan as the coordinator sends it (plan.proto's Reshape):
// stages renumbered 0..pp'-1, boundaries over them, nothing released, no
// moves and no split.
dynmo::v1::Plan ReshapePlan(int pp, int dp, std::vector<int> boundaries) {
  dynmo::v1::Plan plan;
  plan.set_epoch(3);
  plan.mutable_reshape()->set_pipeline_size(pp);
  plan.mutable_reshape()->set_data_parallel_size(dp);
  for (int b : boundaries) plan.add_boundaries(b);
  for (int s = 0; s < pp; ++s) plan.add_active_stages(s);
  return plan;
}

TEST(PlanStepTest, AReshapingPlanRegroupsARePackedJob) {
  // Stages 1 and 2 of 4 run at dp 2 (stages 0 and 3 were released): four
  // ranks become one stage of four replicas.
  const StageLayout current{{1, 2}, {0, 4, 8}};
  absl::StatusOr<ReshapeStep> step =
      ReshapeForPlan(wire::PlanFromProto(ReshapePlan(1, 4, {0, 8})), current, /*dp=*/2,
                     /*microbatches=*/4, 8);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->to_pp(), 1);
  EXPECT_EQ(step->to_dp, 4);
  EXPECT_EQ(step->to_microbatches, 2);
  EXPECT_EQ(step->copies.size(), 16u);  // each rank gets the 4 layers it lacks
}

TEST(PlanStepTest, AReshapingPlanOutsideTheContractIsRefused) {
  const StageLayout current = InitialLayout(4, {0, 2, 4, 6, 8});
  auto refused = [&](const dynmo::v1::Plan& plan, const std::string& why) {
    absl::StatusOr<ReshapeStep> step = ReshapeForPlan(wire::PlanFromProto(plan), current, 1, 4, 8);
    EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument) << why;
    return std::string(step.status().message());
  };
  EXPECT_TRUE(
      ReshapeForPlan(wire::PlanFromProto(ReshapePlan(2, 2, {0, 4, 8})), current, 1, 4, 8).ok());
  EXPECT_NE(refused(ReshapePlan(2, 1, {0, 4, 8}), "too few ranks").find("needs 2 ranks"),
            std::string::npos);
  EXPECT_NE(refused(ReshapePlan(2, 2, {0, 4, 6, 8}), "boundaries over 3").find("boundaries"),
            std::string::npos);
  dynmo::v1::Plan kept_ids = ReshapePlan(2, 2, {0, 4, 8});
  kept_ids.set_active_stages(0, 1);
  kept_ids.set_active_stages(1, 2);
  EXPECT_NE(refused(kept_ids, "not renumbered").find("must be 0..1"), std::string::npos);
  dynmo::v1::Plan releasing = ReshapePlan(2, 2, {0, 4, 8});
  releasing.add_released_stages(3);
  refused(releasing, "a re-shape releases nothing");
  dynmo::v1::Plan moving = ReshapePlan(2, 2, {0, 4, 8});
  moving.add_migrations()->set_layer(2);
  refused(moving, "a re-shape carries no moves");
  dynmo::v1::Plan uneven = ReshapePlan(1, 4, {0, 8});
  EXPECT_NE(ReshapeForPlan(wire::PlanFromProto(uneven), current, 1, 2, 8).status().message().find(
                "does not split evenly"),
            std::string::npos);
}

}  // namespace
}  // namespace dynmo::trainer
