// The one wire codec (wire/): a layer sample and a plan survive the trip to
// the dynmo.v1 message and back field for field, an absent re-shape stays
// absent, and a report is read back checked.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "wire/layer_codec.h"
#include "wire/plan_codec.h"
#include "wire/report_codec.h"

namespace dynmo::wire {
namespace {

TEST(WireCodecTest, ALayerSampleRoundTripsFieldForField) {
  core::LayerCost c;
  c.id = 7;
  c.fwd_s = 0.25;
  c.bwd_s = 0.5;
  c.wgrad_s = 0.125;
  c.params = 123;
  c.resident_bytes = 4567;
  c.activation_bytes = 89;
  const dynmo::v1::LayerSample s = LayerSampleFromCost(c);
  EXPECT_EQ(s.layer(), 7);
  dynmo::v1::IterationReport report;
  *report.add_layers() = s;
  absl::StatusOr<std::vector<core::LayerCost>> read = ReadReport(report, 8);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 1u);
  const core::LayerCost& back = read->front();
  EXPECT_EQ(back.id, c.id);
  EXPECT_EQ(back.fwd_s, c.fwd_s);
  EXPECT_EQ(back.bwd_s, c.bwd_s);
  EXPECT_EQ(back.wgrad_s, c.wgrad_s);
  EXPECT_EQ(back.params, c.params);
  EXPECT_EQ(back.resident_bytes, c.resident_bytes);
  EXPECT_EQ(back.activation_bytes, c.activation_bytes);
}

TEST(WireCodecTest, AReportIsReadOnlyWhenEveryFieldIsInRange) {
  dynmo::v1::IterationReport report;
  report.set_iteration(3);
  dynmo::v1::LayerSample* l = report.add_layers();
  l->set_layer(1);
  l->set_fwd_s(0.5);
  EXPECT_TRUE(ReadReport(report, 2).ok());
  EXPECT_EQ(ReadReport(report, 1).status().message(), "layer 1 outside [0, 1)");
  l->set_fwd_s(std::nan(""));
  EXPECT_EQ(ReadReport(report, 2).status().code(), absl::StatusCode::kInvalidArgument);
  l->set_fwd_s(0.5);
  *report.add_layers() = *l;
  EXPECT_EQ(ReadReport(report, 2).status().message(), "layer 1 reported twice");
  report.mutable_layers()->RemoveLast();
  report.set_iteration(-1);
  EXPECT_EQ(ReadReport(report, 2).status().code(), absl::StatusCode::kInvalidArgument);
  report.set_iteration(3);
  report.set_exchange_s(-1);
  EXPECT_EQ(ReadReport(report, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireCodecTest, APlanRoundTripsFieldForField) {
  Plan p;
  p.job = "j";
  p.epoch = 3;
  p.apply_iteration = 40;
  p.boundaries = {0, 2, 6};
  p.active_stages = {0, 3};
  p.released_stages = {1, 2};
  p.migrations = {{2, 1, 0, 100, 0}, {3, 2, 3, 200, 1}};
  p.split = {{0, 0, 0}, {1, core::kReleasedColor, -1}, {2, core::kReleasedColor, -1}, {3, 0, 1}};
  p.migration_bytes = 300;
  p.predicted_bottleneck_s = 1.5;
  p.previous_bottleneck_s = 2.5;
  p.reason = "auto";
  p.decided_unix_nanos = 99;
  p.commit_with_prepare = true;
  dynmo::v1::Plan proto;
  PlanToProto(p, &proto);
  EXPECT_FALSE(proto.has_reshape());
  const Plan back = PlanFromProto(proto);
  EXPECT_EQ(back.job, p.job);
  EXPECT_EQ(back.epoch, p.epoch);
  EXPECT_EQ(back.apply_iteration, p.apply_iteration);
  EXPECT_EQ(back.boundaries, p.boundaries);
  EXPECT_EQ(back.active_stages, p.active_stages);
  EXPECT_EQ(back.released_stages, p.released_stages);
  ASSERT_EQ(back.migrations.size(), 2u);
  EXPECT_EQ(back.migrations[1].layer, 3);
  EXPECT_EQ(back.migrations[1].from_stage, 2);
  EXPECT_EQ(back.migrations[1].to_stage, 3);
  EXPECT_EQ(back.migrations[1].bytes, 200);
  EXPECT_EQ(back.migrations[1].round, 1);
  ASSERT_EQ(back.split.size(), 4u);
  EXPECT_EQ(back.split[1].color, core::kReleasedColor);
  EXPECT_EQ(back.split[3].key, 1);
  EXPECT_EQ(back.migration_bytes, 300);
  EXPECT_EQ(back.predicted_bottleneck_s, 1.5);
  EXPECT_EQ(back.previous_bottleneck_s, 2.5);
  EXPECT_EQ(back.reason, "auto");
  EXPECT_EQ(back.decided_unix_nanos, 99);
  EXPECT_TRUE(back.commit_with_prepare);
  EXPECT_FALSE(back.reshape.has_value());
  // A re-shape travels whole.
  p.reshape = Reshape{2, 4, 1000, 10.0, 8.0, 6.0};
  dynmo::v1::Plan reshaped;
  PlanToProto(p, &reshaped);
  const Plan r = PlanFromProto(reshaped);
  ASSERT_TRUE(r.reshape.has_value());
  EXPECT_EQ(r.reshape->pipeline_size, 2);
  EXPECT_EQ(r.reshape->data_parallel_size, 4);
  EXPECT_EQ(r.reshape->copy_bytes, 1000);
  EXPECT_EQ(r.reshape->predicted_microbatches_per_s, 10.0);
  EXPECT_EQ(r.reshape->release_microbatches_per_s, 8.0);
  EXPECT_EQ(r.reshape->previous_microbatches_per_s, 6.0);
  EXPECT_FALSE(PlanFromProto(std::optional<dynmo::v1::Plan>()).has_value());
}

}  // namespace
}  // namespace dynmo::wire
