// The dynmo-plan problem codec: every optional field, both time forms, and
// errors that name the field at fault.
#include "formats/problem_json.h"

#include <gtest/gtest.h>

namespace dynmo::formats {
namespace {

TEST(ParsePlanProblem, ReadsEveryField) {
  auto p = ParsePlanProblem(R"({"stages":2,
    "layers":[{"time":1.5,"params":7,"mem_bytes":9,"activation_bytes":3},
              {"fwd":1,"bwd":2,"wgrad":0.5}],
    "capacity_bytes":[100,200],"speed":[1,0.5],"inflight_microbatches":[2,1],
    "link":{"boundary_bytes":64,"bandwidth_bytes_per_s":32,"overlapped":false},
    "current":[0,1,2]})");
  ASSERT_TRUE(p.ok()) << p.status();
  const core::PipelineModel& m = p->model;
  ASSERT_EQ(m.layers.size(), 2u);
  EXPECT_EQ(m.layers[0].fwd_s, 1.5);
  EXPECT_EQ(m.layers[0].params, 7);
  EXPECT_EQ(m.layers[0].resident_bytes, 9);
  EXPECT_EQ(m.layers[0].activation_bytes, 3);
  EXPECT_EQ(m.layers[1].time_s(), 3.5);
  EXPECT_EQ(m.stages[1].capacity_bytes, 200);
  EXPECT_EQ(m.stages[1].speed, 0.5);
  EXPECT_EQ(m.stages[0].inflight_microbatches, 2);
  EXPECT_EQ(m.link.exposed_transfer_s(), 2.0);
  EXPECT_EQ(*p->current, (core::Boundaries{0, 1, 2}));
}

TEST(ParsePlanProblem, DefaultsAreUnboundedUnitSpeedNoCurrent) {
  auto p = ParsePlanProblem(R"({"stages":1,"layers":[{"time":1}]})");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->model.stages[0].capacity_bytes, -1);
  EXPECT_EQ(p->model.stages[0].speed, 1.0);
  EXPECT_FALSE(p->current.has_value());
}

TEST(ParsePlanProblem, ErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"[]", "object"},
      {R"({"layers":[{"time":1}]})", "stages"},
      {R"({"stages":1})", "layers"},
      {R"({"stages":1,"layers":[{"time":"fast"}]})", "layer 0"},
      {R"({"stages":1,"layers":[{"time":1,"params":1.5}]})", "integer"},
      {R"({"stages":1,"layers":[{}]})", "layer 0"},
      {R"({"stages":2,"layers":[{"time":1}],"capacity_bytes":[1]})", "capacity_bytes"},
      {R"({"stages":1,"layers":[{"time":1}],"capacity_bytes":[-1]})", "negative"},
      {R"({"stages":1,"layers":[{"time":1}],"link":{"overlapped":1}})", "overlapped"},
      {R"({"stages":1,"layers":[{"time":1}],"current":[0,0.5]})", "current"},
  };
  for (const auto& [text, needle] : cases) {
    auto p = ParsePlanProblem(text);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(needle), std::string::npos)
        << text << " -> " << p.status();
  }
}

TEST(ParsePlanProblem, CurrentMayBeGivenInAnotherTrainersFormat) {
  // 4 layers: embedding, two blocks, head; 2 stages.
  const std::string head = R"({"stages":2,"layers":[{"time":1},{"time":1},{"time":1},{"time":1}],)";
  for (const char* current :
       {R"("current":"Et|t,L")", R"("current":{"parts":[0,2,4]})",
        R"("current":[["tok_embeddings","layers.0"],["layers.1","norm","output"]])"}) {
    auto p = ParsePlanProblem(head + current + "}");
    ASSERT_TRUE(p.ok()) << current << ": " << p.status();
    EXPECT_EQ(*p->current, (core::Boundaries{0, 2, 4})) << current;
  }
  auto bad = ParsePlanProblem(head + R"("current":"Et|t|L"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "\"current\": Megatron layout \"Et|t|L\" has 3 stages; the model has 2");
}

}  // namespace
}  // namespace dynmo::formats
