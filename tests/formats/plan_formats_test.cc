// Plan formats: DynMo's boundaries as torchtitan FQN lists, Megatron layout
// strings and DeepSpeed parts, both ways, and one clear error for every split
// that has no boundaries.
#include "formats/plan_formats.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dynmo::formats {
namespace {

using nlohmann::json;

constexpr PlanFormat kAll[] = {PlanFormat::kBoundaries, PlanFormat::kTorchtitan,
                               PlanFormat::kMegatron, PlanFormat::kDeepSpeed};

json Written(PlanFormat f, const core::Boundaries& b) {
  absl::StatusOr<json> j = WriteSplit(f, b);
  EXPECT_TRUE(j.ok()) << j.status();
  return j.ok() ? *j : json();
}

// Expects `read` to fail with INVALID_ARGUMENT naming `needle`, on one line.
void ExpectRefused(const absl::StatusOr<core::Boundaries>& read,
                   const std::string& needle, const std::string& input) {
  ASSERT_FALSE(read.ok()) << input;
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << input;
  EXPECT_NE(read.status().message().find(needle), std::string::npos)
      << input << " -> " << read.status();
  EXPECT_EQ(read.status().message().find('\n'), std::string::npos) << input;
}

TEST(WriteSplit, TorchtitanNamesEmbeddingBlocksAndHead) {
  // 6 layers: embedding, blocks layers.0..layers.3, norm + output.
  EXPECT_EQ(Written(PlanFormat::kTorchtitan, {0, 3, 6}), json::parse(R"([
      ["tok_embeddings", "layers.0", "layers.1"],
      ["layers.2", "layers.3", "norm", "output"]])"));
  EXPECT_EQ(Written(PlanFormat::kTorchtitan, {0, 1, 2}),
            json::parse(R"([["tok_embeddings"], ["norm", "output"]])"));
}

TEST(WriteSplit, MegatronWritesMegatronsOwnExample) {
  // Megatron's documented "Et*3|t*3|t*2,L": 8 blocks over 3 stages.
  EXPECT_EQ(Written(PlanFormat::kMegatron, {0, 4, 7, 10}), "Et*3|t*3|t*2,L");
  EXPECT_EQ(Written(PlanFormat::kMegatron, {0, 1, 2, 3}), "E|t|L");
  EXPECT_EQ(Written(PlanFormat::kMegatron, {0, 2}), "EL");
}

TEST(WriteSplit, DeepSpeedPartsAreTheBoundaries) {
  EXPECT_EQ(Written(PlanFormat::kDeepSpeed, {0, 4, 7, 10}), json::parse("[0,4,7,10]"));
}

TEST(WriteSplit, RefusesBadBoundariesAndModelsWithoutEmbeddingAndHead) {
  for (PlanFormat f : kAll) {
    for (const core::Boundaries& b :
         {core::Boundaries{}, core::Boundaries{0}, core::Boundaries{0, 2, 2},
          core::Boundaries{1, 3}}) {
      EXPECT_FALSE(WriteSplit(f, b).ok()) << PlanFormatName(f);
    }
  }
  for (PlanFormat f : {PlanFormat::kTorchtitan, PlanFormat::kMegatron}) {
    absl::StatusOr<json> j = WriteSplit(f, {0, 1});
    ASSERT_FALSE(j.ok());
    EXPECT_NE(j.status().message().find("at least 2 layers"), std::string::npos);
  }
}

// Calls `f` with every split of `layers` layers into 1..layers stages.
void ForEverySplit(int layers, const std::function<void(const core::Boundaries&)>& f) {
  for (int mask = 0; mask < (1 << (layers - 1)); ++mask) {
    core::Boundaries b = {0};
    for (int cut = 1; cut < layers; ++cut) {
      if (mask & (1 << (cut - 1))) b.push_back(cut);
    }
    b.push_back(layers);
    f(b);
  }
}

TEST(ReadSplit, EveryFormatRoundTripsEverySplit) {
  for (int layers = 2; layers <= 8; ++layers) {
    ForEverySplit(layers, [&](const core::Boundaries& b) {
      const int stages = static_cast<int>(b.size()) - 1;
      for (PlanFormat f : kAll) {
        const json written = Written(f, b);
        for (SplitShape shape : {SplitShape{}, SplitShape{layers, stages}}) {
          absl::StatusOr<core::Boundaries> read = ReadSplit(f, written, shape);
          ASSERT_TRUE(read.ok()) << written << ": " << read.status();
          EXPECT_EQ(*read, b) << written;
          absl::StatusOr<core::Boundaries> any = ReadAnySplit(written, shape);
          ASSERT_TRUE(any.ok()) << written << ": " << any.status();
          EXPECT_EQ(*any, b) << written;
        }
      }
    });
  }
}

TEST(ReadSplit, TorchtitanIgnoresOrderWithinAModelPart) {
  auto b = ReadSplit(PlanFormat::kTorchtitan, json::parse(R"([
      ["layers.0", "tok_embeddings"], ["output", "layers.2", "norm", "layers.1"]])"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, (core::Boundaries{0, 2, 5}));
}

TEST(ReadSplit, TorchtitanRefusesEverySplitWithoutBoundaries) {
  const SplitShape shape{6, 2};  // embedding, layers.0..layers.3, head
  const std::pair<const char*, const char*> cases[] = {
      {R"({"a":1})", "non-empty list of model parts"},
      {R"([])", "non-empty list of model parts"},
      {R"([["tok_embeddings","layers.0","layers.1","layers.2","layers.3","norm","output"]])",
       "1 model parts; the model has 2 stages"},
      {R"([["tok_embeddings","layers.0","layers.1"],"layers.2"])", "model part 1 must be a list"},
      {R"([["tok_embeddings","layers.0","layers.1"],[]])", "model part 1 is empty"},
      {R"([["tok_embeddings",7],["layers.2"]])", "7, not a module FQN"},
      {R"([["tok_embedding","layers.0","layers.1"],["layers.2","layers.3","norm","output"]])",
       "unknown module 'tok_embedding' in model part 0"},
      {R"([["tok_embeddings","layers.x"],["layers.2","layers.3","norm","output"]])",
       "unknown module 'layers.x'"},
      {R"([["tok_embeddings","layers.-1"],["norm","output"]])", "unknown module 'layers.-1'"},
      {R"([["tok_embeddings","layers.0\n"],["norm","output"]])", "unknown module 'layers.0\\n'"},
      {R"([["tok_embeddings","layers.0","layers.1"],["layers.2","layers.4","norm","output"]])",
       "'layers.4' is beyond the model's 4 blocks (layers.0..layers.3)"},
      {R"([["tok_embeddings","layers.0","layers.0"],["layers.2","layers.3","norm","output"]])",
       "'layers.0' appears twice in model part 0"},
      {R"([["tok_embeddings","layers.0","layers.1"],["layers.1","layers.2","layers.3","norm","output"]])",
       "'layers.1' is in model parts 0 and 1"},
      {R"([["tok_embeddings","layers.0"],["layers.2","layers.3","norm","output"]])",
       "'layers.1' is in no model part"},
      {R"([["tok_embeddings","layers.0","layers.1"],["layers.2","layers.3","norm"]])",
       "'output' is in no model part"},
      {R"([["tok_embeddings","layers.0","layers.1","norm"],["layers.2","layers.3","output"]])",
       "'norm' (model part 0) and 'output' (model part 1) must share a model part"},
      {R"([["tok_embeddings","layers.0","layers.2"],["layers.1","layers.3","norm","output"]])",
       "model part 0 is not contiguous: it holds 'tok_embeddings' and 'layers.2' but not "
       "'layers.1'"},
      {R"([["layers.2","layers.3","norm","output"],["tok_embeddings","layers.0","layers.1"]])",
       "model part 1 starts at 'tok_embeddings' but model part 0 ends at 'norm/output'"},
  };
  for (const auto& [text, needle] : cases) {
    ExpectRefused(ReadSplit(PlanFormat::kTorchtitan, json::parse(text), shape), needle, text);
  }
}

TEST(ReadSplit, MegatronExpandsRepeatsGroupsAndCosmeticCommas) {
  const std::pair<const char*, core::Boundaries> cases[] = {
      {"Et*3|t*3|t*2,L", {0, 4, 7, 10}},
      {"Et*3|(tt|)*2,t|L", {0, 4, 6, 8, 9, 10}},
      {"(Et|)*1t,t*0,L", {0, 2, 4}},
      {"  E|t*12|L\n", {0, 1, 13, 14}},
      {"E,t,t|t,t,L", {0, 3, 6}},
  };
  for (const auto& [layout, want] : cases) {
    auto b = ReadSplit(PlanFormat::kMegatron, json(layout));
    ASSERT_TRUE(b.ok()) << layout << ": " << b.status();
    EXPECT_EQ(*b, want) << layout;
  }
}

TEST(ReadSplit, MegatronRefusesMalformedLayoutsAndMtp) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "is empty"},
      {",", "is empty"},
      {"Et*|L", "'*' with no repeat count"},
      {"*3Et|L", "'*' that follows no layer letter"},
      {"Et*2*3|L", "'*' that follows no layer letter"},
      {"Et*99999999|L", "repeats more than"},
      {"E(t|)L", "write '(...)*N'"},
      {"E((t)*2)*2|L", "nests parentheses"},
      {"Et)*2|L", "')' with no '('"},
      {"E(t|L", "'(' with no ')'"},
      {"E()*2t|L", "empty '()'"},
      {"Ex|L", "has 'x', not a layer letter"},
      {"E t|L", "has ' ', not a layer letter"},
      {"Et\n|L", "has '\\n', not a layer letter"},
      {"Et||L", "leaves stage 1 empty"},
      {"Et|L|", "leaves stage 2 empty"},
      {"Et*3|(tt|)*2,m|L", "MTP layers ('m')"},
      {"tE|L", "must start with the embedding 'E'"},
      {"Et|Lt", "must end with the loss 'L'"},
      {"EEt|L", "names the embedding 'E' 2 times"},
      {"Et|t", "names the loss 'L' 0 times"},
  };
  for (const auto& [layout, needle] : cases) {
    ExpectRefused(ReadSplit(PlanFormat::kMegatron, json(layout)), needle, layout);
  }
  ExpectRefused(ReadSplit(PlanFormat::kMegatron, json(7)), "must be a string", "7");
}

