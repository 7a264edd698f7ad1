// DistEnv: this process's place in the job, read from torchrun's environment
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), the same
// variables Slurm wrappers and Kubernetes operators set, so one binary runs
// under any of them. With none of them set, the process is a world of one.
#ifndef DYNMO_TRAINER_COMM_DIST_ENV_H_
#define DYNMO_TRAINER_COMM_DIST_ENV_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace dynmo::trainer {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// Looks a variable up; returns nullopt when unset. Injectable for tests.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// The process environment (getenv).
EnvLookup ProcessEnv();

// Reads DistEnv. Errors: malformed numbers, rank outside [0, WORLD_SIZE),
// WORLD_SIZE > 1 without MASTER_PORT, port outside [1, 65535].
absl::StatusOr<DistEnv> ReadDistEnv(const EnvLookup& env);

// The ranks on this host: LOCAL_WORLD_SIZE, else WORLD_SIZE, else 1 (a
// value that is not a positive number counts as unset). What a rank's share
// of the host's memory, or of a device, is divided by.
int LocalRanks(const EnvLookup& env);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_COMM_DIST_ENV_H_
