#include "coordinator/job/rank_roster.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

class NamedSink : public SessionSink {
 public:
  explicit NamedSink(std::string host = "") : host_(std::move(host)) {}
  void SendTo(absl::Span<const int> /*ranks*/, std::shared_ptr<const dynmo::v1::CoordinatorMessage>) override {}
  void Close(const absl::Status&) override {}
  const std::string& host() const override { return host_; }

 private:
  std::string host_;
};

// 2 stages x 2 replicas; rank = stage + 2 * replica.
dynmo::v1::RegisterRequest Reg(int rank, int stage, int replica) {
  dynmo::v1::RegisterRequest r;
  r.set_job("job");
  r.set_rank(rank);
  r.set_pipeline_rank(stage);
  r.set_data_parallel_rank(replica);
  r.set_pipeline_size(2);
  r.set_data_parallel_size(2);
  r.set_num_layers(4);
  r.set_memory_capacity_bytes(1000 + rank);
  return r;
}

RankRoster Roster() { return RankRoster(JobShape{"job", 2, 2, 4, ""}); }

RankRoster AllRegistered() {
  RankRoster roster = Roster();
  for (int rank = 0; rank < 4; ++rank) roster.Register(Reg(rank, rank % 2, rank / 2));
  return roster;
}

TEST(RankRosterTest, RefusesAnotherShapeTakenCoordinatesAndAMovedRank) {
  RankRoster roster = Roster();
  dynmo::v1::RegisterRequest wrong = Reg(0, 0, 0);
  wrong.set_num_layers(8);
  EXPECT_EQ(roster.CheckRegister(wrong).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(roster.CheckRegister(Reg(0, 0, 0)).ok());
  roster.Register(Reg(0, 0, 0));
  EXPECT_EQ(roster.CheckRegister(Reg(1, 0, 0)).code(),
            absl::StatusCode::kFailedPrecondition)
      << "stage 0 replica 0 is rank 0";
  EXPECT_EQ(roster.CheckRegister(Reg(0, 1, 0)).code(),
            absl::StatusCode::kFailedPrecondition)
      << "rank 0 moved";
  EXPECT_TRUE(roster.CheckRegister(Reg(0, 0, 0)).ok()) << "re-registration";
}

TEST(RankRosterTest, SessionsNeedARegisteredRankAndReplacedOnesComeBackOnce) {
  RankRoster roster = Roster();
  EXPECT_EQ(roster.CheckAttach(9, "").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(roster.CheckAttach(0, "").code(), absl::StatusCode::kFailedPrecondition);
  roster = AllRegistered();
  // The key of the newest registration, and only it.
  EXPECT_EQ(roster.CheckAttach(0, "").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(roster.CheckAttach(0, roster.session_key(1)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(roster.CheckAttach(0, roster.session_key(0)).ok());
  const std::vector<std::string> keys = {roster.session_key(0), roster.session_key(1)};
  EXPECT_EQ(roster.CheckAttachHost(std::vector<int>{0, 1}, {keys[0]}, NamedSink("a")).code(),
            absl::StatusCode::kInvalidArgument)
      << "one key per rank";
  auto old_host = std::make_shared<NamedSink>("a");
  const int ranks[] = {0, 1};
  EXPECT_TRUE(roster.Attach(ranks, old_host).empty());
  EXPECT_EQ(roster.connected(), 2);
  auto other_host = std::make_shared<NamedSink>("b");
  EXPECT_EQ(roster.CheckAttachHost(ranks, keys, *other_host).code(),
            absl::StatusCode::kAlreadyExists);
  auto same_host = std::make_shared<NamedSink>("a");
  ASSERT_TRUE(roster.CheckAttachHost(ranks, keys, *same_host).ok());
  std::vector<std::shared_ptr<SessionSink>> replaced = roster.Attach(ranks, same_host);
  ASSERT_EQ(replaced.size(), 1u);
  EXPECT_EQ(replaced[0], old_host);
  roster.Detach(ranks, old_host.get());
  EXPECT_EQ(roster.connected(), 2) << "a replaced session detaches nothing";
  roster.Detach(ranks, same_host.get());
  EXPECT_EQ(roster.connected(), 0);
}

TEST(RankRosterTest, ParticipantsAreTheRanksOfActiveStages) {
  RankRoster roster = Roster();
  roster.Register(Reg(0, 0, 0));
  roster.Register(Reg(1, 1, 0));
  const std::vector<int> only_stage0 = {0};
  EXPECT_TRUE(roster.Participates(0, only_stage0));
  EXPECT_FALSE(roster.Participates(1, only_stage0));
  EXPECT_TRUE(roster.Participates(2, only_stage0)) << "not registered yet";
  EXPECT_EQ(roster.CountParticipants(only_stage0), 3);
  // Rank 0 has no session; replica 1 of stage 0 never registered.
  EXPECT_EQ(roster.MissingParticipants(only_stage0, true), (std::vector<int>{0, -1}));
  EXPECT_EQ(roster.MissingParticipants(only_stage0, false), (std::vector<int>{-1}));
  absl::Status connected = roster.CheckConnected(only_stage0);
  EXPECT_EQ(connected.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(connected.message().find("(0,-1;"), absl::string_view::npos) << connected;
}

TEST(RankRosterTest, AReportOfAReleasedStageKeepsItsMeasuredMemory) {
  RankRoster roster = AllRegistered();
  dynmo::v1::IterationReport report;
  report.set_iteration(7);
  report.set_stage_memory_used_bytes(500);
  report.set_stage_memory_capacity_bytes(2000);
  roster.RecordReport(0, report, /*active=*/true, /*model_changed=*/false);
  roster.RecordReport(1, report, /*active=*/false, /*model_changed=*/false);
  EXPECT_EQ(roster.at(0).memory_used_bytes, 500);
  EXPECT_EQ(roster.at(1).memory_used_bytes, 0);
  EXPECT_EQ(roster.at(1).memory_capacity_bytes, 2000);
  EXPECT_EQ(roster.at(1).last_iteration, 7);
  roster.RecordAck(1, 5);
  EXPECT_EQ(roster.at(1).last_iteration, 7) << "an older ack moves nothing back";
  roster.RecordAck(1, 9);
  EXPECT_EQ(roster.at(1).last_iteration, 9);
}

TEST(RankRosterTest, TheJobsNewestIterationAndModelChangesComeFromItsReports) {
  RankRoster roster = AllRegistered();
  EXPECT_EQ(roster.newest_iteration(), -1);
  dynmo::v1::IterationReport report;
  report.set_iteration(12);
  roster.RecordReport(0, report, true, /*model_changed=*/true);
  report.set_iteration(9);  // a late report moves the newest nothing back
  roster.RecordReport(1, report, true, /*model_changed=*/true);
  EXPECT_EQ(roster.newest_iteration(), 12);
  EXPECT_EQ(roster.reported_iteration(), 12);
  EXPECT_EQ(roster.model_changed_iteration(), 12);
  EXPECT_EQ(roster.model_changes(), 2);

  // A restarted coordinator shows the saved iteration until a report comes,
  // and does not measure the iteration window from it.
  RankRoster restored = AllRegistered();
  restored.RestoreProgress(40);
  EXPECT_EQ(restored.newest_iteration(), 40);
  EXPECT_EQ(restored.reported_iteration(), -1);
  report.set_iteration(3);
  restored.RecordReport(0, report, true, false);
  EXPECT_EQ(restored.newest_iteration(), 3) << "the first report replaces the saved one";
  EXPECT_EQ(restored.model_changes(), 0);

  // Resumed from a checkpoint: the next report's iteration is the newest,
  // even a lower one, and no model change is known any more.
  roster.OnResumed();
  EXPECT_EQ(roster.model_changed_iteration(), -1);
  EXPECT_EQ(roster.reported_iteration(), -1);
  report.set_iteration(5);
  roster.RecordReport(0, report, true, false);
  EXPECT_EQ(roster.newest_iteration(), 5);
  EXPECT_EQ(roster.model_changes(), 2) << "the count only grows";
}

TEST(RankRosterTest, OneSessionGetsOneEntryForAllItsParticipatingRanks) {
  RankRoster roster = AllRegistered();
  auto host = std::make_shared<NamedSink>("a");
  auto single = std::make_shared<NamedSink>();
  const int host_ranks[] = {0, 1, 3};
  const int single_rank[] = {2};
  roster.Attach(host_ranks, host);
  roster.Attach(single_rank, single);
  const std::vector<int> both = {0, 1};
  std::vector<SessionRanks> sessions = roster.ParticipantSessions(both);
  ASSERT_EQ(sessions.size(), 2u);
  EXPECT_EQ(sessions[0].sink, host);
  EXPECT_EQ(sessions[0].ranks, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(sessions[1].ranks, (std::vector<int>{2}));
  const std::vector<int> stage1 = {1};
  sessions = roster.ParticipantSessions(stage1);
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].ranks, (std::vector<int>{1, 3}));
}

TEST(RankRosterTest, StageMemoryIsTheSmallestCapAndTheLargestUse) {
  RankRoster roster = AllRegistered();
  roster.at(0).memory_used_bytes = 10;
  roster.at(2).memory_used_bytes = 30;
  roster.at(1).memory_capacity_bytes = 0;  // unknown
  roster.at(3).memory_capacity_bytes = 0;
  const std::vector<int> both = {0, 1};
  std::vector<core::StageMemoryReport> memory = roster.StageMemory(both);
  ASSERT_EQ(memory.size(), 2u);
  EXPECT_EQ(memory[0].capacity_bytes, 1000);  // min(1000, 1002)
  EXPECT_EQ(memory[0].used_bytes, 30);
  EXPECT_EQ(memory[1].capacity_bytes, -1);
}

TEST(RankRosterTest, ReleasedStagesListEveryReplicasGpu) {
  RankRoster roster = AllRegistered();
  dynmo::v1::Plan plan;
  plan.set_epoch(3);
  plan.set_reason("auto+repack");
  plan.add_released_stages(1);
  std::vector<dynmo::v1::ReleasedGpu> gpus =
      roster.ReleasedBy(plan, absl::FromUnixSeconds(100));
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].rank(), 1);
  EXPECT_EQ(gpus[1].rank(), 3);
  EXPECT_EQ(gpus[0].stage(), 1);
  EXPECT_EQ(gpus[0].epoch(), 3u);
  EXPECT_EQ(gpus[0].released_unix_ms(), 100000);
}

TEST(RankRosterTest, RecordRoundTripsTheRegisteredRanks) {
  RankRoster roster = Roster();
  roster.Register(Reg(3, 1, 1));
  dynmo::v1::JobRecord record;
  roster.ToRecord(&record);
  EXPECT_EQ(record.name(), "job");
  ASSERT_EQ(record.ranks_size(), 1);
  RankRoster restored = Roster();
  restored.Restore(record);
  EXPECT_TRUE(restored.at(3).registered);
  EXPECT_EQ(restored.at(3).data_parallel_rank, 1);
  EXPECT_EQ(restored.at(3).memory_capacity_bytes, 1003);
  EXPECT_FALSE(restored.at(0).registered);
}

}  // namespace
}  // namespace dynmo::service
