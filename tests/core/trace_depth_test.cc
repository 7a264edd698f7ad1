#include "core/trace_depth.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dynmo::core {
namespace {

using ::testing::HasSubstr;

// Layer i of every record costs i + 1 forward seconds, so a resampled layer
// names its source by its time.
Trace Ramp(int layers, int records) {
  Trace t;
  for (int k = 0; k < records; ++k) {
    TraceRecord r;
    r.iter = 10 * k;
    for (int i = 0; i < layers; ++i) r.layers.push_back({i + 1.0, 2.0 * k, 0.5, 100 + i});
    t.push_back(r);
  }
  return t;
}

TEST(TraceDepthTest, StretchingKeepsEndsAndRepeatsEachBlockEqually) {
  // 4 blocks -> 8 blocks: each block appears exactly twice, in order.
  absl::StatusOr<Trace> out = ResampleTraceDepth(Ramp(6, 2), 10);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  std::vector<double> fwd;
  for (const TraceLayer& l : (*out)[1].layers) fwd.push_back(l.fwd_s);
  EXPECT_EQ(fwd, (std::vector<double>{1, 2, 2, 3, 3, 4, 4, 5, 5, 6}));
  EXPECT_EQ((*out)[1].iter, 10);
  EXPECT_EQ((*out)[1].layers[3].bwd_s, 2.0);  // the record's own values
  EXPECT_TRUE(ValidateTrace(*out).ok());
}

TEST(TraceDepthTest, ShrinkingSamplesBlocksByDepth) {
  // 8 blocks -> 2 blocks: the middles of each half (blocks 2 and 6, 0-based).
  absl::StatusOr<Trace> out = ResampleTraceDepth(Ramp(10, 1), 4);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> fwd;
  for (const TraceLayer& l : (*out)[0].layers) fwd.push_back(l.fwd_s);
  EXPECT_EQ(fwd, (std::vector<double>{1, 4, 8, 10}));
}

TEST(TraceDepthTest, SameDepthIsIdentity) {
  const Trace in = Ramp(7, 3);
  absl::StatusOr<Trace> out = ResampleTraceDepth(in, 7);
  ASSERT_TRUE(out.ok());
  for (size_t k = 0; k < in.size(); ++k) {
    for (size_t i = 0; i < in[k].layers.size(); ++i) {
      EXPECT_EQ((*out)[k].layers[i].fwd_s, in[k].layers[i].fwd_s);
      EXPECT_EQ((*out)[k].layers[i].mem_bytes, in[k].layers[i].mem_bytes);
    }
  }
}

TEST(TraceDepthTest, TotalInteriorWorkScalesWithDepthForAUniformTrace) {
  // Equal blocks: 48-layer total interior = 46 blocks of the same cost.
  Trace t = Ramp(10, 1);
  for (int i = 1; i < 9; ++i) t[0].layers[i].fwd_s = 3.0;
  absl::StatusOr<Trace> out = ResampleTraceDepth(t, 48);
  ASSERT_TRUE(out.ok());
  double interior = 0;
  for (int i = 1; i < 47; ++i) interior += (*out)[0].layers[i].fwd_s;
  EXPECT_DOUBLE_EQ(interior, 46 * 3.0);
}

TEST(TraceDepthTest, TooShallowInputsAreRejected) {
  EXPECT_THAT(ResampleTraceDepth(Ramp(2, 1), 48).status().message(),
              HasSubstr("at least one interior layer"));
  EXPECT_THAT(ResampleTraceDepth(Ramp(5, 1), 2).status().message(),
              HasSubstr("need >= 3"));
  EXPECT_FALSE(ResampleTraceDepth({}, 10).ok());
}

}  // namespace
}  // namespace dynmo::core
