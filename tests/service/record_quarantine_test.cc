// Stored records are checked like requests (issue 43 item 3): a job record
// that fails its checksum, does not parse or holds values out of bounds
// quarantines its own job only — the coordinator starts, every other job is
// served, the bad job answers DATA_LOSS naming its file until an operator
// deletes it (the file is set aside) — and a rank may not adopt an epoch
// its job never issued.
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "coordinator/service/coordinator.h"
#include "coordinator/service/record_file.h"
#include "gtest/gtest.h"
#include "tests/service/job_state_fixture.h"
#include "tests/service/restarted_coordinator.h"

namespace dynmo::service {
namespace {

dynmo::v1::RegisterRequest RegJob(const std::string& job, int rank) {
  dynmo::v1::RegisterRequest r = Reg(rank);
  r.set_job(job);
  return r;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream b;
  b << in.rdbuf();
  return b.str();
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

class RecordQuarantineTest : public RestartedCoordinatorTest {
 protected:
  absl::Status Register(const std::string& job, int rank) {
    dynmo::v1::RegisterResponse response;
    return coordinator_->jobs().Register(RegJob(job, rank), &response).status();
  }
  std::string Path(const std::string& job) const { return dir_ + "/jobs/" + job + ".pb"; }
};

TEST_F(RecordQuarantineTest, AHugeShapeInOneRecordQuarantinesThatJobOnly) {
  Start();
  ASSERT_TRUE(Register("good", 0).ok());
  ASSERT_TRUE(Register("bad", 0).ok());
  coordinator_.reset();
  // A record that parses, with a shape that would allocate without bound.
  dynmo::v1::JobRecord huge;
  huge.set_name("bad");
  huge.set_pipeline_size(1 << 30);
  huge.set_data_parallel_size(1);
  huge.set_num_layers(1 << 30);
  Spit(Path("bad"), FramedRecord(huge.SerializeAsString()));

  Coordinator& c = Start();
  EXPECT_TRUE(c.jobs().Find("good").ok()) << "every other job is served";
  EXPECT_TRUE(Register("good", 1).ok());
  const absl::Status bad = c.jobs().Find("bad").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  EXPECT_NE(bad.message().find(Path("bad")), std::string::npos) << bad;
  EXPECT_EQ(Register("bad", 1).code(), absl::StatusCode::kDataLoss) << "its ranks are refused";
  EXPECT_EQ(c.jobs().quarantined(), 1);

  // Deleting it sets the file aside and frees the name.
  ASSERT_TRUE(c.jobs().Delete("bad", /*force=*/false).ok());
  EXPECT_FALSE(std::filesystem::exists(Path("bad")));
  EXPECT_TRUE(std::filesystem::exists(Path("bad") + ".quarantined"));
  EXPECT_EQ(c.jobs().quarantined(), 0);
  EXPECT_TRUE(Register("bad", 0).ok());
  EXPECT_TRUE(Start().jobs().Find("bad").ok()) << "its new record is good";
}

TEST_F(RecordQuarantineTest, AnUnparseableOrNegativeShapedRecordNeverStopsTheCoordinator) {
  Start();
  ASSERT_TRUE(Register("good", 0).ok());
  coordinator_.reset();
  Spit(Path("garbage"), "\xff\xff\xff not a record");
  dynmo::v1::JobRecord negative;
  negative.set_name("negative");
  negative.set_pipeline_size(-3);
  Spit(Path("negative"), negative.SerializeAsString());  // an older, unframed file

  Coordinator& c = Start();
  EXPECT_TRUE(c.jobs().Find("good").ok());
  EXPECT_EQ(c.jobs().Find("garbage").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(c.jobs().Find("negative").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(c.jobs().quarantined(), 2);
}

TEST_F(RecordQuarantineTest, EveryByteFlipIsQuarantinedOrReadsBackTheSameRecord) {
  Start();
  ASSERT_TRUE(Register("flip", 0).ok());
  ASSERT_TRUE(Register("flip", 1).ok());
  ASSERT_TRUE(Register("other", 0).ok());
  const dynmo::v1::JobRecord original = (*coordinator_->jobs().Find("flip"))->Record();
  coordinator_.reset();
  const std::string bytes = Slurp(Path("flip"));
  ASSERT_GT(bytes.size(), 20u);
  int quarantined = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
    Spit(Path("flip"), flipped);
    Coordinator& c = Start();
    ASSERT_TRUE(c.jobs().Find("other").ok()) << "byte " << i;
    absl::StatusOr<std::shared_ptr<JobState>> job = c.jobs().Find("flip");
    if (!job.ok()) {
      EXPECT_EQ(job.status().code(), absl::StatusCode::kDataLoss) << "byte " << i;
      ++quarantined;
      continue;
    }
    // Never a changed shape or layout: only the same record may load.
    const dynmo::v1::JobRecord back = (*job)->Record();
    EXPECT_EQ(back.pipeline_size(), original.pipeline_size()) << "byte " << i;
    EXPECT_EQ(back.num_layers(), original.num_layers()) << "byte " << i;
    EXPECT_EQ(back.epoch(), original.epoch()) << "byte " << i;
    EXPECT_EQ(back.boundaries().size(), original.boundaries().size()) << "byte " << i;
    for (int b = 0; b < back.boundaries_size() && b < original.boundaries_size(); ++b) {
      EXPECT_EQ(back.boundaries(b), original.boundaries(b)) << "byte " << i;
    }
    EXPECT_EQ(back.ranks_size(), original.ranks_size()) << "byte " << i;
  }
  // The checksum covers the record: all but a flip that leaves the payload
  // alone (in the trailer's magic) are caught.
  EXPECT_GE(quarantined, static_cast<int>(bytes.size()) - 8);
}

TEST_F(RecordQuarantineTest, ARankMayNotAdoptAnEpochItsJobNeverIssued) {
  Start();
  ASSERT_TRUE(Register("job", 0).ok());
  ASSERT_TRUE(Register("job", 1).ok());
  std::shared_ptr<JobState> job = *coordinator_->jobs().Find("job");
  const dynmo::v1::JobRecord before = job->Record();
  dynmo::v1::RegisterRequest forged = RegJob("job", 1);
  forged.set_applied_epoch(500000);
  forged.clear_boundaries();
  for (int b : {0, 1, 2, 3, kLayers}) forged.add_boundaries(b);
  dynmo::v1::RegisterResponse response;
  const absl::Status s = coordinator_->jobs().Register(forged, &response).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("never issued"), std::string::npos) << s;
  EXPECT_EQ(job->Record().epoch(), before.epoch());
  EXPECT_EQ(job->Record().boundaries().size(), before.boundaries().size());
  for (int b = 0; b < before.boundaries_size(); ++b) {
    EXPECT_EQ(job->Record().boundaries(b), before.boundaries(b));
  }
}

TEST_F(RecordQuarantineTest, TheFirstRankOfAJobThatNeverPlannedMayBringItsEpoch) {
  // A coordinator whose state dir was lost: the ranks are right.
  Start();
  dynmo::v1::RegisterRequest back = RegJob("lost", 0);
  back.set_applied_epoch(7);
  dynmo::v1::RegisterResponse response;
  ASSERT_TRUE(coordinator_->jobs().Register(back, &response).ok());
  EXPECT_EQ((*coordinator_->jobs().Find("lost"))->Record().applied_epoch(), 7u);
}

}  // namespace
}  // namespace dynmo::service
