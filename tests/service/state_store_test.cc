#include "coordinator/service/state_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

// Temp dirs of this test binary, removed when it exits.
struct TempDirs {
  std::vector<std::string> dirs;
  ~TempDirs() {
    for (const auto& d : dirs) std::filesystem::remove_all(d);
  }
};
TempDirs temp_dirs;

std::string TempDir() {
  char tmpl[] = "/tmp/dynmo_state_XXXXXX";
  temp_dirs.dirs.push_back(mkdtemp(tmpl));
  return temp_dirs.dirs.back();
}

TEST(StateStoreTest, MissingSnapshotLoadsAsNothing) {
  StateStore store(TempDir());
  ASSERT_TRUE(store.Open().ok());
  auto loaded = store.Load();
  ASSERT_TRUE(loaded.ok());
  EXPECT_FALSE(loaded->has_value());
}

TEST(StateStoreTest, SaveThenLoadRoundTripsAndLeavesNoTempFile) {
  const std::string dir = TempDir();
  StateStore store(dir);
  ASSERT_TRUE(store.Open().ok());
  dynmo::v1::CoordinatorState s;
  s.set_generation(7);
  s.add_jobs()->set_name("j");
  s.mutable_jobs(0)->set_epoch(42);
  s.add_pool()->set_id("gpu-1");
  ASSERT_TRUE(store.Save(s).ok());
  auto loaded = store.Load();
  ASSERT_TRUE(loaded.ok() && loaded->has_value());
  EXPECT_EQ((*loaded)->jobs(0).epoch(), 42u);
  EXPECT_EQ((*loaded)->pool(0).id(), "gpu-1");
  EXPECT_FALSE(std::filesystem::exists(dir + "/state.pb.tmp"));
}

TEST(StateStoreTest, GarbageSnapshotIsDataLoss) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/state.pb") << "\xff\xff\xff not a proto";
  StateStore store(dir);
  EXPECT_EQ(store.Load().status().code(), absl::StatusCode::kDataLoss);
}

TEST(StateStoreTest, DirectoryThatIsAFileIsRefused) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/file") << "x";
  StateStore store(dir + "/file");
  EXPECT_FALSE(store.Open().ok());
}

TEST(StateKeeperTest, CommitsSurviveAReopen) {
  const std::string dir = TempDir();
  {
    StateKeeper keeper(dir);
    ASSERT_TRUE(keeper.Open().ok());
    dynmo::v1::JobRecord job;
    job.set_name("a");
    job.set_epoch(3);
    ASSERT_TRUE(keeper.CommitJob(job).ok());
    dynmo::v1::ReleasedGpu g;
    g.set_id("gpu-9");
    ASSERT_TRUE(keeper.CommitPool({g}, 10).ok());
  }
  StateKeeper again(dir);
  auto state = again.Open();
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(state->jobs_size(), 1);
  EXPECT_EQ(state->jobs(0).epoch(), 3u);
  EXPECT_EQ(state->next_gpu_id(), 10u);
  EXPECT_EQ(state->pool(0).id(), "gpu-9");
}

TEST(StateKeeperTest, EmptyDirMeansInMemory) {
  StateKeeper keeper("");
  ASSERT_TRUE(keeper.Open().ok());
  EXPECT_FALSE(keeper.durable());
  EXPECT_TRUE(keeper.CommitJob(dynmo::v1::JobRecord{}).ok());
  EXPECT_EQ(keeper.commits(), 1u);
}

TEST(StateKeeperTest, ARefusedCommitIsNeverWrittenByALaterOne) {
  const std::string dir = TempDir();
  std::vector<std::string> failures;
  {
    StateKeeper keeper(dir);
    keeper.SetFailureHook(
        [&](const absl::Status& s) { failures.push_back(std::string(s.message())); });
    ASSERT_TRUE(keeper.Open().ok());
    dynmo::v1::JobRecord job;
    job.set_name("a");
    job.set_epoch(1);
    ASSERT_TRUE(keeper.CommitJob(job).ok());
    // The temp file cannot be created (a directory is in its place).
    ASSERT_EQ(mkdir((dir + "/state.pb.tmp").c_str(), 0755), 0);
    job.set_epoch(2);
    const absl::Status refused = keeper.CommitJob(job);
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(refused.message().find("state not persisted"), std::string::npos)
        << refused.message();
    EXPECT_EQ(keeper.failures(), 1u);
    ASSERT_EQ(failures.size(), 1u);
    ASSERT_EQ(rmdir((dir + "/state.pb.tmp").c_str()), 0);
    // A later commit of something else succeeds without the refused epoch.
    dynmo::v1::ReleasedGpu g;
    g.set_id("gpu-1");
    ASSERT_TRUE(keeper.CommitPool({g}, 2).ok());
  }
  StateKeeper again(dir);
  auto state = again.Open();
  ASSERT_TRUE(state.ok());
  ASSERT_EQ(state->jobs_size(), 1);
  EXPECT_EQ(state->jobs(0).epoch(), 1u) << "the refused epoch 2 came back";
  EXPECT_EQ(state->pool_size(), 1);
}

TEST(StateStoreTest, AFailedSaveLeavesNoTempFile) {
  const std::string dir = TempDir();
  StateStore store(dir);
  ASSERT_TRUE(store.Open().ok());
  // The rename cannot replace a non-empty directory.
  ASSERT_EQ(mkdir((dir + "/state.pb").c_str(), 0755), 0);
  std::ofstream(dir + "/state.pb/x") << "x";
  EXPECT_FALSE(store.Save(dynmo::v1::CoordinatorState{}).ok());
  EXPECT_NE(access((dir + "/state.pb.tmp").c_str(), F_OK), 0)
      << "a temp file was left behind";
}

}  // namespace
}  // namespace dynmo::service
