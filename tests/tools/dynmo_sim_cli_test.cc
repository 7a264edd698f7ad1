// Runs the built dynmo-sim binary (found through DYNMO_BIN_DIR, which ctest
// sets) and checks its documented contract: JSON on stdout, and for every
// usage or input error exactly one line on stderr and exit status 2.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Json = nlohmann::json;

struct Outcome {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string TempPath(const std::string& name) {
  // ctest runs each test as its own process in parallel: keep files apart.
  return ::testing::TempDir() + "/dynmo_sim_cli_" + std::to_string(getpid()) +
         "_" + name;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteAll(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class DynmoSimCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* dir = std::getenv("DYNMO_BIN_DIR");
    if (dir == nullptr) GTEST_SKIP() << "DYNMO_BIN_DIR is not set (run ctest)";
    binary_ = std::string(dir) + "/dynmo-sim";
  }

  Outcome Sim(const std::string& args) {
    const std::string err_path = TempPath("stderr.txt");
    const std::string command = binary_ + " " + args + " 2>" + err_path;
    Outcome run;
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return run;
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) {
      run.out.append(buffer, n);
    }
    const int status = pclose(pipe);
    run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    run.err = ReadAll(err_path);
    return run;
  }

  // The error contract: status 2, nothing on stdout, one line on stderr.
  void ExpectUsageError(const std::string& args, const std::string& needle) {
    Outcome run = Sim(args);
    EXPECT_EQ(run.exit_code, 2) << args << "\nstderr: " << run.err;
    EXPECT_EQ(run.out, "") << args;
    EXPECT_THAT(run.err, StartsWith("dynmo-sim: ")) << args;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1)
        << args << "\nstderr: " << run.err;
    EXPECT_THAT(run.err, HasSubstr(needle)) << args;
  }

  Json SimJson(const std::string& args) {
    Outcome run = Sim(args);
    EXPECT_EQ(run.exit_code, 0) << args << "\nstderr: " << run.err;
    return Json::parse(run.out, nullptr, /*allow_exceptions=*/false);
  }

  std::string binary_;
};

TEST_F(DynmoSimCliTest, EqualStagesMatchTheClosedForms) {
  Json one = SimJson(
      "--schedule 1f1b --microbatches 8 --stages 4 --fwd 1 --bwd 1 --wgrad 1");
  ASSERT_TRUE(one.is_object());
  EXPECT_DOUBLE_EQ(one["iteration_time"].get<double>(), 33.0);  // (m+p-1)*3
  EXPECT_NEAR(one["bubble_ratio"].get<double>(), 3.0 / 11.0, 1e-12);
  ASSERT_EQ(one["stage_idle"].size(), 4u);
  EXPECT_DOUBLE_EQ(one["stage_idle"][0].get<double>(), 9.0);

  Json zb = SimJson(
      "--schedule zb-h1 --microbatches 8 --stages 4 --fwd 1 --bwd 1 --wgrad 1");
  EXPECT_DOUBLE_EQ(zb["iteration_time"].get<double>(), 27.0);  // 8*3 + 3*1
}

TEST_F(DynmoSimCliTest, PerStageTimesAndCommAreAccepted) {
  Json j = SimJson(
      "--schedule gpipe --microbatches 4 --stage-times 1:1:1,2:2:2 --comm 0.5");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["stage_idle"].size(), 2u);
  EXPECT_GT(j["iteration_time"].get<double>(), 4 * 6.0);
}

TEST_F(DynmoSimCliTest, SvgFlagWritesAGanttChart) {
  const std::string svg = TempPath("gantt.svg");
  std::remove(svg.c_str());
  Outcome run =
      Sim("--schedule 1f1b --microbatches 4 --stages 2 --fwd 1 --bwd 2 "
          "--wgrad 1 --svg " +
          svg);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(ReadAll(svg), HasSubstr("<svg"));
  EXPECT_THAT(run.out, HasSubstr("\"iteration_time\""));
}

