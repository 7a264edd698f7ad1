// dynmo-plan end to end: the documented JSON contract, and exit status 2 with
// one clear stderr line for every kind of bad input.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "nlohmann/json.hpp"

namespace {

struct PlanRun {
  int status = -1;
  std::string out, err;
};

std::string BinDir() {
  const char* d = std::getenv("DYNMO_BIN_DIR");
  return d ? d : "build/bin";
}

// Runs dynmo-plan with `args`, feeding `input` on stdin.
PlanRun Plan(const std::string& args, const std::string& input) {
  // ctest runs each test as its own process in parallel: keep files apart.
  const std::string dir =
      ::testing::TempDir() + "/dynmo_plan_cli_" + std::to_string(getpid());
  const std::string in = dir + "_in.json", err = dir + "_err.txt";
  std::ofstream(in) << input;
  const std::string cmd = BinDir() + "/dynmo-plan " + args + " < " + in +
                          " 2> " + err;
  PlanRun r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  return r;
}

constexpr char kProblem[] = R"({"stages":2,
  "layers":[{"time":1,"params":10,"mem_bytes":5},{"time":1,"params":10,"mem_bytes":5},
            {"time":1,"params":10,"mem_bytes":5},{"time":3,"params":30,"mem_bytes":5}],
  "current":[0,1,4]})";

TEST(DynmoPlanCli, OptimalPrintsTheDocumentedFields) {
  PlanRun r = Plan("--method optimal", kProblem);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["method"], "optimal");
  EXPECT_EQ(j["boundaries"], nlohmann::json::parse("[0,3,4]"));
  EXPECT_EQ(j["loads"], nlohmann::json::parse("[3.0,3.0]"));
  EXPECT_EQ(j["bottleneck"], 3.0);
  EXPECT_EQ(j["imbalance"], 0.0);
  ASSERT_EQ(j["migrations"].size(), 2u);
  EXPECT_EQ(j["migrations"][0]["from"], 1);
  EXPECT_EQ(j["migrations"][0]["to"], 0);
  EXPECT_EQ(j["moved_bytes"], 10);
}

TEST(DynmoPlanCli, EveryMethodRuns) {
  for (const char* m : {"uniform", "parameters", "time", "optimal", "diffusion"}) {
    PlanRun r = Plan(std::string("--method ") + m, kProblem);
    ASSERT_EQ(r.status, 0) << m << ": " << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["method"], m);
    EXPECT_EQ(j["boundaries"].size(), 3u);
  }
}

TEST(DynmoPlanCli, RepackNamesActiveAndReleasedStages) {
  PlanRun r = Plan("--method optimal --repack",
               R"({"stages":4,"layers":[{"time":1},{"time":1},{"time":4}]})");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["active_stages"].size(), 2u);
  EXPECT_EQ(j["released_stages"].size(), 2u);
  EXPECT_EQ(j["bottleneck"], 4.0);
  EXPECT_EQ(j["comm_split"].size(), 4u);
}

TEST(DynmoPlanCli, FirstFitBaselineRuns) {
  PlanRun r = Plan("--repack --repack-method first-fit --target-stages 1",
               R"({"stages":2,"layers":[{"time":1,"mem_bytes":1},{"time":1,"mem_bytes":1}]})");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["active_stages"], nlohmann::json::parse("[1]"));
  EXPECT_EQ(j["contiguous"], true);
}

TEST(DynmoPlanCli, ReadsAProblemFile) {
  const std::string path = ::testing::TempDir() + "/problem_file_" +
                           std::to_string(getpid()) + ".json";
  std::ofstream(path) << kProblem;
  PlanRun r = Plan("--method time " + path, "");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["boundaries"], nlohmann::json::parse("[0,3,4]"));
}

// kProblem's 4 layers read as embedding, two blocks and head.
TEST(DynmoPlanCli, WritesTheDecidedSplitInEveryLayoutFormat) {
  PlanRun r = Plan("--layout-format torchtitan,megatron,deepspeed", kProblem);
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["boundaries"], nlohmann::json::parse("[0,3,4]"));
  EXPECT_EQ(j["module_fqns_per_model_part"], nlohmann::json::parse(
      R"([["tok_embeddings","layers.0","layers.1"],["norm","output"]])"));
  EXPECT_EQ(j["pipeline_model_parallel_layout"], "Et*2|L");
  EXPECT_EQ(j["parts"], nlohmann::json::parse("[0,3,4]"));
  PlanRun plain = Plan("", kProblem);
  EXPECT_FALSE(nlohmann::json::parse(plain.out).contains("parts"));
}

