#include "formats/trace_json.h"

#include <string>

#include "core/scenario.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dynmo::formats {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kTwoRecords[] =
    R"({"iter":0,"layers":[{"fwd":0.01,"bwd":0.02,"wgrad":0.03,"mem_bytes":100},{"fwd":1,"bwd":2,"wgrad":3,"mem_bytes":200}]})"
    "\n"
    R"({"iter":10,"layers":[{"fwd":0.5,"bwd":0,"wgrad":0,"mem_bytes":50},{"fwd":1,"bwd":2,"wgrad":3}]})"
    "\n";

std::string ErrorOf(absl::string_view text) {
  absl::StatusOr<core::Trace> t = ParseTraceJsonl(text);
  EXPECT_FALSE(t.ok()) << text;
  return std::string(t.status().message());
}

TEST(TraceJsonTest, ParsesRecordsInOrder) {
  absl::StatusOr<core::Trace> t = ParseTraceJsonl(kTwoRecords);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].iter, 0);
  EXPECT_EQ((*t)[1].iter, 10);
  EXPECT_DOUBLE_EQ((*t)[0].layers[0].fwd_s, 0.01);
  EXPECT_DOUBLE_EQ((*t)[0].layers[0].bwd_s, 0.02);
  EXPECT_DOUBLE_EQ((*t)[0].layers[0].wgrad_s, 0.03);
  EXPECT_EQ((*t)[0].layers[1].mem_bytes, 200);
  EXPECT_EQ((*t)[1].layers[1].mem_bytes, 0);  // left out: 0
}

TEST(TraceJsonTest, RoundTripsAGeneratedTraceBitForBit) {
  core::ScenarioConfig c;
  c.scenario = core::Scenario::kPruning;
  c.layers = 12;
  c.iterations = 30;
  core::Trace original = *core::GenerateScenario(c);
  const std::string text = TraceToJsonl(original);
  absl::StatusOr<core::Trace> back = ParseTraceJsonl(text);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), original.size());
  for (size_t k = 0; k < original.size(); ++k) {
    EXPECT_EQ((*back)[k].iter, original[k].iter);
    for (size_t i = 0; i < original[k].layers.size(); ++i) {
      EXPECT_EQ((*back)[k].layers[i].fwd_s, original[k].layers[i].fwd_s);
      EXPECT_EQ((*back)[k].layers[i].bwd_s, original[k].layers[i].bwd_s);
      EXPECT_EQ((*back)[k].layers[i].wgrad_s, original[k].layers[i].wgrad_s);
      EXPECT_EQ((*back)[k].layers[i].mem_bytes,
                original[k].layers[i].mem_bytes);
    }
  }
  EXPECT_EQ(TraceToJsonl(*back), text);
}

TEST(TraceJsonTest, WritesOneRecordPerLineInTheDocumentedShape) {
  core::Trace t = {{3, {{0.5, 0.25, 0.125, 64}}}};
  EXPECT_EQ(
      TraceToJsonl(t),
      R"({"iter":3,"layers":[{"fwd":0.5,"bwd":0.25,"wgrad":0.125,"mem_bytes":64}]})"
      "\n");
}

TEST(TraceJsonTest, SkipsBlankLinesAndCarriageReturns) {
  std::string text = "\n\r\n";
  text += R"({"iter":1,"layers":[{"fwd":1,"bwd":1,"wgrad":1}]})";
  text += "\r\n\n";
  absl::StatusOr<core::Trace> t = ParseTraceJsonl(text);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 1u);
}

TEST(TraceJsonTest, BadJsonNamesItsLine) {
  std::string text = kTwoRecords;
  text += "{\"iter\":11,\"layers\":[{\"fwd\":1,\n";
  EXPECT_THAT(ErrorOf(text), StartsWith("line 3: invalid JSON"));
}

TEST(TraceJsonTest, ValidationErrorsNameTheirLine) {
  // Line 2 has a negative time.
  EXPECT_THAT(
      ErrorOf(R"({"iter":0,"layers":[{"fwd":1,"bwd":1,"wgrad":1}]})"
              "\n"
              R"({"iter":1,"layers":[{"fwd":-1,"bwd":1,"wgrad":1}]})"),
      AllOf(StartsWith("line 2: "), HasSubstr("negative or non-finite")));
  // Line 3 (after a blank line) repeats an iter.
  EXPECT_THAT(ErrorOf(R"({"iter":5,"layers":[{"fwd":1,"bwd":1,"wgrad":1}]})"
                      "\n\n"
                      R"({"iter":5,"layers":[{"fwd":1,"bwd":1,"wgrad":1}]})"),
              AllOf(StartsWith("line 3: "), HasSubstr("strictly increasing")));
  // Line 2 changes the layer count.
  EXPECT_THAT(ErrorOf(R"({"iter":0,"layers":[{"fwd":1,"bwd":1,"wgrad":1}]})"
                      "\n"
                      R"({"iter":1,"layers":[]})"),
              StartsWith("line 2: "));
}

TEST(TraceJsonTest, FieldErrorsAreSpecific) {
  EXPECT_THAT(ErrorOf(R"([1,2])"), HasSubstr("must be a JSON object"));
  EXPECT_THAT(ErrorOf(R"({"layers":[]})"), HasSubstr("no \"iter\""));
  EXPECT_THAT(ErrorOf(R"({"iter":1.5,"layers":[]})"),
              HasSubstr("must be an integer"));
  EXPECT_THAT(ErrorOf(R"({"iter":0})"), HasSubstr("\"layers\" array"));
  EXPECT_THAT(ErrorOf(R"({"iter":0,"layers":[{"fwd":1,"bwd":1}]})"),
              HasSubstr("layer 0 has no \"wgrad\""));
  EXPECT_THAT(ErrorOf(R"({"iter":0,"layers":[{"fwd":"1","bwd":1,"wgrad":1}]})"),
              HasSubstr("must be a number"));
  EXPECT_THAT(ErrorOf(R"({"iter":0,"layers":[{"fwd_s":1,"bwd":1,"wgrad":1}]})"),
              HasSubstr("unknown key \"fwd_s\""));
  EXPECT_THAT(ErrorOf(R"({"iter":0,"layers":[],"extra":1})"),
              HasSubstr("unknown key \"extra\""));
  EXPECT_THAT(
      ErrorOf(
          R"({"iter":0,"layers":[{"fwd":1,"bwd":1,"wgrad":1,"mem_bytes":-4}]})"),
      HasSubstr("negative mem_bytes"));
  EXPECT_THAT(
      ErrorOf(
          R"({"iter":0,"layers":[{"fwd":1,"bwd":1,"wgrad":1,"mem_bytes":2.5}]})"),
      HasSubstr("must be an integer"));
  EXPECT_THAT(ErrorOf(R"({"iter":0,"layers":[{"fwd":NaN,"bwd":1,"wgrad":1}]})"),
              HasSubstr("invalid JSON"));
  EXPECT_THAT(
      ErrorOf(R"({"iter":0,"layers":[{"fwd":1e999,"bwd":1,"wgrad":1}]})"),
      StartsWith("line 1: "));
}

TEST(TraceJsonTest, EmptyTextHasNoRecords) {
  EXPECT_THAT(ErrorOf(""), HasSubstr("no records"));
  EXPECT_THAT(ErrorOf("\n  \n"), HasSubstr("no records"));
}

}  // namespace
}  // namespace dynmo::formats
