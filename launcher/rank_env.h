// RankEnvironment: the environment one rank of a single-node job sees:
// the launcher's own environment with torchrun's variables (RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and
// DynMo's (DYNMO_JOB, DYNMO_COORDINATOR) set, replacing any inherited
// values. With no coordinator, DYNMO_COORDINATOR is removed rather than
// inherited, so a rank never dials a coordinator the user did not ask for.
// Pure functions, thread-safe.
#ifndef DYNMO_LAUNCHER_RANK_ENV_H_
#define DYNMO_LAUNCHER_RANK_ENV_H_

#include <string>
#include <vector>

namespace dynmo::launcher {

struct JobEnvironment {
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string job;
  std::string coordinator;  // empty: no coordinator
};

// Returns `base` ("KEY=VALUE" entries, as in environ) with the job's
// variables for `rank` set.
std::vector<std::string> RankEnvironment(const std::vector<std::string>& base,
                                         const JobEnvironment& job, int rank);

// Returns the process's own environment as "KEY=VALUE" entries.
std::vector<std::string> CurrentEnvironment();

}  // namespace dynmo::launcher

#endif  // DYNMO_LAUNCHER_RANK_ENV_H_