TEST(DynmoPlanCli, CurrentInAnyFormatPlansTheSameMigrations) {
  // kProblem's own "current" is [0,1,4]; --current replaces it.
  PlanRun want = Plan("", kProblem);
  ASSERT_EQ(want.status, 0) << want.err;
  for (const char* current :
       {"0,1,4", "'E|t*2,L'", "'[0,1,4]'",
        R"('[["tok_embeddings"],["layers.0","layers.1","norm","output"]]')"}) {
    PlanRun r = Plan(std::string("--current ") + current,
                     R"({"stages":2,
  "layers":[{"time":1,"params":10,"mem_bytes":5},{"time":1,"params":10,"mem_bytes":5},
            {"time":1,"params":10,"mem_bytes":5},{"time":3,"params":30,"mem_bytes":5}],
  "current":[0,2,4]})");
    ASSERT_EQ(r.status, 0) << current << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse(want.out)) << current;
  }
}

struct BadCase {
  const char* name;
  const char* args;
  const char* input;
  const char* expect_in_stderr;
};

TEST(DynmoPlanCli, BadInputExitsTwoWithOneClearLine) {
  const BadCase cases[] = {
      {"bad json", "", "{\"stages\":", "not valid JSON"},
      {"negative time", "", R"({"stages":1,"layers":[{"time":-1}]})", "layer 0"},
      {"zero stages", "", R"({"stages":0,"layers":[{"time":1}]})", "stages"},
      {"more stages than layers", "", R"({"stages":3,"layers":[{"time":1}]})", "more stages"},
      {"infeasible caps", "",
       R"({"stages":1,"layers":[{"time":1,"mem_bytes":10}],"capacity_bytes":[5]})",
       "memory caps"},
      {"unknown flag", "--frobnicate", R"({"stages":1,"layers":[{"time":1}]})", "unknown flag"},
      {"unknown method", "--method greedy", R"({"stages":1,"layers":[{"time":1}]})", "greedy"},
      {"bad current", "", R"({"stages":2,"layers":[{"time":1},{"time":1}],"current":[0,2,2]})",
       "current"},
      {"wrong speed count", "", R"({"stages":2,"layers":[{"time":1},{"time":1}],"speed":[1]})",
       "speed"},
      {"zero speed", "", R"({"stages":1,"layers":[{"time":1}],"speed":[0]})", "stage 0"},
      {"both time forms", "", R"({"stages":1,"layers":[{"time":1,"fwd":1}]})", "exactly one"},
      {"missing file", "/nonexistent/problem.json", "", "cannot read"},
      {"tolerance without repack", "--tolerance 0.1", R"({"stages":1,"layers":[{"time":1}]})",
       "--repack"},
      {"megatron mtp", "--current 'Et|m|L'", kProblem, "MTP layers ('m')"},
      {"megatron malformed", "--current 'Et*|L'", kProblem, "no repeat count"},
      {"megatron stage count", "--current 'E|t|t|L'", kProblem, "has 4 stages; the model has 2"},
      {"torchtitan unknown module", R"(--current '[["tok_embeddings","layers.0"],["blocks.1","norm","output"]]')",
       kProblem, "unknown module 'blocks.1'"},
      {"torchtitan layer twice", R"(--current '[["tok_embeddings","layers.0"],["layers.0","layers.1","norm","output"]]')",
       kProblem, "'layers.0' is in model parts 0 and 1"},
      {"torchtitan not contiguous", R"(--current '[["tok_embeddings","layers.1"],["layers.0","norm","output"]]')",
       kProblem, "not contiguous"},
      {"deepspeed parts", "--current '{\"parts\":[0,4]}'", kProblem, "2 stages need 3"},
      {"problem current in megatron", "",
       R"({"stages":2,"layers":[{"time":1},{"time":1}],"current":"E|t|L"})", "\"current\": Megatron"},
      {"unknown layout format", "--layout-format megatron,pipedream", kProblem, "'pipedream'"},
      {"layout format twice", "--layout-format megatron,megatron", kProblem, "twice"},
      {"layout of first-fit", "--repack --repack-method first-fit --layout-format deepspeed",
       kProblem, "first-fit gives layer owners"},
  };
  for (const BadCase& c : cases) {
    PlanRun r = Plan(c.args, c.input);
    EXPECT_EQ(r.status, 2) << c.name;
    EXPECT_TRUE(r.out.empty()) << c.name;
    EXPECT_NE(r.err.find(c.expect_in_stderr), std::string::npos)
        << c.name << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.name << ": " << r.err;
  }
}

}  // namespace
