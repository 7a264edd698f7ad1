// RestartedCoordinatorTest: a fixture of one in-process Coordinator over a
// state dir that a test restarts (Start destroys the running one first, as
// a kill and a restart would), for the tests of what survives a restart.
// Test-only; not thread-safe.
#ifndef DYNMO_TESTS_SERVICE_RESTARTED_COORDINATOR_H_
#define DYNMO_TESTS_SERVICE_RESTARTED_COORDINATOR_H_

#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "coordinator/service/coordinator.h"
#include "gtest/gtest.h"
#include "tests/service/temp_dir.h"

namespace dynmo::service {

class RestartedCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = TempDir(); }
  void TearDown() override {
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }
  // A coordinator over the state dir; the previous one is gone first.
  Coordinator& Start() {
    coordinator_.reset();
    CoordinatorOptions options;
    options.state_dir = dir_;
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(options);
    EXPECT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
    return *coordinator_;
  }

  std::string dir_;
  std::unique_ptr<Coordinator> coordinator_;
};

}  // namespace dynmo::service

#endif  // DYNMO_TESTS_SERVICE_RESTARTED_COORDINATOR_H_
