// Tests of SpawnRank (launcher/rank_process.h) run in this process: a rank
// registers its own process group with the orphan guard's pipe before its
// program runs, so no kill -9 of the launcher can fall between a rank
// starting a child and the guard knowing the rank's group.
#include "launcher/rank_process.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dynmo::launcher {
namespace {

std::vector<std::string> Env() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

void Reap(pid_t pid) {
  int status;
  waitpid(pid, &status, 0);
}

TEST(SpawnRankTest, TheRanksGroupIsOnTheGuardPipeOnceSpawnRankReturns) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK), 0);
  // The program would start a child at once; SpawnRank returns only after
  // the exec, and the registration comes before the exec.
  absl::StatusOr<RankProcess> p =
      SpawnRank(0, {"sh", "-c", "exit 0"}, Env(), pipe_fds[1]);
  ASSERT_TRUE(p.ok()) << p.status();
  int32_t group = 0;
  EXPECT_EQ(read(pipe_fds[0], &group, sizeof(group)),
            static_cast<ssize_t>(sizeof(group)))
      << "the rank started without registering its group";
  EXPECT_EQ(group, p->pid) << "a rank's process group is its pid";
  int32_t more;
  EXPECT_LT(read(pipe_fds[0], &more, sizeof(more)), 0) << "registered twice";
  Reap(p->pid);
  close(p->stdout_fd);
  close(p->stderr_fd);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(SpawnRankTest, WithoutAGuardNothingIsWrittenAnywhere) {
  absl::StatusOr<RankProcess> p = SpawnRank(0, {"true"}, Env());
  ASSERT_TRUE(p.ok()) << p.status();
  Reap(p->pid);
  close(p->stdout_fd);
  close(p->stderr_fd);
}

TEST(SpawnRankTest, AnUnexecutableProgramRegistersNothingThatOutlivesIt) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK), 0);
  absl::StatusOr<RankProcess> p =
      SpawnRank(0, {"/no/such/prog"}, Env(), pipe_fds[1]);
  EXPECT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("/no/such/prog"),
            std::string::npos)
      << p.status();
  // The child registered its group and then failed to exec; SpawnRank has
  // reaped it, so a guard killing that group later kills nothing.
  int32_t group = 0;
  ASSERT_EQ(read(pipe_fds[0], &group, sizeof(group)),
            static_cast<ssize_t>(sizeof(group)));
  EXPECT_NE(kill(-group, 0), 0) << "the failed rank's group is still alive";
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

}  // namespace
}  // namespace dynmo::launcher
