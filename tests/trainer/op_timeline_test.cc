// OpTimeline and TimedOps (trainer/stage/op_timeline.h): the real 1F1B
// schedule as a chrome trace, unit-tested over the executor with a
// recording StageOps, and end to end through dynmo-train --perfetto_out.
#include "trainer/stage/op_timeline.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/train_job.h"
#include "trainer/stage/one_f_one_b.h"

namespace dynmo::trainer {
namespace {

class NoOps : public StageOps {
 public:
  absl::Status RecvForward(int) override { return absl::OkStatus(); }
  absl::Status Forward(int) override { return absl::OkStatus(); }
  absl::Status SendForward(int) override { return absl::OkStatus(); }
  absl::Status SendForwardRecvBackward(int, int) override { return absl::OkStatus(); }
  absl::Status Backward(int) override { return absl::OkStatus(); }
  absl::Status SendBackward(int) override { return absl::OkStatus(); }
  absl::Status SendBackwardRecvForward(int, int) override { return absl::OkStatus(); }
  absl::Status RecvBackward(int) override { return absl::OkStatus(); }
};

std::vector<std::string> SliceNames(const nlohmann::json& trace) {
  std::vector<std::string> names;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") names.push_back(e["name"].get<std::string>());
  }
  return names;
}

// Stage 0 of 2, 3 micro-batches: warm-up F0, then 1F1B pairs, then the
// backwards left; the first stage's receive-forward and send-backward
// halves are no-ops and not recorded.
TEST(OpTimelineTest, TheFirstStageOfTwoAsPyTorchNamesItsActions) {
  OpTimeline timeline(0, 1);
  NoOps inner;
  TimedOps ops(inner, timeline, 0, 2, 0, {});
  ASSERT_TRUE(RunOneFOneB(0, 2, 3, ops).ok());
  const nlohmann::json trace = nlohmann::json::parse(timeline.ChromeTraceJson(0, 0));
  EXPECT_EQ(SliceNames(trace),
            (std::vector<std::string>{"PP:0F0", "PP:0SEND_F0", "PP:0F1",
                                      "PP:0SEND_F1+RECV_B0", "PP:0B0", "PP:0F2",
                                      "PP:0SEND_F2+RECV_B1", "PP:0B1", "PP:0RECV_B2",
                                      "PP:0B2"}));
}

TEST(OpTimelineTest, TheLastStageRecordsNoSendForwardOrReceiveBackward) {
  OpTimeline timeline(0, 1);
  NoOps inner;
  TimedOps ops(inner, timeline, 1, 2, 0, {});
  ASSERT_TRUE(RunOneFOneB(1, 2, 2, ops).ok());
  for (const std::string& n : SliceNames(nlohmann::json::parse(timeline.ChromeTraceJson(1, 1)))) {
    EXPECT_EQ(n.find("SEND_F"), std::string::npos) << n;
    EXPECT_EQ(n.find("RECV_B"), std::string::npos) << n;
  }
}

TEST(OpTimelineTest, TheTraceIsWellFormedAndSyncRunsAroundEveryOp) {
  OpTimeline timeline(5, 2);
  EXPECT_FALSE(timeline.Covers(4));
  EXPECT_TRUE(timeline.Covers(5));
  EXPECT_TRUE(timeline.Covers(6));
  EXPECT_FALSE(timeline.Covers(7));
  NoOps inner;
  int syncs = 0;
  TimedOps ops(inner, timeline, 0, 1, 5, [&] { ++syncs; });
  ASSERT_TRUE(RunOneFOneB(0, 1, 2, ops).ok());  // F0 B0 F1 B1... on one stage
  timeline.Instant("plan applied", 5, "boundaries 0,2,4");
  const nlohmann::json trace = nlohmann::json::parse(timeline.ChromeTraceJson(3, 0));
  int slices = 0, instants = 0, metadata = 0;
  for (const auto& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name")) << e;
    EXPECT_EQ(e["pid"], 3);
    if (e["ph"] == "X") {
      ++slices;
      EXPECT_GE(e["dur"].get<double>(), 0);
      EXPECT_GE(e["ts"].get<double>(), 0);
      EXPECT_EQ(e["args"]["iteration"], 5);
    } else if (e["ph"] == "i") {
      ++instants;
      EXPECT_EQ(e["args"]["detail"], "boundaries 0,2,4");
    } else {
      EXPECT_EQ(e["ph"], "M");
      ++metadata;
    }
  }
  EXPECT_EQ(slices, 4);  // 2 forwards, 2 backwards, no communication
  EXPECT_EQ(syncs, 2 * slices);
  EXPECT_EQ(instants, 1);
  EXPECT_EQ(metadata, 3);
  EXPECT_FALSE(timeline.Write("/no/such/dir/trace.json", 3, 0).ok());
}

// Two ranks of dynmo-train, iterations 1..2 of 4 traced: each rank's file
// holds exactly its stage's F and B of every micro-batch of those
// iterations, in time order, and its communication between them.
TEST(OpTimelineTest, DynmoTrainWritesEveryRanksRealSchedule) {
  const std::string dir = TempPath("perfetto");
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  JobResult r = RunJob(2, {"--pp=2", "--layers=4", "--hidden=32", "--heads=4", "--seq_len=16",
                           "--micro_batch=2", "--microbatches=4", "--steps=4",
                           "--intra_op_threads=1", "--perfetto_out=" + dir,
                           "--perfetto_first=1", "--perfetto_iterations=2"});
  ASSERT_TRUE(r.ok()) << r.AllLogs();
  for (int rank = 0; rank < 2; ++rank) {
    const nlohmann::json trace =
        nlohmann::json::parse(ReadFile(absl::StrCat(dir, "/rank", rank, "_trace.json")));
    std::map<std::string, int> count;
    std::map<int64_t, int> per_iteration;
    double last_ts = -1;
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] != "X") continue;
      const std::string name = e["name"];
      ASSERT_EQ(name.rfind(absl::StrCat("PP:", rank), 0), 0u) << name;
      ++count[name];
      ++per_iteration[e["args"]["iteration"].get<int64_t>()];
      EXPECT_GE(e["ts"].get<double>(), last_ts);
      last_ts = e["ts"].get<double>() + e["dur"].get<double>();
    }
    for (int mb = 0; mb < 4; ++mb) {
      EXPECT_EQ(count[absl::StrCat("PP:", rank, "F", mb)], 2) << rank << " " << mb;
      EXPECT_EQ(count[absl::StrCat("PP:", rank, "B", mb)], 2) << rank << " " << mb;
    }
    EXPECT_EQ(per_iteration.size(), 2u);
    EXPECT_EQ(per_iteration.begin()->first, 1);
  }
}

}  // namespace
}  // namespace dynmo::trainer
