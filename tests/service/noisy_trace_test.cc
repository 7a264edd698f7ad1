// A job whose best split does not change, under load from another process
// sharing both cores, applies no plan that reverses an earlier one within
// 50 iterations (issue 44). The trace is recorded: dynmo-train, 2 ranks,
// 8 blocks at 0,5,10, 200 iterations on the 2-core development VM while a
// build ran on both cores (per-layer times scatter by ~20%, in bursts).
// It goes through the coordinator's own job machine (ReplayJob, the default
// auto trigger), as recorded and with one block made twice as heavy (the
// best split still 0,5,10, closer to a tie with 0,4,10).
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "formats/trace_json.h"
#include "coordinator/job/job_replay.h"
#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

core::Trace Recorded() {
  std::ifstream in(std::string(DYNMO_SOURCE_DIR) + "/tests/service/data/noisy_shared_cores.jsonl");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<core::Trace> trace = formats::ParseTraceJsonl(text.str());
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? *trace : core::Trace{};
}

// Plans applied within `window` iterations of one they undo: the layout
// before plan i is the layout plan j (> i) goes back to.
int Reversals(const JobReplayResult& r, const core::Boundaries& start, int64_t window) {
  std::vector<const ReplayedPlan*> applied;
  for (const ReplayedPlan& p : r.plans) {
    if (p.outcome == "applied") applied.push_back(&p);
  }
  int reversals = 0;
  for (size_t i = 0; i < applied.size(); ++i) {
    const core::Boundaries& before = i == 0 ? start : applied[i - 1]->boundaries;
    for (size_t j = i + 1; j < applied.size(); ++j) {
      if (applied[j]->apply_iteration - applied[i]->apply_iteration > window) break;
      if (applied[j]->boundaries == before) ++reversals;
    }
  }
  return reversals;
}

JobReplayResult Replay(const core::Trace& trace) {
  JobReplayConfig c;
  c.pp = 2;
  c.microbatches = 8;
  c.migration_bandwidth_bytes_per_s = 10e9;
  absl::StatusOr<JobReplayResult> r = ReplayJob(trace, c);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : JobReplayResult{};
}

TEST(NoisyTraceTest, TheRecordedSharedCoreNoiseMovesNothingBack) {
  const core::Trace trace = Recorded();
  ASSERT_EQ(trace.size(), 200u);
  const JobReplayResult r = Replay(trace);
  EXPECT_EQ(Reversals(r, {0, 5, 10}, 50), 0);
  EXPECT_GE(r.speedup, 0.99) << "never slower than static by more than noise";
}

TEST(NoisyTraceTest, ANearTieUnderTheSameNoiseMovesNothingBack) {
  core::Trace trace = Recorded();
  ASSERT_EQ(trace.size(), 200u);
  for (core::TraceRecord& rec : trace) {
    core::TraceLayer& heavy = rec.layers[1];
    heavy.fwd_s *= 2;
    heavy.bwd_s *= 2;
    heavy.wgrad_s *= 2;
  }
  const JobReplayResult r = Replay(trace);
  EXPECT_EQ(Reversals(r, {0, 5, 10}, 50), 0);
  EXPECT_LE(r.plans.size(), 2u) << "no chase of the noise";
}

}  // namespace
}  // namespace dynmo::service
