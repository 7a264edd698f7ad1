#include "coordinator/service/state_store.h"

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
    keeper.PutJob(job);
    dynmo::v1::ReleasedGpu g;
    g.set_id("gpu-9");
    keeper.PutPool({g}, 10);
    ASSERT_TRUE(keeper.Commit().ok());
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
  EXPECT_TRUE(keeper.Commit().ok());
}

}  // namespace
}  // namespace dynmo::service
