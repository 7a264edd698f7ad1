// What dynmo-train reports about itself, end to end: per-stage and per-layer
// memory in the JSON log (trainer/stage/stage_memory.h), the --trace file that the
// simulator's trace reader parses and dynmo-sim replays
// (trainer/run/trace_log.h), and --profile_layers=false, which drops the
// per-layer clocks without changing a single bit of the training.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "formats/trace_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/train_job.h"
#include "trainer/config/config.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> TinyModel(std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--layers=4", "--hidden=32", "--heads=4",
                                    "--seq_len=16", "--micro_batch=2",
                                    "--microbatches=4", "--steps=3", "--lr=0.01",
                                    "--seed=7", "--intra_op_threads=1"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

ModelConfig TinyModelConfig() {
  ModelConfig m;
  m.num_blocks = 4;
  m.hidden = 32;
  m.heads = 4;
  m.seq_len = 16;
  m.vocab = 256;
  return m;
}

TEST(DynmoTrainReportsTest, JsonLogShowsMemoryPerStageAndPerLayer) {
  JobResult r = RunJob(2, TinyModel({"--pp=2", "--memory_capacity_gb=2"}));
  ASSERT_TRUE(r.ok()) << r.AllLogs();
  const nlohmann::json& rec = r.records.back();
  const auto layers = rec["layer_memory_bytes"].get<std::vector<int64_t>>();
  const auto stages = rec["stage_memory_bytes"].get<std::vector<int64_t>>();
  ASSERT_EQ(layers.size(), 6u);
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(rec["memory_capacity_bytes"].get<int64_t>(), int64_t{2} << 30);
  // fp32 weights, gradients, exp_avg and exp_avg_sq: 16 bytes a parameter
  // (the embedding has no buffers; blocks add their causal mask).
  const ModelConfig m = TinyModelConfig();
  EXPECT_EQ(layers[0], 16 * LayerParameterCount(m, 0));
  for (int l = 1; l <= 4; ++l) EXPECT_GE(layers[l], 16 * LayerParameterCount(m, l)) << l;
  EXPECT_EQ(layers[5], 16 * LayerParameterCount(m, 5));
  // A stage uses its layers' bytes plus the activations it stashed.
  const std::vector<int> b = rec["boundaries"].get<std::vector<int>>();
  for (int s = 0; s < 2; ++s) {
    int64_t resident = 0;
    for (int l = b[s]; l < b[s + 1]; ++l) resident += layers[l];
    EXPECT_GT(stages[s], resident) << "stage " << s;
    // At most 4 micro-batches of a few [2, 16, 32] fp32 activations per layer.
    EXPECT_LT(stages[s] - resident, 4 * 2 * (b[s + 1] - b[s] + 1) * 2 * 16 * 32 * 4)
        << "stage " << s;
  }
}

TEST(DynmoTrainReportsTest, TraceIsParsedByTheReaderAndReplayedByDynmoSim) {
  const std::string trace_path = TempPath("trace.jsonl");
  JobResult r = RunJob(2, TinyModel({"--pp=2", "--steps=4", "--trace=" + trace_path}));
  ASSERT_TRUE(r.ok()) << r.AllLogs();
  absl::StatusOr<core::Trace> trace = formats::ParseTraceJsonl(ReadFile(trace_path));
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 4u);
  for (size_t i = 0; i < trace->size(); ++i) {
    const core::TraceRecord& t = (*trace)[i];
    const nlohmann::json& rec = r.records[i];
    EXPECT_EQ(t.iter, rec["iter"].get<int64_t>());
    ASSERT_EQ(t.layers.size(), 6u);
    for (size_t l = 0; l < 6; ++l) {
      // Per micro-batch, as the simulator's cost model counts.
      EXPECT_EQ(t.layers[l].fwd_s, rec["layer_forward_s"][l].get<double>() / 4);
      EXPECT_EQ(t.layers[l].bwd_s, rec["layer_backward_s"][l].get<double>() / 4);
      EXPECT_GT(t.layers[l].fwd_s, 0);
      EXPECT_EQ(t.layers[l].mem_bytes, rec["layer_memory_bytes"][l].get<int64_t>());
    }
  }
  const char* dir = std::getenv("DYNMO_BIN_DIR");
  const std::string command =
      absl::StrCat(dir ? dir : ".", "/dynmo-sim --trace ", trace_path,
                   " --stages 2 --microbatches 4 --balancer time 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  ASSERT_EQ(status, 0) << output;
  const nlohmann::json summary = nlohmann::json::parse(output);
  EXPECT_EQ(summary["layers"], 6);
  EXPECT_EQ(summary["iterations"], 4);
  EXPECT_GT(summary["static_total_s"].get<double>(), 0);
}

TEST(DynmoTrainReportsTest, WithoutPerLayerClocksTrainingIsUnchanged) {
  JobResult clocked = RunJob(2, TinyModel({"--pp=2"}));
  JobResult unclocked = RunJob(2, TinyModel({"--pp=2", "--profile_layers=false"}));
  ASSERT_TRUE(clocked.ok()) << clocked.AllLogs();
  ASSERT_TRUE(unclocked.ok()) << unclocked.AllLogs();
  EXPECT_EQ(unclocked.losses, clocked.losses);
  // Stage passes are still timed, and spread evenly over the stage's layers.
  const nlohmann::json& rec = unclocked.records.back();
  const auto fwd = rec["layer_forward_s"].get<std::vector<double>>();
  const auto stages = rec["stage_times"].get<std::vector<double>>();
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_GT(stages[0], 0);
  EXPECT_GT(stages[1], 0);
  EXPECT_EQ(fwd[0], fwd[1]);
  EXPECT_EQ(fwd[0], fwd[2]);
  EXPECT_EQ(fwd[3], fwd[5]);
}

}  // namespace
}  // namespace dynmo::trainer
