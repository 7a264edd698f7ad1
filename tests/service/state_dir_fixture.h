// StateDirTest: a fixture with a fresh state dir under /tmp, its opened
// StateKeeper and the ReleasedPool over it, removed after the test. The
// base of the service tests that persist (job_state_fixture.h,
// released_pool_test.cc, job_state_reshape_test.cc).
#ifndef DYNMO_TESTS_SERVICE_STATE_DIR_FIXTURE_H_
#define DYNMO_TESTS_SERVICE_STATE_DIR_FIXTURE_H_

#include <filesystem>
#include <memory>
#include <string>

#include "coordinator/service/released_pool.h"
#include "coordinator/service/state_store.h"
#include "gtest/gtest.h"
#include "tests/service/temp_dir.h"

namespace dynmo::service {

class StateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    keeper_ = std::make_unique<StateKeeper>(dir_);
    ASSERT_TRUE(keeper_->Open().ok());
    pool_ = std::make_unique<ReleasedPool>(keeper_.get());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::unique_ptr<StateKeeper> keeper_;
  std::unique_ptr<ReleasedPool> pool_;
};

}  // namespace dynmo::service

#endif  // DYNMO_TESTS_SERVICE_STATE_DIR_FIXTURE_H_
