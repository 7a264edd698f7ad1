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
  EXPECT_TRUE(std::filesystem::exists(dir + "/jobs/j.pb"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/pool.pb"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/jobs/j.pb.tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/pool.pb.tmp"));
}

TEST(StateStoreTest, GarbageSnapshotIsDataLoss) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/state.pb") << "\xff\xff\xff not a proto";
  StateStore store(dir);
  EXPECT_EQ(store.Load().status().code(), absl::StatusCode::kDataLoss);
}

TEST(StateStoreTest, AGarbageOrMisnamedJobFileIsLeftOutAsDataLossNamingIt) {
  const std::string dir = TempDir();
  StateStore store(dir);
  ASSERT_TRUE(store.Open().ok());
  dynmo::v1::JobRecord job;
  job.set_name("a");
  ASSERT_TRUE(store.SaveJob(job).ok());
  std::filesystem::copy_file(dir + "/jobs/a.pb", dir + "/jobs/b.pb");
  std::ofstream(dir + "/jobs/c.pb") << "\xff\xff\xff not a proto";
  // One job's bad file never stops the others (issue 43): it is left out.
  absl::StatusOr<std::optional<dynmo::v1::CoordinatorState>> loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ((*loaded)->jobs_size(), 1);
  EXPECT_EQ((*loaded)->jobs(0).name(), "a");
  ASSERT_EQ(store.bad_records().size(), 2u);
  for (const StateStore::BadRecord& bad : store.bad_records()) {
    EXPECT_EQ(bad.why.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(bad.why.message().find("jobs/" + bad.job + ".pb"), std::string::npos) << bad.why;
  }
}

TEST(StateStoreTest, ARecordChangedOnDiskFailsItsChecksum) {
  const std::string dir = TempDir();
  StateStore store(dir);
  ASSERT_TRUE(store.Open().ok());
  dynmo::v1::JobRecord job;
  job.set_name("a");
  job.set_pipeline_size(4);
  ASSERT_TRUE(store.SaveJob(job).ok());
  std::fstream f(dir + "/jobs/a.pb", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(3);
  f.put('\x07');
  f.close();
  ASSERT_TRUE(store.Load().ok());
  ASSERT_EQ(store.bad_records().size(), 1u);
  EXPECT_NE(store.bad_records()[0].why.message().find("checksum"), std::string::npos)
      << store.bad_records()[0].why;
}

TEST(StateStoreTest, ADirectorySwappedUnderTheStoreIsNeverWrittenInto) {
  const std::string dir = TempDir();
  StateStore store(dir);
  ASSERT_TRUE(store.Open().ok());
  dynmo::v1::JobRecord job;
  job.set_name("a");
  ASSERT_TRUE(store.SaveJob(job).ok());
  std::filesystem::rename(dir, dir + ".old");
  std::filesystem::create_directory(dir);
  const absl::Status s = store.SaveJob(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("replaced"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(dir + "/jobs")) << "nothing written into the new one";
  std::filesystem::remove_all(dir + ".old");
}

TEST(StateStoreTest, ANameThatIsNoJobNameNeverReachesThePath) {
  StateStore store(TempDir());
  ASSERT_TRUE(store.Open().ok());
  dynmo::v1::JobRecord job;
  job.set_name("../escape");
  EXPECT_EQ(store.SaveJob(job).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.RemoveJob("a/b").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.RemoveJob("").code(), absl::StatusCode::kInvalidArgument);
}

TEST(StateStoreTest, TempFilesACrashLeftAreNoRecords) {
  const std::string dir = TempDir();
  StateStore store(dir);
  ASSERT_TRUE(store.Open().ok());
  dynmo::v1::JobRecord job;
  job.set_name("a");
  ASSERT_TRUE(store.SaveJob(job).ok());
  std::ofstream(dir + "/jobs/b.pb.tmp") << "half a record";
  auto loaded = store.Load();
  ASSERT_TRUE(loaded.ok() && loaded->has_value()) << loaded.status();
  ASSERT_EQ((*loaded)->jobs_size(), 1);
  EXPECT_EQ((*loaded)->jobs(0).name(), "a");
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
    ASSERT_EQ(mkdir((dir + "/jobs/a.pb.tmp").c_str(), 0755), 0);
    job.set_epoch(2);
    const absl::Status refused = keeper.CommitJob(job);
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(refused.message().find("state not persisted"), std::string::npos)
        << refused.message();
    EXPECT_EQ(keeper.failures(), 1u);
    ASSERT_EQ(failures.size(), 1u);
    ASSERT_EQ(rmdir((dir + "/jobs/a.pb.tmp").c_str()), 0);
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
  ASSERT_EQ(mkdir((dir + "/pool.pb").c_str(), 0755), 0);
  std::ofstream(dir + "/pool.pb/x") << "x";
  EXPECT_FALSE(store.Save(dynmo::v1::CoordinatorState{}).ok());
  EXPECT_NE(access((dir + "/pool.pb.tmp").c_str(), F_OK), 0)
      << "a temp file was left behind";
  dynmo::v1::JobRecord job;
  job.set_name("a");
  ASSERT_EQ(mkdir((dir + "/jobs/a.pb").c_str(), 0755), 0);
  std::ofstream(dir + "/jobs/a.pb/x") << "x";
  EXPECT_FALSE(store.SaveJob(job).ok());
  EXPECT_NE(access((dir + "/jobs/a.pb.tmp").c_str(), F_OK), 0)
      << "a temp file was left behind";
}

// The point of one file per record: a job's commit rewrites that job's file
// and nothing else (each rewrite is a new file renamed into place: a new
// inode), where the old single snapshot rewrote every job on every commit.
TEST(StateKeeperTest, ACommitWritesItsOwnRecordAndNoOther) {
  const std::string dir = TempDir();
  StateKeeper keeper(dir);
  ASSERT_TRUE(keeper.Open().ok());
  dynmo::v1::JobRecord a, b;
  a.set_name("a");
  b.set_name("b");
  ASSERT_TRUE(keeper.CommitJob(a).ok());
  ASSERT_TRUE(keeper.CommitJob(b).ok());
  ASSERT_TRUE(keeper.CommitPool({}, 1).ok());
  auto inode = [&](const std::string& f) {
    struct stat st{};
    EXPECT_EQ(stat((dir + "/" + f).c_str(), &st), 0) << f;
    return st.st_ino;
  };
  const auto b_before = inode("jobs/b.pb"), pool_before = inode("pool.pb");
  const auto a_before = inode("jobs/a.pb");
  a.set_epoch(5);
  ASSERT_TRUE(keeper.CommitJob(a).ok());
  EXPECT_NE(inode("jobs/a.pb"), a_before) << "a's commit did not write a's file";
  EXPECT_EQ(inode("jobs/b.pb"), b_before);
  EXPECT_EQ(inode("pool.pb"), pool_before);
  ASSERT_TRUE(keeper.RemoveJob("b").ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/jobs/b.pb"));
}

TEST(StateKeeperTest, AnOldSnapshotBecomesRecordFilesAtOpen) {
  const std::string dir = TempDir();
  {
    dynmo::v1::CoordinatorState old;
    old.set_generation(9);
    old.set_next_gpu_id(4);
    old.add_jobs()->set_name("a");
    old.mutable_jobs(0)->set_epoch(7);
    old.mutable_jobs(0)->set_owner("alice");
    old.add_jobs()->set_name("b");
    old.add_pool()->set_id("gpu-3");
    std::string data;
    ASSERT_TRUE(old.SerializeToString(&data));
    std::ofstream(dir + "/state.pb", std::ios::binary) << data;
    // A file of a job the snapshot lacks (a migration a crash cut short,
    // the job deleted meanwhile): the snapshot rules.
    ASSERT_EQ(mkdir((dir + "/jobs").c_str(), 0755), 0);
    dynmo::v1::JobRecord gone;
    gone.set_name("gone");
    ASSERT_TRUE(gone.SerializeToString(&data));
    std::ofstream(dir + "/jobs/gone.pb", std::ios::binary) << data;
  }
  {
    StateKeeper keeper(dir);
    auto state = keeper.Open();
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_FALSE(keeper.read_only());
    ASSERT_EQ(state->jobs_size(), 2);
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/state.pb"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/jobs/gone.pb"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/jobs/a.pb"));
  StateKeeper again(dir);
  auto state = again.Open();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs_size(), 2);
  EXPECT_EQ(state->jobs(0).name(), "a");
  EXPECT_EQ(state->jobs(0).epoch(), 7u);
  EXPECT_EQ(state->jobs(0).owner(), "alice");
  EXPECT_EQ(state->jobs(1).name(), "b");
  EXPECT_EQ(state->next_gpu_id(), 4u);
  ASSERT_EQ(state->pool_size(), 1);
  EXPECT_EQ(state->pool(0).id(), "gpu-3");
}

// An old snapshot that cannot be migrated (here: the pool file cannot be
// written) opens read-only with the snapshot's state; the first write that
// works migrates it, and nothing committed meanwhile is lost or resurrected.
TEST(StateKeeperTest, AnOldSnapshotThatCannotBeMigratedIsMigratedByTheFirstGoodWrite) {
  const std::string dir = TempDir();
  dynmo::v1::CoordinatorState old;
  old.add_jobs()->set_name("a");
  old.mutable_jobs(0)->set_epoch(1);
  std::string data;
  ASSERT_TRUE(old.SerializeToString(&data));
  std::ofstream(dir + "/state.pb", std::ios::binary) << data;
  ASSERT_EQ(mkdir((dir + "/pool.pb.tmp").c_str(), 0755), 0);
  std::vector<bool> modes;
  {
    StateKeeper keeper(dir);
    keeper.SetModeHook([&](bool writable, const absl::Status&) { modes.push_back(writable); });
    auto state = keeper.Open();
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_TRUE(keeper.read_only());
    EXPECT_EQ(state->jobs(0).epoch(), 1u);
    dynmo::v1::JobRecord a = state->jobs(0);
    a.set_epoch(2);
    EXPECT_EQ(keeper.CommitJob(a).code(), absl::StatusCode::kUnavailable);
    ASSERT_EQ(rmdir((dir + "/pool.pb.tmp").c_str()), 0);
    EXPECT_TRUE(keeper.Probe().ok());
    EXPECT_FALSE(keeper.read_only());
    a.set_epoch(3);
    EXPECT_TRUE(keeper.CommitJob(a).ok());
  }
  EXPECT_EQ(modes, (std::vector<bool>{false, true}));
  EXPECT_FALSE(std::filesystem::exists(dir + "/state.pb"));
  StateKeeper again(dir);
  auto state = again.Open();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->jobs_size(), 1);
  EXPECT_EQ(state->jobs(0).epoch(), 3u);
}

}  // namespace
}  // namespace dynmo::service
