#include "core/trace.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dynmo::core {
namespace {

using ::testing::HasSubstr;

TraceRecord Record(int64_t iter, int layers) {
  TraceRecord r;
  r.iter = iter;
  for (int i = 0; i < layers; ++i) {
    r.layers.push_back({0.01 * (i + 1), 0.02, 0.03, 1000 + i});
  }
  return r;
}

TEST(TraceTest, WellFormedTraceIsValid) {
  Trace t = {Record(0, 3), Record(1, 3), Record(5, 3)};
  EXPECT_TRUE(ValidateTrace(t).ok());
}

TEST(TraceTest, EmptyTraceIsRejected) {
  absl::Status s = ValidateTrace({});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no records"));
}

TEST(TraceTest, RecordWithoutLayersIsRejected) {
  Trace t = {Record(0, 0)};
  EXPECT_THAT(ValidateTrace(t).message(), HasSubstr("has no layers"));
}

TEST(TraceTest, ChangingLayerCountNamesBothIters) {
  Trace t = {Record(0, 3), Record(1, 4)};
  absl::Status s = ValidateTrace(t);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("record 1"));
  EXPECT_THAT(s.message(), HasSubstr("iter 1 has 4 layers but iter 0 has 3"));
}

TEST(TraceTest, ItersMustStrictlyIncrease) {
  Trace repeated = {Record(3, 2), Record(3, 2)};
  EXPECT_THAT(ValidateTrace(repeated).message(),
              HasSubstr("strictly increasing"));
  Trace backwards = {Record(3, 2), Record(2, 2)};
  EXPECT_FALSE(ValidateTrace(backwards).ok());
}

TEST(TraceTest, NegativeOrNonFiniteTimesNameTheLayer) {
  for (double bad :
       {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    Trace t = {Record(0, 3), Record(1, 3)};
    t[1].layers[2].bwd_s = bad;
    absl::Status s = ValidateTrace(t);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_THAT(s.message(), HasSubstr("iter 1 layer 2"));
  }
}

TEST(TraceTest, NegativeMemoryIsRejected) {
  Trace t = {Record(0, 2)};
  t[0].layers[1].mem_bytes = -5;
  EXPECT_THAT(ValidateTrace(t).message(), HasSubstr("negative mem_bytes"));
}

TEST(TraceTest, ZeroTimesAreValid) {
  // A frozen layer really has no backward: 0 is a measurement, not an error.
  Trace t = {Record(0, 2)};
  t[0].layers[0].bwd_s = 0;
  t[0].layers[0].wgrad_s = 0;
  EXPECT_TRUE(ValidateTrace(t).ok());
}

TEST(TraceTest, LayerCostsOfKeepsOrderTimesAndBytes) {
  TraceRecord r = Record(7, 3);
  std::vector<LayerCost> costs = LayerCostsOf(r);
  ASSERT_EQ(costs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(costs[i].id, i);
    EXPECT_DOUBLE_EQ(costs[i].fwd_s, r.layers[i].fwd_s);
    EXPECT_DOUBLE_EQ(costs[i].bwd_s, r.layers[i].bwd_s);
    EXPECT_DOUBLE_EQ(costs[i].wgrad_s, r.layers[i].wgrad_s);
    EXPECT_EQ(costs[i].resident_bytes, r.layers[i].mem_bytes);
  }
  // The cost model accepts what the helper builds.
  PipelineModel model;
  model.layers = costs;
  model.stages.resize(1);
  EXPECT_TRUE(ValidateModel(model).ok());
}

}  // namespace
}  // namespace dynmo::core