TEST(ReadSplit, MegatronChecksStagesAndBlocksAgainstTheModel) {
  ExpectRefused(ReadSplit(PlanFormat::kMegatron, json("Et|t,L"), {4, 3}),
                "has 2 stages; the model has 3", "stages");
  ExpectRefused(ReadSplit(PlanFormat::kMegatron, json("Et|t,L"), {5, 2}),
                "has 2 transformer layers ('t'); the model has 3 blocks", "blocks");
}

TEST(ReadSplit, DeepSpeedPartsAreCheckedLikeBoundaries) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("0,2,4")", "must be an array of integers"},
      {"[0,1.5,4]", "must be integers"},
      {"[0,-1,4]", "must be integers"},
      {"[0]", "need at least 2 entries"},
      {"[0,2,2]", "leave stage 1 empty"},
      {"[1,2,4]", "must start at 0 and end at 4"},
      {"[0,2,5]", "must start at 0 and end at 4"},
      {"[0,1,2,4]", "2 stages need 3"},
  };
  for (const auto& [text, needle] : cases) {
    ExpectRefused(ReadSplit(PlanFormat::kDeepSpeed, json::parse(text), {4, 2}), needle, text);
  }
  absl::StatusOr<core::Boundaries> b = ReadSplit(PlanFormat::kDeepSpeed, json::parse("[0,2,2]"));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message().rfind("parts: ", 0), 0u) << b.status();
}

