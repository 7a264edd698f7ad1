// The operator's bounds on a job's shape (JobLimits: --max_ranks_per_job,
// --max_layers) apply with or without principals, and what the largest
// allowed jobs cost in memory stays within what docs/operations.md states
// (issue 25 item 2).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/service/coordinator.h"
#include "gtest/gtest.h"
#include "tests/service/job_state_fixture.h"

namespace dynmo::service {
namespace {

dynmo::v1::RegisterRequest Shaped(const std::string& job, int pp, int dp, int layers) {
  dynmo::v1::RegisterRequest r = Reg(0);
  r.set_job(job);
  r.set_pipeline_size(pp);
  r.set_data_parallel_size(dp);
  r.set_num_layers(layers);
  return r;
}

// Resident set size of this process, bytes (/proc/self/statm).
int64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (f == nullptr) return 0;
  const int n = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * sysconf(_SC_PAGESIZE) : 0;
}

class JobLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = TempDir(); }
  void TearDown() override {
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }
  Coordinator& Start(CoordinatorOptions options = {}) {
    options.state_dir = dir_;
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(options);
    EXPECT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
    return *coordinator_;
  }
  absl::Status Register(const dynmo::v1::RegisterRequest& r, const std::string& caller = "") {
    dynmo::v1::RegisterResponse response;
    return coordinator_->jobs().Register(r, &response, caller).status();
  }

  std::string dir_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(JobLimitsTest, AHugeShapeIsRefusedWithoutPrincipalsInOneLine) {
  Start();
  const absl::Status s = Register(Shaped("huge", 65536, 1, 65536));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("--max_ranks_per_job"), std::string::npos) << s;
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
  EXPECT_TRUE(coordinator_->jobs().All().empty());
  const absl::Status layers = Register(Shaped("deep", 4, 1, 8192));
  EXPECT_EQ(layers.code(), absl::StatusCode::kResourceExhausted) << layers;
  EXPECT_NE(layers.message().find("--max_layers"), std::string::npos) << layers;
}

TEST_F(JobLimitsTest, TheOperatorsBoundsAreTheOnesApplied) {
  CoordinatorOptions options;
  options.max_ranks_per_job = 8;
  options.max_layers = 16;
  Start(options);
  EXPECT_TRUE(Register(Shaped("fits", 4, 2, 16)).ok());
  EXPECT_EQ(Register(Shaped("wide", 4, 4, 16)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Register(Shaped("long", 4, 2, 17)).code(), absl::StatusCode::kResourceExhausted);
  options.max_layers = 16;
  // RegisterHost is held to the same bounds.
  dynmo::v1::RegisterHostRequest host;
  *host.add_ranks() = Shaped("host", 4, 4, 16);
  dynmo::v1::RegisterHostResponse response;
  EXPECT_EQ(coordinator_->jobs().RegisterHost(host, &response).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// 64 registrations (the default --max_jobs_per_principal) of the largest
// jobs the defaults allow, at each corner of the bounds: the coordinator's
// memory grows by tens of MB, not GB. One corner per test, so that ctest
// measures each in a fresh process; the bound is docs/operations.md's
// ("Bounds per job") and the figures are printed.
class SixtyFourLargestJobsTest : public JobLimitsTest {
 protected:
  void RegisterSixtyFour(int pp, int dp, int layers) {
    Start();
    const int64_t before = ResidentBytes();
    for (int i = 0; i < 64; ++i) {
      ASSERT_TRUE(Register(Shaped(absl::StrCat("big", i), pp, dp, layers), "alice").ok());
    }
    const double grown_mb = (ResidentBytes() - before) / 1e6;
    uintmax_t state_bytes = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) {
      if (e.is_regular_file()) state_bytes += e.file_size();
    }
    std::printf("64 jobs of %d x %d x %d: +%.1f MB resident, state files %.2f MB\n", pp, dp,
                layers, grown_mb, state_bytes / 1e6);
    EXPECT_LT(grown_mb, 100);
  }
  const JobLimits limits_;
  const int replica_layers_ = static_cast<int>(limits_.max_replica_layers);
};

TEST_F(SixtyFourLargestJobsTest, MostStagesAndLayersStayWithinTheDocumentedMemory) {
  RegisterSixtyFour(limits_.max_layers, limits_.max_ranks_per_job / limits_.max_layers,
                    limits_.max_layers);
}

TEST_F(SixtyFourLargestJobsTest, MostReplicaLayersStayWithinTheDocumentedMemory) {
  const int dp = replica_layers_ / limits_.max_layers;
  RegisterSixtyFour(limits_.max_ranks_per_job / dp, dp, limits_.max_layers);
}

TEST_F(SixtyFourLargestJobsTest, MostReplicasStayWithinTheDocumentedMemory) {
  RegisterSixtyFour(1, limits_.max_ranks_per_job, replica_layers_ / limits_.max_ranks_per_job);
}

}  // namespace
}  // namespace dynmo::service
