// LocalCoordinator: `dynmo-train --coordinator=embedded` without a launcher
// (torchrun, a test, a single node): rank 0 runs the dynmo-coordinator
// daemon — the binary beside dynmo-train, else the one on PATH — as its
// child on a loopback port the kernel picks, and every rank's agent talks to
// it like to any coordinator. The trainer links no coordinator code: the
// daemon is a separate process (its output goes to the rank's).
//
// Start() waits (up to 20 s) for the daemon's --port_file; the destructor
// stops it (SIGTERM, then waits). The child also dies with the process that
// started it (PR_SET_PDEATHSIG), so a crashed rank leaves no daemon behind.
// Not thread-safe; owned by rank 0's training thread.
#ifndef DYNMO_TRAINER_RUN_LOCAL_COORDINATOR_H_
#define DYNMO_TRAINER_RUN_LOCAL_COORDINATOR_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dynmo::trainer {

class LocalCoordinator {
 public:
  // `flags` go to dynmo-coordinator after --listen=127.0.0.1:0.
  static absl::StatusOr<std::unique_ptr<LocalCoordinator>> Start(
      const std::vector<std::string>& flags);
  ~LocalCoordinator();
  LocalCoordinator(const LocalCoordinator&) = delete;
  LocalCoordinator& operator=(const LocalCoordinator&) = delete;

  int port() const { return port_; }

 private:
  LocalCoordinator(pid_t pid, int port, std::string port_file)
      : pid_(pid), port_(port), port_file_(std::move(port_file)) {}
  pid_t pid_;
  int port_;
  std::string port_file_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_RUN_LOCAL_COORDINATOR_H_