TEST(ReadAnySplit, TellsTheFormatByTheJsonType) {
  const SplitShape shape{4, 2};
  for (const char* text :
       {"[0,2,4]", R"("Et|t,L")", R"([["tok_embeddings","layers.0"],["layers.1","norm","output"]])",
        R"({"parts":[0,2,4]})", R"({"boundaries":[0,2,4]})",
        R"({"pipeline_model_parallel_layout":"Et|t,L"})",
        R"({"module_fqns_per_model_part":[["tok_embeddings","layers.0"],["layers.1","norm","output"]]})"}) {
    auto b = ReadAnySplit(json::parse(text), shape);
    ASSERT_TRUE(b.ok()) << text << ": " << b.status();
    EXPECT_EQ(*b, (core::Boundaries{0, 2, 4})) << text;
  }
  for (const char* text : {"7", "null", R"({"parts":[0,2,4],"boundaries":[0,2,4]})", "{}",
                           R"({"layout":"Et|t,L"})"}) {
    ExpectRefused(ReadAnySplit(json::parse(text), shape), "a split is", text);
  }
}

TEST(ReadSplitText, ReadsJsonCommaListsAndBareLayouts) {
  const SplitShape shape{6, 2};
  for (const char* text :
       {"0,3,6", " 0, 3, 6 ", "[0,3,6]", "Et*2|t*2,L", "\"Et*2|t*2,L\"",
        R"([["tok_embeddings","layers.0","layers.1"],["layers.2","layers.3","norm","output"]])"}) {
    auto b = ReadSplitText(text, shape);
    ASSERT_TRUE(b.ok()) << text << ": " << b.status();
    EXPECT_EQ(*b, (core::Boundaries{0, 3, 6})) << text;
  }
  ExpectRefused(ReadSplitText("", shape), "empty", "");
  ExpectRefused(ReadSplitText("[[\"tok_embeddings\"]", shape), "not valid JSON", "[[");
  ExpectRefused(ReadSplitText("0,,6", shape), "integers separated by commas", "0,,6");
  ExpectRefused(ReadSplitText("0,3", shape), "2 stages need 3", "0,3");
  ExpectRefused(ReadSplitText("Et*2|tt", shape), "Megatron layout", "Et*2|tt");
}

TEST(PlanFormatNames, ParseNamesAndKeys) {
  for (PlanFormat f : kAll) {
    absl::StatusOr<PlanFormat> parsed = ParsePlanFormat(PlanFormatName(f));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, f);
  }
  EXPECT_EQ(PlanFormatKey(PlanFormat::kTorchtitan), "module_fqns_per_model_part");
  EXPECT_EQ(PlanFormatKey(PlanFormat::kMegatron), "pipeline_model_parallel_layout");
  EXPECT_EQ(PlanFormatKey(PlanFormat::kDeepSpeed), "parts");
  absl::StatusOr<PlanFormat> bad = ParsePlanFormat("pipedream");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("torchtitan, megatron, deepspeed"), std::string::npos);
}

}  // namespace
}  // namespace dynmo::formats