TEST_F(DynmoSimCliTest, HelpExitsZero) {
  Outcome run = Sim("--help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_THAT(run.out, HasSubstr("usage: dynmo-sim"));
}

TEST_F(DynmoSimCliTest, SimulationUsageErrorsExitTwo) {
  ExpectUsageError("", "--schedule is required");
  ExpectUsageError(
      "--schedule 2f2b --microbatches 4 --stages 2 --fwd 1 "
      "--bwd 1 --wgrad 1",
      "2f2b");
  ExpectUsageError("--schedule 1f1b --stages 2 --fwd 1 --bwd 1 --wgrad 1",
                   "--microbatches is required");
  ExpectUsageError("--schedule 1f1b --microbatches 4 --fwd 1 --bwd 1 --wgrad 1",
                   "--stages is required");
  ExpectUsageError(
      "--schedule 1f1b --microbatches 4 --stages 0 --fwd 1 "
      "--bwd 1 --wgrad 1",
      "--stages must be >= 1");
  ExpectUsageError(
      "--schedule 1f1b --microbatches 0 --stages 2 --fwd 1 "
      "--bwd 1 --wgrad 1",
      "--microbatches must be >= 1");
  ExpectUsageError(
      "--schedule 1f1b --microbatches 4 --stages 2 --fwd -1 "
      "--bwd 1 --wgrad 1",
      "--fwd must be >= 0");
  ExpectUsageError(
      "--schedule 1f1b --microbatches 4 --stages 2 --fwd nan "
      "--bwd 1 --wgrad 1",
      "--fwd");
  ExpectUsageError("--schedule 1f1b --microbatches 4 --stage-times 1:1,2:2:2",
                   "stage 0");
  ExpectUsageError(
      "--schedule 1f1b --microbatches 4 --stage-times 1:1:1,2:-2:2", "stage 1");
  ExpectUsageError(
      "--schedule 1f1b --microbatches 4 --stage-times 1:1:1 "
      "--stages 1",
      "not both");
  ExpectUsageError(
      "--schedule 1f1b --microbatches 4 --stages 2 --fwd 1 "
      "--bwd 1 --wgrad 1 --frobnicate 3",
      "unknown flag --frobnicate");
  ExpectUsageError(
      "--schedule 1f1b --microbatches 4 --stages 2 --fwd 1 "
      "--bwd 1 --wgrad 1 --trigger every:2",
      "--trigger only applies");
  ExpectUsageError(
      "--schedule 1f1b --microbatches 4 --stages 2 --fwd 1 "
      "--bwd 1 --wgrad 1 stray",
      "unexpected argument 'stray'");
}

TEST_F(DynmoSimCliTest, ScenarioReplayPrintsTheSummary) {
  Json j = SimJson(
      "--scenario early-exit --stages 4 --layers 16 "
      "--iterations 30 --seed 3 --trigger every:10");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["source"], "scenario:early-exit");
  EXPECT_EQ(j["layers"], 16);
  EXPECT_EQ(j["iterations"], 30);
  EXPECT_EQ(j["decisions"], 2);  // after iterations 9 and 19
  for (const char* key :
       {"static_total_s", "dynamic_total_s", "speedup", "rebalances",
        "moved_bytes", "migration_s", "final_boundaries"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_TRUE(j["mean_imbalance"].contains("static"));
  EXPECT_TRUE(j["mean_bubble_ratio"].contains("dynamic"));
  EXPECT_EQ(j["final_boundaries"].size(), 5u);
}

TEST_F(DynmoSimCliTest, WrittenTraceReplaysToTheSameNumbers) {
  const std::string trace = TempPath("freezing.jsonl");
  Json generated = SimJson(
      "--scenario freezing --stages 3 --layers 12 "
      "--iterations 40 --write-trace " +
      trace);
  Json replayed = SimJson("--trace " + trace + " --stages 3");
  ASSERT_TRUE(generated.is_object() && replayed.is_object());
  EXPECT_EQ(replayed["source"], "trace:" + trace);
  for (const char* key : {"static_total_s", "dynamic_total_s", "rebalances",
                          "moved_bytes", "final_boundaries"}) {
    EXPECT_EQ(replayed[key], generated[key]) << key;
  }
}

TEST_F(DynmoSimCliTest, LayersStretchesARecordedTraceByDepth) {
  const std::string trace = TempPath("small.jsonl");
  SimJson("--scenario early-exit --stages 2 --layers 10 --iterations 30 "
          "--write-trace " + trace);
  Json stretched = SimJson("--trace " + trace + " --stages 24 --layers 48");
  ASSERT_TRUE(stretched.is_object());
  EXPECT_EQ(stretched["layers"], 48);
  EXPECT_EQ(stretched["final_boundaries"].size(), 25u);
  EXPECT_EQ(stretched["final_boundaries"].back(), 48);
  ExpectUsageError("--trace " + trace + " --stages 2 --layers 2", "--layers:");
}

TEST_F(DynmoSimCliTest, ReplayUsageAndInputErrorsExitTwo) {
  const std::string bad_json = TempPath("bad.jsonl");
  WriteAll(bad_json,
           "{\"iter\":0,\"layers\":[{\"fwd\":1,\"bwd\":1,\"wgrad\":1}]}\n"
           "{\"iter\":1,\"layers\":[{\"fwd\":1,\n");
  ExpectUsageError("--trace " + bad_json + " --stages 1", "line 2");
  const std::string negative = TempPath("negative.jsonl");
  WriteAll(negative,
           "{\"iter\":0,\"layers\":[{\"fwd\":1,\"bwd\":-1,\"wgrad\":1}]}\n");
  ExpectUsageError("--trace " + negative + " --stages 1", "line 1");
  ExpectUsageError("--trace " + TempPath("missing.jsonl") + " --stages 1",
                   "cannot read");
  ExpectUsageError("--scenario moe", "--stages is required");
  ExpectUsageError("--scenario moe --stages 0", "--stages must be >= 1");
  ExpectUsageError("--scenario dropout --stages 2", "unknown scenario");
  ExpectUsageError("--scenario moe --stages 2 --trace " + negative,
                   "exactly one of");
  ExpectUsageError("--scenario moe --stages 2 --fwd 1", "--fwd does not apply");
  ExpectUsageError("--trace " + negative + " --stages 1 --seed 4",
                   "--seed only applies with --scenario");
  ExpectUsageError("--scenario moe --stages 2 --trigger sometimes",
                   "unknown trigger");
  ExpectUsageError("--scenario moe --stages 2 --balancer fastest", "fastest");
  ExpectUsageError("--scenario moe --stages 2 --schedule 3f", "3f");
  ExpectUsageError("--scenario moe --stages 9 --layers 8", "9 stages");
  ExpectUsageError("--scenario moe --stages 2 --bandwidth -5",
                   "--bandwidth must be >= 0");
  ExpectUsageError("--scenario moe --stages 2 --seed -1", "--seed");
  ExpectUsageError("--scenario moe --stages 2 --iterations 0",
                   "--iterations must be >= 1");
}

// The replay decides with the coordinator's own job machine, under the
// coordinator's default trigger (auto), and is never slower than static with
// defaults: the six cases at 48 layers on 24 stages, in whole blocks and in
// halves (issue 24), and never beyond the re-partition ceiling (--oracle).
TEST_F(DynmoSimCliTest, DefaultsAreTheCoordinatorsAndNeverSlowerThanStatic) {
  for (const char* units : {"blocks", "halves"}) {
    for (const char* scenario : {"pruning", "freezing", "sparse-attention", "early-exit",
                                 "moe", "mod"}) {
      SCOPED_TRACE(std::string(scenario) + " " + units);
      Json j = SimJson(std::string("--scenario ") + scenario +
                       " --stages 24 --layers 48 --bandwidth 25e9 --oracle --units " + units);
      ASSERT_TRUE(j.is_object());
      EXPECT_EQ(j["engine"], "coordinator");
      EXPECT_EQ(j["trigger"], "auto");
      EXPECT_EQ(j["elastic"], "none");
      EXPECT_GE(j["speedup"].get<double>(), 1.0);
      EXPECT_LE(j["speedup"].get<double>(), j["oracle"]["speedup"].get<double>() + 1e-9);
      for (const Json& plan : j["plans"]) {
        EXPECT_EQ(plan["apply_iteration"].get<int>(),
                  plan["decided_iteration"].get<int>() + j["plan_lead_iterations"].get<int>());
      }
    }
  }
}

TEST_F(DynmoSimCliTest, ElasticModesCountGpuHours) {
  Json release = SimJson(
      "--scenario freezing --stages 8 --layers 16 --dp 2 --elastic release "
      "--repack-tolerance 0.05 --bandwidth 25e9");
  ASSERT_TRUE(release.is_object());
  EXPECT_EQ(release["dp"], 2);
  EXPECT_LT(release["gpu_hours"]["dynamic"].get<double>(),
            release["gpu_hours"]["static"].get<double>());
  EXPECT_NE(release["final_grid"], "8x2") << "stages were released";
  bool repacked = false;
  for (const Json& plan : release["plans"]) {
    repacked = repacked || plan["reason"].get<std::string>().find("repack") != std::string::npos;
  }
  EXPECT_TRUE(repacked);
  Json reshape = SimJson(
      "--scenario pruning --stages 8 --layers 16 --dp 2 --elastic reshape --bandwidth 25e9");
  ASSERT_TRUE(reshape.is_object());
  EXPECT_EQ(reshape["elastic"], "reshape");
  EXPECT_TRUE(reshape.contains("final_grid"));
}

// --oracle prints the ceilings of coordinator/job/replay_bounds.h: the
// oracle delayed by the plan lead, and the bound of the elastic mode asked.
TEST_F(DynmoSimCliTest, TheOraclePrintsTheCeilingsOfTheModeAsked) {
  const std::string common =
      "--scenario pruning --stages 8 --layers 16 --dp 2 --bandwidth 25e9 --oracle";
  Json release = SimJson(common + " --elastic release");
  ASSERT_TRUE(release.is_object());
  const Json& o = release["oracle"];
  EXPECT_EQ(o["delayed"]["lead_iterations"], release["plan_lead_iterations"]);
  EXPECT_LE(o["delayed"]["speedup"].get<double>(), o["speedup"].get<double>() + 1e-9);
  ASSERT_TRUE(o.contains("release"));
  EXPECT_FALSE(o.contains("reshape"));
  EXPECT_LE(o["release"]["min_gpu_hours"].get<double>(),
            release["gpu_hours"]["static"].get<double>());
  Json reshape = SimJson(common + " --elastic reshape");
  ASSERT_TRUE(reshape.is_object());
  ASSERT_TRUE(reshape["oracle"].contains("reshape"));
  EXPECT_GE(reshape["oracle"]["reshape"]["speedup"].get<double>(),
            reshape["speedup"].get<double>() - 1e-9);
  EXPECT_GE(reshape["oracle"]["reshape"]["last_tenth_speedup"].get<double>(),
            reshape["last_tenth_speedup"].get<double>() - 1e-9);
}

// A re-shape copies terabytes: MoE's routing noise and its transient hot
// experts must not buy one (at 24 x 30 one cost 3.6% and 3.1%: a re-shape
// chased noise, then a ten-iteration spike).
TEST_F(DynmoSimCliTest, AReshapeDoesNotChaseNoiseOrATransient) {
  for (const char* units : {"blocks", "halves"}) {
    SCOPED_TRACE(units);
    Json j = SimJson(std::string("--scenario moe --stages 24 --dp 30 --layers 48 --units ") +
                     units + " --bandwidth 25e9 --capacity 4026531840 --elastic reshape");
    ASSERT_TRUE(j.is_object());
    EXPECT_GE(j["speedup"].get<double>(), 1.0);
  }
}

TEST_F(DynmoSimCliTest, OnChangeIsTheTraceOnlyReplay) {
  Json j = SimJson("--scenario moe --stages 4 --layers 16 --iterations 30 --trigger on-change");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["engine"], "trace");
  ExpectUsageError("--scenario moe --stages 4 --trigger on-change --dp 2",
                   "coordinator's triggers");
  ExpectUsageError("--scenario moe --stages 4 --elastic sideways", "--elastic wants");
  ExpectUsageError("--scenario moe --stages 4 --repack-tolerance 0.1",
                   "--repack-tolerance needs --elastic");
  ExpectUsageError("--scenario moe --stages 4 --units thirds", "--units wants");
  ExpectUsageError("--scenario moe --stages 4 --dp 0", "--dp must be >= 1");
  ExpectUsageError("--scenario moe --stages 4 --oracle=yes", "oracle");
}

}  // namespace
